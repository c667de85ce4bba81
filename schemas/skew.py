"""SkewState (internal topic ``PREFIX.skew``): a stream's current skew estimate.

The aligner publishes one with every window it emits, keyed by ``stream_id``; every
worker's skew board (``app/runtime/skewboard.py``) keeps the newest per stream so the
feature agents can put an alert on the reference clock (docs/contract.md, "Alert").
Not part of the external contract: its format may change with the workers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from schemas.aligned import AlignedWindow
from schemas.codec import decode_map, encode
from schemas.errors import InvalidInputError

__all__ = ["SKEW_VERSION", "SkewState"]

SKEW_VERSION = 1


def _int(d: dict[str, Any], key: str, lo: int) -> int:
    v = d.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise InvalidInputError("schema", f"skew field {key!r} must be an int >= {lo}")
    return v


def _floats(d: dict[str, Any], key: str) -> dict[str, float]:
    v = d.get(key)
    if not isinstance(v, dict):
        raise InvalidInputError("schema", f"skew field {key!r} must be a map")
    out: dict[str, float] = {}
    for k, x in v.items():
        if not isinstance(x, int | float) or isinstance(x, bool) or not math.isfinite(x):
            raise InvalidInputError("schema", f"skew field {key}[{k!r}] must be a number")
        out[str(k)] = float(x)
    return out


@dataclass(frozen=True, slots=True)
class SkewState:
    stream_id: str
    #: modality -> estimated lag behind the reference, ms (as in AlignedWindow.offsets_ms)
    offsets_ms: dict[str, float] = field(default_factory=dict)
    #: modality -> 0..1
    confidence: dict[str, float] = field(default_factory=dict)
    #: the aligner's window length, us (window ids are multiples of it)
    window_us: int = 1_000_000
    #: wall-clock microseconds of the estimate (the newest wins)
    at: int = 0

    @classmethod
    def of_window(cls, win: AlignedWindow) -> SkewState:
        """The estimate a window was emitted with."""
        return cls(stream_id=win.stream_id, offsets_ms=dict(win.offsets_ms),
                   confidence=dict(win.confidence),
                   window_us=win.window_end - win.window_start, at=win.emitted_at)

    def to_dict(self) -> dict[str, Any]:
        return {"v": SKEW_VERSION, "stream_id": self.stream_id, "offsets_ms": self.offsets_ms,
                "confidence": self.confidence, "window_us": self.window_us, "at": self.at}

    def encode(self) -> bytes:
        return encode(self.to_dict())

    @classmethod
    def decode(cls, raw: bytes | None) -> SkewState:
        d = decode_map(raw)
        if d.get("v") != SKEW_VERSION:
            raise InvalidInputError("bad_version", f"skew state version {d.get('v')!r}")
        sid = d.get("stream_id")
        if not isinstance(sid, str) or not sid:
            raise InvalidInputError("schema", "skew field 'stream_id' must be a string")
        w, at = _int(d, "window_us", 1), _int(d, "at", 0)
        conf = _floats(d, "confidence")
        if any(not 0.0 <= c <= 1.0 for c in conf.values()):
            raise InvalidInputError("schema", "skew confidence must lie in 0..1")
        return cls(stream_id=sid, offsets_ms=_floats(d, "offsets_ms"), confidence=conf,
                   window_us=w, at=at)
