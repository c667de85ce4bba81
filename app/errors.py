"""One exception root; behaviour lives on the class (as aiokafka's errors do).

The root and ``InvalidInputError`` are defined in ``schemas.errors`` (the wire
format imports nothing of the app) and re-exported here.
"""

from __future__ import annotations

from schemas.errors import InvalidInputError, MmsyncError

__all__ = [
    "BrokerStartError",
    "ConfigError",
    "InvalidInputError",
    "MmsyncError",
    "TopicConfigError",
    "TransientError",
]


class TransientError(MmsyncError):
    """Retry with bounded backoff; when retries run out, dead-letter as ``retries_exhausted``."""

    retriable = True


class BrokerStartError(MmsyncError):
    """The embedded broker could not be located or did not start answering."""


class ConfigError(MmsyncError):
    """A setting is invalid or settings contradict each other."""


class TopicConfigError(ConfigError):
    """A topic is not as the settings need it (another partition count, missing where
    mmsync may not create it, not ready in time): found at start, before anything is
    consumed; the process exits with the message, one line naming the topic."""

    def __init__(self, message: str, *, topic: str, partitions: int | None = None) -> None:
        super().__init__(message)
        self.topic = topic
        #: the partition count the topic has, where that is the fault
        self.partitions = partitions
