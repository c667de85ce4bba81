"""AlignedWindow (``mm.aligned``) and LateEvent (``mm.late``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schemas.codec import decode_map, encode

__all__ = ["ALIGNED_VERSION", "AlignedWindow", "LateEvent", "window_id"]

ALIGNED_VERSION = 1


def window_id(stream_id: str, window_start: int) -> str:
    """Deterministic id, so consumers can de-duplicate a window emitted twice."""
    return f"{stream_id}@{window_start}"


@dataclass(slots=True)
class AlignedWindow:
    stream_id: str
    window_start: int
    window_end: int
    rate_hz: float
    offsets_ms: dict[str, float]
    confidence: dict[str, float]
    counts: dict[str, int]
    grid: dict[str, dict[str, list[Any]]]
    moderation: dict[str, Any]
    trace_ids: list[str]
    emitted_at: int
    #: per-stage seconds summed over the merged events, plus ``align``.
    stages: dict[str, float] = field(default_factory=dict)
    #: (modality, partition, offset) of every merged input, for accounting audits.
    sources: list[list[Any]] = field(default_factory=list)
    #: each caption merged: trace_id, ts (as published), aligned_ts (us, reference clock:
    #: where the aligner placed it, on its own speech), conf (0..1). Issue 25: an added key,
    #: so readers of the earlier fields see no change.
    captions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def id(self) -> str:
        return window_id(self.stream_id, self.window_start)

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": ALIGNED_VERSION,
            "id": self.id,
            "stream_id": self.stream_id,
            "window_start": self.window_start,
            "window_end": self.window_end,
            "rate_hz": self.rate_hz,
            "offsets_ms": self.offsets_ms,
            "confidence": self.confidence,
            "counts": self.counts,
            "grid": self.grid,
            "moderation": self.moderation,
            "trace_ids": self.trace_ids,
            "emitted_at": self.emitted_at,
            "stages": self.stages,
            "sources": self.sources,
            "captions": self.captions,
        }

    def encode(self) -> bytes:
        return encode(self.to_dict())

    @staticmethod
    def decode(raw: bytes) -> dict[str, Any]:
        """Consumers read windows as plain maps (forward-compatible with added fields)."""
        return decode_map(raw)


@dataclass(slots=True)
class LateEvent:
    """An event that arrived after the window it belongs to was emitted."""

    stream_id: str
    modality: str
    ts: int
    seq: int | None
    trace_id: str | None
    window_start: int
    window_end: int
    src_partition: int
    src_offset: int
    at: int
    feats: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": ALIGNED_VERSION,
            "stream_id": self.stream_id,
            "modality": self.modality,
            "ts": self.ts,
            "seq": self.seq,
            "trace_id": self.trace_id,
            "window": {"id": window_id(self.stream_id, self.window_start),
                       "start": self.window_start, "end": self.window_end},
            "src": [self.src_partition, self.src_offset],
            "at": self.at,
            "feats": self.feats,
        }

    def encode(self) -> bytes:
        return encode(self.to_dict())
