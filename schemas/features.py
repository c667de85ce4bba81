"""The internal records on ``mm.features`` (the project's own format, v1).

:class:`FeatureRecord`: one per input event that passed validation. ``feats``
holds plain values and arrays packed by :func:`schemas.codec.pack_array`.

:class:`ProgressMark` (``"type": "progress"``): how far a feature agent has
got through its input partitions. Each agent sends one to every features
partition every few hundred ms, after the feature records it covers (same
producer, so a partition carries a mark only after those records). The aligner
reads from it whether a silent modality is idle (its input is drained) or slow
(records still wait in its input): slow is not idle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schemas.codec import decode_map, encode
from schemas.errors import InvalidInputError

__all__ = ["FEATURES_VERSION", "FeatureRecord", "ProgressMark", "decode_features", "is_drained"]

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
        return cls.from_map(decode_map(raw))

    @classmethod
    def from_map(cls, d: dict[str, Any]) -> FeatureRecord:
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


@dataclass(frozen=True, slots=True)
class ProgressMark:
    """One feature agent's progress through its input partitions of one modality."""

    modality: str
    #: input partition -> (next offset to process, end offset of the log as last fetched);
    #: drained when the first is >= the second. End -1: not known yet (counts as behind).
    parts: dict[int, tuple[int, int]]
    #: wall-clock microseconds when it was made
    at: int
    #: input partition -> wall-clock microseconds when its end was last fetched (the
    #: consumer's last poll of it): a "drained" vouches for the records made before then,
    #: not for any made between then and ``at``. Absent: not known (older marks)
    polled: dict[int, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"v": FEATURES_VERSION, "type": "progress", "modality": self.modality,
                "parts": [[p, n, e] for p, (n, e) in sorted(self.parts.items())], "at": self.at,
                "polled": [[p, us] for p, us in sorted(self.polled.items())]}

    def encode(self) -> bytes:
        return encode(self.to_dict())

    def drained(self, partition: int) -> bool | None:
        """Whether ``partition`` had nothing left to process; None if this agent does not
        serve it."""
        got = self.parts.get(partition)
        if got is None:
            return None
        return is_drained(*got)


def is_drained(next_offset: int, end: int) -> bool:
    """A partition whose next offset to process has reached its end (end -1: unknown)."""
    return end >= 0 and next_offset >= end


def decode_features(raw: bytes | None) -> FeatureRecord | ProgressMark:
    """Either record of the features topic; ``InvalidInputError`` for anything else."""
    d = decode_map(raw)
    if d.get("type") != "progress":
        return FeatureRecord.from_map(d)
    if d.get("v") != FEATURES_VERSION:
        raise InvalidInputError("bad_version", f"progress mark version {d.get('v')!r}")
    try:
        parts = {int(p): (int(n), int(e)) for p, n, e in d["parts"]}
        polled = {int(p): int(us) for p, us in d.get("polled") or ()}
        return ProgressMark(modality=str(d["modality"]), parts=parts, at=int(d["at"]),
                            polled=polled)
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidInputError("schema", f"bad progress mark: {exc!r}") from None
