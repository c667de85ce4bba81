"""The internal feature record on ``mm.features`` (the project's own format, v1).

One record per input event that passed validation. ``feats`` holds plain
values and arrays packed by :func:`schemas.codec.pack_array`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schemas.codec import decode_map, encode
from schemas.errors import InvalidInputError

__all__ = ["FEATURES_VERSION", "FeatureRecord"]

FEATURES_VERSION = 1


@dataclass(slots=True)
class FeatureRecord:
    stream_id: str
    modality: str
    ts: int
    #: microseconds the item lasts (audio chunk length, caption duration; 0 for frames).
    dur: int
    seq: int | None
    trace_id: str | None
    #: Kafka timestamp of the input record, ms (for end-to-end latency).
    kafka_ts_ms: int
    #: where the input came from: (partition, offset) on its input topic.
    src_partition: int
    src_offset: int
    feats: dict[str, Any] = field(default_factory=dict)
    #: per-stage seconds spent on this item (decode, model, cache), for tracing.
    stages: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": FEATURES_VERSION,
            "stream_id": self.stream_id,
            "modality": self.modality,
            "ts": self.ts,
            "dur": self.dur,
            "seq": self.seq,
            "trace_id": self.trace_id,
            "kafka_ts_ms": self.kafka_ts_ms,
            "src": [self.src_partition, self.src_offset],
            "feats": self.feats,
            "stages": self.stages,
        }

    def encode(self) -> bytes:
        return encode(self.to_dict())

    @classmethod
    def decode(cls, raw: bytes | None) -> FeatureRecord:
        d = decode_map(raw)
        if d.get("v") != FEATURES_VERSION:
            raise InvalidInputError("bad_version", f"feature record version {d.get('v')!r}")
        try:
            src = d["src"]
            return cls(
                stream_id=str(d["stream_id"]),
                modality=str(d["modality"]),
                ts=int(d["ts"]),
                dur=int(d["dur"]),
                seq=None if d.get("seq") is None else int(d["seq"]),
                trace_id=d.get("trace_id"),
                kafka_ts_ms=int(d["kafka_ts_ms"]),
                src_partition=int(src[0]),
                src_offset=int(src[1]),
                feats=dict(d.get("feats") or {}),
                stages=dict(d.get("stages") or {}),
            )
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise InvalidInputError("schema", f"bad feature record: {exc!r}") from None
