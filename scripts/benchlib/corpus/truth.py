"""What a corpus stream really is: its true offsets over media time and its informative stretches.

Media time is seconds from the stream's start on the reference (image) clock.
A modality's true offset is its lag behind the reference in ms (positive: its
timestamps are later for the same content, the sign of ``offsets_ms``):
``skew_ms + drift_ms_per_min * t / 60``. Captions that behave like ASR have
each their own delay; their offset is the median of those delays (the lag that fits
them best in |error|), and each caption's delay is listed too.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Caption", "Offset", "Stretch", "StreamTruth"]


@dataclass(frozen=True)
class Caption:
    """One caption: when its speech starts (media s, reference clock) and its own delay, ms."""

    speech_s: float
    delay_ms: float
    text: str = ""


@dataclass(frozen=True)
class Offset:
    skew_ms: float
    drift_ms_per_min: float = 0.0
    #: "audio", "subtitles" (constant shift) or "asr" (per-caption delays around skew_ms).
    style: str = "audio"
    captions: tuple[Caption, ...] = ()

    def at(self, t_s: float) -> float:
        """The true lag at media time ``t_s``, ms."""
        return self.skew_ms + self.drift_ms_per_min * t_s / 60.0

    def mean(self, t0_s: float, t1_s: float) -> float:
        """The mean lag over media time ``t0_s..t1_s`` (drift is linear: the midpoint's), ms."""
        return self.at((t0_s + t1_s) / 2)


@dataclass(frozen=True)
class Stretch:
    """A span of media time, s, that either carries alignable content or does not."""

    t0_s: float
    t1_s: float
    informative: bool


@dataclass
class StreamTruth:
    stream_id: str
    start_us: int
    seconds: float
    offsets: dict[str, Offset] = field(default_factory=dict)
    stretches: list[Stretch] = field(default_factory=list)
    #: free-form facts about how the stream was made (fps, sr, ...), for reports.
    info: dict[str, Any] = field(default_factory=dict)

    def offset_ms(self, modality: str, t_s: float) -> float:
        return self.offsets[modality].at(t_s)

    def media_s(self, ts_us: int) -> float:
        """Media time of a reference-clock timestamp, s."""
        return (ts_us - self.start_us) / 1e6

    def stretch_at(self, t_s: float) -> Stretch | None:
        for s in self.stretches:
            if s.t0_s <= t_s < s.t1_s:
                return s
        return None

    def informative(self, t0_s: float, t1_s: float) -> bool:
        """True when ``t0_s..t1_s`` lies wholly inside an informative stretch."""
        return any(s.informative and s.t0_s <= t0_s and t1_s <= s.t1_s for s in self.stretches)

    def quiet(self) -> list[Stretch]:
        return [s for s in self.stretches if not s.informative]

    # -- JSON (the real clips keep theirs beside the file) -------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "stream_id": self.stream_id, "start_us": self.start_us, "seconds": self.seconds,
            "offsets": {m: {**asdict(o), "captions": [asdict(c) for c in o.captions]}
                        for m, o in self.offsets.items()},
            "stretches": [asdict(s) for s in self.stretches],
            "info": self.info,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StreamTruth:
        offsets = {
            m: Offset(skew_ms=float(o["skew_ms"]), drift_ms_per_min=float(o["drift_ms_per_min"]),
                      style=str(o["style"]),
                      captions=tuple(Caption(**c) for c in o.get("captions", ())))
            for m, o in d["offsets"].items()
        }
        return cls(stream_id=d["stream_id"], start_us=int(d["start_us"]),
                   seconds=float(d["seconds"]), offsets=offsets,
                   stretches=[Stretch(**s) for s in d["stretches"]], info=dict(d.get("info", {})))

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1, ensure_ascii=False) + "\n",
                        encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> StreamTruth:
        return cls.from_json(json.loads(path.read_text(encoding="utf-8")))
