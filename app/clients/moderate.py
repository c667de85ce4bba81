"""A sample moderation consumer of ``mm.aligned``: flag windows, report per stream.

The flagging (:func:`flag_window`) and the report (:class:`Report`) are pure
functions over decoded window maps, so they test without a broker; only
:func:`moderate` reads the topic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiokafka.structs import ConsumerRecord
from rich.table import Table

from app.errors import InvalidInputError
from app.kafka.clients import consume
from app.settings import Settings
from schemas.aligned import window_id
from schemas.codec import decode_map

__all__ = ["Flag", "Report", "StreamStats", "Thresholds", "flag_window", "moderate"]


@dataclass(frozen=True)
class Thresholds:
    #: flag a window whose highest image NSFW score is at least this (0..1); None: never.
    nsfw: float | None = 0.8
    #: flag a window in which sensitive terms were matched.
    terms: bool = False


@dataclass(frozen=True)
class Flag:
    window_id: str
    stream_id: str
    window_start: int
    window_end: int
    reasons: tuple[str, ...]

    def line(self) -> str:
        span = f"{self.window_start / 1e6:.2f}s..{self.window_end / 1e6:.2f}s"
        return f"FLAG {self.stream_id} [{span}] {'; '.join(self.reasons)}"


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def flag_window(w: dict[str, Any], th: Thresholds) -> Flag | None:
    """The window's flag and why, or None when it passes every threshold.

    Reads the window's ``moderation`` map (``nsfw_max``: highest image NSFW
    score or None; ``terms``: matched sensitive terms); a window without one
    (light models) is never flagged.
    """
    mod = w.get("moderation") or {}
    reasons = []
    nsfw = _num(mod.get("nsfw_max"))
    if th.nsfw is not None and nsfw is not None and nsfw >= th.nsfw:
        reasons.append(f"nsfw {nsfw:.2f} >= {th.nsfw:.2f}")
    terms = [str(t) for t in mod.get("terms") or ()]
    if th.terms and terms:
        reasons.append(f"terms: {', '.join(terms)}")
    if not reasons:
        return None
    start = int(w.get("window_start", 0))
    return Flag(window_id=str(w.get("id") or window_id(w["stream_id"], start)),
                stream_id=str(w["stream_id"]), window_start=start,
                window_end=int(w.get("window_end", start)), reasons=tuple(reasons))


@dataclass
class StreamStats:
    windows: int = 0
    flagged: int = 0
    nsfw_max: float | None = None
    terms: set[str] = field(default_factory=set)
    #: modality -> (sum of offsets in ms, windows): for the mean offset.
    offsets: dict[str, tuple[float, int]] = field(default_factory=dict)

    def mean_offset(self, modality: str) -> float | None:
        total, n = self.offsets.get(modality, (0.0, 0))
        return total / n if n else None


@dataclass
class Report:
    thresholds: Thresholds = field(default_factory=Thresholds)
    streams: dict[str, StreamStats] = field(default_factory=dict)
    #: records on the topic that are not windows (skipped).
    bad: int = 0
    _seen: set[str] = field(default_factory=set)

    def add(self, w: dict[str, Any]) -> Flag | None:
        """Count one window (a replayed window id only once) and return its flag, if any."""
        wid = str(w.get("id") or window_id(w["stream_id"], w["window_start"]))
        if wid in self._seen:
            return None
        self._seen.add(wid)
        st = self.streams.setdefault(str(w["stream_id"]), StreamStats())
        st.windows += 1
        mod = w.get("moderation") or {}
        nsfw = _num(mod.get("nsfw_max"))
        if nsfw is not None:
            st.nsfw_max = nsfw if st.nsfw_max is None else max(st.nsfw_max, nsfw)
        st.terms.update(str(t) for t in mod.get("terms") or ())
        for m, off in (w.get("offsets_ms") or {}).items():
            v = _num(off)
            if v is not None and m != "image":
                total, n = st.offsets.get(m, (0.0, 0))
                st.offsets[m] = (total + v, n + 1)
        flag = flag_window(w, self.thresholds)
        if flag is not None:
            st.flagged += 1
        return flag

    @property
    def windows(self) -> int:
        return sum(st.windows for st in self.streams.values())

    @property
    def flagged(self) -> int:
        return sum(st.flagged for st in self.streams.values())

    def table(self) -> Table:
        t = Table(title=f"moderation: {self.windows} windows, {self.flagged} flagged")
        for col in ("stream", "windows", "flagged", "max nsfw", "terms seen",
                    "mean audio off ms", "mean text off ms"):
            t.add_column(col, justify="left" if col in ("stream", "terms seen") else "right")

        def fmt(v: float | None, spec: str) -> str:
            return "-" if v is None else format(v, spec)

        for sid in sorted(self.streams):
            st = self.streams[sid]
            terms = ", ".join(sorted(st.terms))
            t.add_row(sid, str(st.windows), str(st.flagged), fmt(st.nsfw_max, ".2f"),
                      terms[:60] or "-", fmt(st.mean_offset("audio"), "+.0f"),
                      fmt(st.mean_offset("text"), "+.0f"))
        return t


async def moderate(s: Settings, report: Report, *, count: int | None = None,
                   timeout_s: float = 3600.0,
                   on_flag: Callable[[Flag], None] | None = None) -> Report:
    """Read ``mm.aligned`` from the start into ``report`` until ``count`` windows or the timeout.

    ``report`` is the caller's, so what was counted survives a Ctrl-C.
    """
    def handle(m: ConsumerRecord) -> None:
        try:
            flag = report.add(decode_map(m.value))
        except (InvalidInputError, KeyError, TypeError, ValueError):
            report.bad += 1
            return
        if flag is not None and on_flag is not None:
            on_flag(flag)

    await consume(s, [s.topic("aligned")], handle, timeout_s=timeout_s,
                  until=lambda: count is not None and report.windows >= count)
    return report
