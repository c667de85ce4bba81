"""Alert (``mm.alerts``): one moderation signal of one input, sent as soon as its features
exist (docs/contract.md, "Alert"). Imports nothing of the app.

The contract's fields come first; mmsync adds ``event_ts`` (the producer's own ``ts``),
``offset_ms`` and ``skew_confidence`` (the skew estimate that turned ``event_ts`` into
``ts``) and ``kafka_ts_ms`` (the input record's Kafka timestamp, for latency). ``detail``
is a map whose keys depend on ``kind`` (docs/contract.md lists them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from schemas.codec import decode_map, encode
from schemas.errors import InvalidInputError

__all__ = ["ALERT_VERSION", "KINDS", "Alert", "Source"]

ALERT_VERSION = 1
#: What mmsync sends, kind -> the modality it comes from; a consumer should skip kinds it
#: does not know (a newer producer may add some).
KINDS: dict[str, str] = {"nsfw": "image", "ocr_term": "image", "blind": "image",
                         "term": "text"}
_MAX_ID = 1024


@dataclass(frozen=True, slots=True)
class Source:
    """Where the input was read: its topic, partition and offset."""

    topic: str
    partition: int
    offset: int

    def to_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "offset": self.offset}


def _int(d: dict[str, Any], key: str, lo: int = 0) -> int:
    v = d.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise InvalidInputError("schema", f"alert field {key!r} must be an int >= {lo}, got {v!r}")
    return v


def _num(d: dict[str, Any], key: str) -> float:
    v = d.get(key)
    if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
        raise InvalidInputError("schema", f"alert field {key!r} must be a number, got {v!r}")
    return float(v)


def _str(d: dict[str, Any], key: str) -> str:
    v = d.get(key)
    if not isinstance(v, str) or not 0 < len(v) <= _MAX_ID:
        raise InvalidInputError("schema", f"alert field {key!r} must be a short string")
    return v


@dataclass(frozen=True, slots=True)
class Alert:
    stream_id: str
    modality: str
    kind: str
    #: 0..1: the NSFW probability; 1.0 for a term match; for ``blind``, the share of the
    #: stream's frames in the batch that went unscored
    score: float
    #: event time of the input on the reference clock (``event_ts`` minus the offset), us
    ts: int
    #: ``stream_id@window_start``: the window the aligner will merge the input into
    window_id: str
    trace_id: str
    source: Source
    #: wall-clock microseconds when it was made
    emitted_at: int
    detail: dict[str, Any] = field(default_factory=dict)
    #: the producer's ``ts``, on the input modality's own clock, us (mmsync)
    event_ts: int = 0
    #: the skew applied: ``ts = event_ts - offset_ms * 1000`` (mmsync)
    offset_ms: float = 0.0
    #: confidence of that estimate, 0..1; 0: no estimate known, offset 0 (mmsync)
    skew_confidence: float = 0.0
    #: the input record's Kafka timestamp, ms (mmsync: alert latency)
    kafka_ts_ms: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.score <= 1.0:
            raise ValueError(f"alert score {self.score} is outside 0..1")
        if not 0.0 <= self.skew_confidence <= 1.0:
            raise ValueError(f"skew confidence {self.skew_confidence} is outside 0..1")
        if not self.kind or not self.stream_id:
            raise ValueError("an alert needs a kind and a stream_id")

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": ALERT_VERSION,
            "stream_id": self.stream_id,
            "modality": self.modality,
            "kind": self.kind,
            "score": self.score,
            "detail": self.detail,
            "ts": self.ts,
            "window_id": self.window_id,
            "trace_id": self.trace_id,
            "source": self.source.to_dict(),
            "emitted_at": self.emitted_at,
            "event_ts": self.event_ts,
            "offset_ms": self.offset_ms,
            "skew_confidence": self.skew_confidence,
            "kafka_ts_ms": self.kafka_ts_ms,
        }

    def encode(self) -> bytes:
        return encode(self.to_dict())

    @classmethod
    def decode(cls, raw: bytes | None) -> Alert:
        """A valid Alert or ``InvalidInputError`` (never half-checked). Unknown keys are
        ignored; an unknown ``kind`` decodes (the caller decides what to do with it)."""
        d = decode_map(raw)
        if d.get("v") != ALERT_VERSION:
            raise InvalidInputError("bad_version", f"alert version {d.get('v')!r}")
        src = d.get("source")
        if not isinstance(src, dict):
            raise InvalidInputError("schema", "alert field 'source' must be a map")
        detail = d.get("detail", {})
        if not isinstance(detail, dict):
            raise InvalidInputError("schema", "alert field 'detail' must be a map")
        try:
            return cls(
                stream_id=_str(d, "stream_id"), modality=_str(d, "modality"),
                kind=_str(d, "kind"), score=_num(d, "score"), ts=_int(d, "ts"),
                window_id=_str(d, "window_id"), trace_id=_str(d, "trace_id"),
                source=Source(_str(src, "topic"), _int(src, "partition"), _int(src, "offset")),
                emitted_at=_int(d, "emitted_at"), detail=detail,
                event_ts=_int(d, "event_ts") if "event_ts" in d else 0,
                offset_ms=_num(d, "offset_ms") if "offset_ms" in d else 0.0,
                skew_confidence=_num(d, "skew_confidence") if "skew_confidence" in d else 0.0,
                kafka_ts_ms=_int(d, "kafka_ts_ms") if "kafka_ts_ms" in d else 0,
            )
        except ValueError as exc:  # __post_init__: out of range
            raise InvalidInputError("schema", str(exc)) from None
