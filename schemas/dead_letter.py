"""DeadLetter (``mm.dlq``): the original bytes, untouched, with the reason."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from schemas.codec import decode_map, encode
from schemas.errors import REASONS

__all__ = ["DLQ_VERSION", "REASONS", "DeadLetter"]

DLQ_VERSION = 1
_MAX_DETAIL = 1024

@dataclass(frozen=True, slots=True)
class DeadLetter:
    source_topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    error: str
    detail: str
    at: int = 0

    def __post_init__(self) -> None:
        if self.error not in REASONS:
            raise ValueError(f"dead-letter reason {self.error!r} is not in REASONS")

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": DLQ_VERSION,
            "source_topic": self.source_topic,
            "partition": self.partition,
            "offset": self.offset,
            "key": self.key,
            "value": self.value,
            "error": self.error,
            "detail": self.detail[:_MAX_DETAIL],
            "at": self.at or time.time_ns() // 1000,
        }

    def encode(self) -> bytes:
        return encode(self.to_dict())

    @classmethod
    def decode(cls, raw: bytes) -> DeadLetter:
        d = decode_map(raw)
        return cls(
            source_topic=d["source_topic"], partition=d["partition"], offset=d["offset"],
            key=d["key"], value=d["value"], error=d["error"], detail=d["detail"], at=d["at"],
        )
