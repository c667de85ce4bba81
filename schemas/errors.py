"""The exception root and the one error the wire format raises (imports nothing of the app).

``app.errors`` re-exports both and adds the rest; the root lives here because
the wire format is the lowest layer and must not import the app.
"""

from __future__ import annotations

__all__ = ["InvalidInputError", "MmsyncError"]


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
