"""The exception root and the one error the wire format raises (imports nothing of the app).

``app.errors`` re-exports both and adds the rest; the root lives here because
the wire format is the lowest layer and must not import the app.
"""

from __future__ import annotations

__all__ = ["REASONS", "InvalidInputError", "MmsyncError"]

#: The closed vocabulary of ``error``: every reason a record can be dead-lettered for.
#: Documented in docs/contract.md (a test keeps the two equal).
REASONS: dict[str, str] = {
    "bad_msgpack": "the value is not one msgpack map, or the record has no value",
    "schema": "a field is missing, has the wrong type, or is out of range",
    "bad_version": "the schema version `v` is not the int 1",
    "too_large": "a field or the whole record exceeds its size limit",
    "bad_image": "`data` is not a decodable JPEG or PNG within the pixel limit",
    "bad_audio": "`sr`, `ch` or the PCM length do not fit the contract",
    "bad_ts": "`ts` is negative or lies too far in the future",
    "key_mismatch": "the key is missing, not UTF-8, or differs from `stream_id`",
    "extract_failed": "a model raised on this record, run alone after its batch failed",
    "retries_exhausted": "a transient failure (e.g. out of GPU memory with no CPU fallback)"
                         " outlasted its bounded retries",
}


class MmsyncError(Exception):
    """Root of every error mmsync raises on purpose."""

    #: Whether retrying the same operation may succeed.
    retriable: bool = False


class InvalidInputError(MmsyncError):
    """Permanent: the record can never be processed; it goes to the dead-letter topic.

    ``reason`` is the short machine-readable code of the contract, one of
    ``schemas.dead_letter.REASONS``; ``detail`` is for people.
    """

    def __init__(self, reason: str, detail: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"dead-letter reason {reason!r} is not in REASONS")
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
