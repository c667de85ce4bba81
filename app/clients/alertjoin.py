"""Alerts joined to the windows that hold their inputs: confirm or clear (pure, no broker).

An alert (``mm.alerts``) names its input (``source``) and the window it predicts the
input lands in (``window_id``). Windows (``mm.aligned``) list the inputs they merged
(``sources``: modality, input partition, input offset). :class:`AlertJoin` takes both,
in whatever order they are read, and decides each alert once:

- **confirmed**: the predicted window arrived holding the input and the signal
  (``nsfw``: its ``moderation.nsfw_max`` at least the alert's threshold; ``term``: its
  ``moderation.terms`` include the alert's terms; ``ocr_term`` and kinds it does not
  know: the input alone, as windows carry no OCR text);
- **cleared**: the predicted window arrived without the signal, or without the input
  (it went late, or the skew estimate moved it), or the input turned up in another
  window first;
- **open**: neither has happened yet.

``blind`` alerts are not joined: they are periods in which frames went unscored,
reported per stream. A replayed alert (the same kind and source) counts once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.table import Table

from app.lru import LRU
from schemas.alert import Alert

__all__ = ["AlertJoin", "Note", "StreamAlerts"]

#: Windows (and placed inputs) remembered for alerts read after their window.
_MAX_WINDOWS = 8192
#: A source: (modality, input partition, input offset), as in a window's ``sources``.
Src = tuple[str, int, int]


@dataclass(frozen=True)
class Note:
    """One line of ``mmsync moderate``'s output."""

    verb: str  # ALERT, CONFIRMED, CLEARED, BLIND
    stream_id: str
    text: str

    def line(self) -> str:
        return f"{self.verb:<9} {self.stream_id} {self.text}"


@dataclass
class StreamAlerts:
    alerts: int = 0
    confirmed: int = 0
    cleared: int = 0
    duplicates: int = 0
    blind_batches: int = 0
    blind_frames: int = 0
    #: event time span covered by blind records, us (first, last)
    blind_span: tuple[int, int] | None = None
    kinds: dict[str, int] = field(default_factory=dict)

    @property
    def open(self) -> int:
        return self.alerts - self.confirmed - self.cleared


@dataclass(slots=True)
class _Window:
    sources: frozenset[Src]
    moderation: dict[str, Any]


def _src(a: Alert) -> Src:
    return (a.modality, a.source.partition, a.source.offset)


def _describe(a: Alert) -> str:
    d = a.detail
    if a.kind in ("term", "ocr_term"):
        what = "terms: " + ", ".join(str(t) for t in d.get("terms") or ())
    else:
        what = f"score {a.score:.3f}"
    skew = (f"skew {a.offset_ms:+.0f} ms conf {a.skew_confidence:.2f}"
            if a.modality != "image" else "reference clock")
    return (f"{a.modality} {a.kind} t={a.ts / 1e6:.2f}s -> {a.window_id} ({skew}) {what} "
            f"[{a.trace_id}]")


def _holds_signal(a: Alert, w: _Window) -> bool:
    mod = w.moderation
    if a.kind == "nsfw":
        top, th = mod.get("nsfw_max"), a.detail.get("threshold", a.score)
        return isinstance(top, int | float) and isinstance(th, int | float) and top >= th
    if a.kind == "term":
        return set(map(str, a.detail.get("terms") or ())) <= set(map(str, mod.get("terms") or ()))
    return True  # ocr_term (windows carry no OCR text) and kinds we do not know


class AlertJoin:
    def __init__(self, max_windows: int = _MAX_WINDOWS) -> None:
        self.streams: dict[str, StreamAlerts] = {}
        #: open alerts by input
        self._open: dict[Src, list[Alert]] = {}
        self._seen: set[tuple[str, Src]] = set()
        self._windows: LRU[str, _Window] = LRU(max_windows)
        #: input -> the window it was merged into
        self._placed: LRU[Src, str] = LRU(max_windows * 64)

    def _stats(self, sid: str) -> StreamAlerts:
        return self.streams.setdefault(sid, StreamAlerts())

    def on_alert(self, a: Alert) -> list[Note]:
        """One alert read from ``mm.alerts``: its ALERT (or BLIND) line, and its decision
        if its window was read already."""
        st = self._stats(a.stream_id)
        if a.kind == "blind":
            return [self._blind(a, st)]
        key = (a.kind, _src(a))
        if key in self._seen:
            st.duplicates += 1
            return []
        self._seen.add(key)
        st.alerts += 1
        st.kinds[a.kind] = st.kinds.get(a.kind, 0) + 1
        notes = [Note("ALERT", a.stream_id, _describe(a))]
        placed = self._placed.get(_src(a))
        if placed is not None:
            w = self._windows.get(placed)
            if w is not None:
                notes.append(self._decide(a, placed, w))
                return notes
        w = self._windows.get(a.window_id)
        if w is not None:  # its window came and went without the input
            notes.append(self._decide(a, a.window_id, w))
            return notes
        self._open.setdefault(_src(a), []).append(a)
        return notes

    def on_window(self, win: dict[str, Any]) -> list[Note]:
        """One window read from ``mm.aligned``: the decisions it brings."""
        wid = str(win.get("id") or f"{win['stream_id']}@{win['window_start']}")
        srcs = frozenset((str(s[0]), int(s[1]), int(s[2])) for s in win.get("sources") or ()
                         if isinstance(s, list | tuple) and len(s) == 3)
        w = _Window(srcs, dict(win.get("moderation") or {}))
        self._windows.put(wid, w)
        notes = []
        for src in srcs:
            self._placed.put(src, wid)
            for a in self._open.pop(src, ()):
                notes.append(self._decide(a, wid, w))
        # alerts that predicted this window for an input it does not hold
        for src, alerts in list(self._open.items()):
            keep = [a for a in alerts if a.window_id != wid]
            for a in alerts:
                if a.window_id == wid:
                    notes.append(self._decide(a, wid, w))
            if keep:
                self._open[src] = keep
            else:
                del self._open[src]
        return notes

    def _decide(self, a: Alert, wid: str, w: _Window) -> Note:
        st = self._stats(a.stream_id)
        if wid == a.window_id and _src(a) in w.sources:
            if _holds_signal(a, w):
                st.confirmed += 1
                return Note("CONFIRMED", a.stream_id, f"{a.kind} {a.trace_id} in {wid}")
            reason = "its window holds the input but not the signal"
        elif _src(a) in w.sources:
            reason = f"the input landed in {wid}, not {a.window_id}"
        else:
            reason = f"{wid} closed without the input (late, or moved by the skew estimate)"
        st.cleared += 1
        return Note("CLEARED", a.stream_id, f"{a.kind} {a.trace_id}: {reason}")

    def _blind(self, a: Alert, st: StreamAlerts) -> Note:
        d = a.detail
        n = int(d.get("skipped", 0) or 0)
        lo, hi = int(d.get("ts_from", a.ts) or 0), int(d.get("ts_to", a.ts) or 0)
        st.blind_batches += 1
        st.blind_frames += n
        st.blind_span = (lo, hi) if st.blind_span is None else (
            min(st.blind_span[0], lo), max(st.blind_span[1], hi))
        return Note("BLIND", a.stream_id,
                    f"{n}/{d.get('frames', '?')} frames unscored {lo / 1e6:.2f}s..{hi / 1e6:.2f}s"
                    f" (degradation level {d.get('level', '?')}, {d.get('reason', '?')})")

    @property
    def alerts(self) -> int:
        return sum(st.alerts for st in self.streams.values())

    def table(self) -> Table:
        tot = self.streams.values()
        t = Table(title=f"alerts: {self.alerts}, confirmed {sum(s.confirmed for s in tot)}, "
                        f"cleared {sum(s.cleared for s in tot)}, open {sum(s.open for s in tot)}")
        for col in ("stream", "alerts", "kinds", "confirmed", "cleared", "still open",
                    "blind frames", "blind period"):
            t.add_column(col, justify="left" if col in ("stream", "kinds", "blind period")
                         else "right")
        for sid in sorted(self.streams):
            st = self.streams[sid]
            kinds = ", ".join(f"{k} {n}" for k, n in sorted(st.kinds.items())) or "-"
            span = (f"{st.blind_span[0] / 1e6:.2f}s..{st.blind_span[1] / 1e6:.2f}s"
                    f" ({st.blind_batches} batches)" if st.blind_span else "-")
            t.add_row(sid, str(st.alerts), kinds, str(st.confirmed), str(st.cleared),
                      str(st.open), str(st.blind_frames), span)
        return t
