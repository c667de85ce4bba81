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
    "TransientError",
]


class TransientError(MmsyncError):
    """Retry with bounded backoff; when retries run out, dead-letter as ``retries_exhausted``."""

    retriable = True


class BrokerStartError(MmsyncError):
    """The embedded broker could not be located or did not start answering."""


class ConfigError(MmsyncError):
    """A setting is invalid or settings contradict each other."""
