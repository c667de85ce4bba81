"""One exception root; behaviour lives on the class (as aiokafka's errors do)."""

from __future__ import annotations

__all__ = [
    "BrokerStartError",
    "ConfigError",
    "InvalidInputError",
    "MmsyncError",
    "TransientError",
]


class MmsyncError(Exception):
    """Root of every error mmsync raises on purpose."""

    #: Whether retrying the same operation may succeed.
    retriable: bool = False


class InvalidInputError(MmsyncError):
    """Permanent: the record can never be processed; it goes to the dead-letter topic.

    ``reason`` is the short machine-readable code of the contract
    (``bad_msgpack``, ``schema``, ``too_large``, ``bad_image``, ``bad_audio``,
    ``key_mismatch``, ``bad_version``); ``detail`` is for people.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class TransientError(MmsyncError):
    """Retry with bounded backoff; when retries run out, dead-letter as ``retries_exhausted``."""

    retriable = True


class BrokerStartError(MmsyncError):
    """The embedded broker could not be located or did not start answering."""


class ConfigError(MmsyncError):
    """A setting is invalid or settings contradict each other."""
