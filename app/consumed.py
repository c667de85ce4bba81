"""The dead-letter path: a failed record travels with its error (bytewax's habit)."""

from __future__ import annotations

from dataclasses import dataclass

from schemas.dead_letter import DeadLetter

__all__ = ["RawMsg", "dead_letter"]


@dataclass(frozen=True, slots=True)
class RawMsg:
    """One consumed record, decoupled from Faust so pure code can handle it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int


def dead_letter(msg: RawMsg, reason: str, detail: str) -> DeadLetter:
    return DeadLetter(source_topic=msg.topic, partition=msg.partition, offset=msg.offset,
                      key=msg.key, value=msg.value, error=reason, detail=detail)
