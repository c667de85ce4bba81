"""Reading the output topics and checking the contract's accounting."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiokafka.structs import ConsumerRecord

from app.kafka.clients import consume
from app.settings import Settings
from schemas.aligned import window_id
from schemas.codec import decode_map

__all__ = ["Outputs", "collect"]


@dataclass
class Outputs:
    """What came out, de-duplicated by input record.

    Every window lists its ``sources`` (modality, input partition, input offset).
    A record counts once, however often it comes out: a window replayed after a
    crash with the same id and content is dropped (``duplicate_windows``); a
    replayed record that a fresh skew estimate put into another window than the
    first time is counted in the first (``duplicate_records``); a late event or
    dead letter seen again is dropped (``duplicate_other``).

    It also checks the contract's window identity: a window published again under
    the same ``id`` must carry the same inputs or more. Each re-emission that lost
    inputs is listed in ``shrunk`` (id, the inputs it lost), and
    :attr:`accounted_newest` counts what a consumer that keeps only the newest
    window per id (a compacted topic, an upsert by id) still has.
    """

    windows: list[dict[str, Any]] = field(default_factory=list)
    late: list[dict[str, Any]] = field(default_factory=list)
    dlq: list[dict[str, Any]] = field(default_factory=list)
    #: what ``mm.alerts`` held (read only when asked: ``collect(..., on_alert=...)``)
    alerts: list[dict[str, Any]] = field(default_factory=list)
    duplicate_windows: int = 0
    duplicate_records: int = 0
    duplicate_other: int = 0
    _ids: set[Any] = field(default_factory=set)
    #: input record -> where it was counted ("merged" or "late")
    _placed: dict[tuple[Any, ...], str] = field(default_factory=dict)
    _merged: Counter[str] = field(default_factory=Counter)
    #: window id -> the inputs of its newest emission
    _newest: dict[str, frozenset[tuple[Any, ...]]] = field(default_factory=dict)
    #: (window id, inputs lost) for every re-emission with fewer inputs
    shrunk: list[tuple[str, frozenset[tuple[Any, ...]]]] = field(default_factory=list)
    #: window id -> how often it was published
    emissions: Counter[str] = field(default_factory=Counter)

    def merged(self, modality: str | None = None) -> int:
        return self._merged[modality] if modality else sum(self._merged.values())

    @property
    def accounted(self) -> int:
        return len(self._placed) + len(self.dlq)

    @property
    def accounted_newest(self) -> int:
        """Inputs accounted for from the newest emission of each window id, the late
        events and the dead letters: what a consumer keeping one window per id sees."""
        inputs: set[tuple[Any, ...]] = set()
        for srcs in self._newest.values():
            inputs.update(srcs)
        inputs.update(rec for rec, where in self._placed.items() if where == "late")
        return len(inputs) + len(self.dlq)

    @property
    def inputs(self) -> set[tuple[Any, ...]]:
        """Every input accounted in a window or as late: (modality, partition, offset)."""
        return set(self._placed)

    @property
    def late_inputs(self) -> int:
        """Inputs whose one place is ``mm.late`` (not merged in any window)."""
        return sum(1 for where in self._placed.values() if where == "late")

    def add(self, kind: str, value: dict[str, Any]) -> None:
        if kind == "alerts":  # not inputs' placements: kept as they come, replays too
            self.alerts.append(value)
        elif kind == "aligned":
            self._add_window(value)
        elif kind == "late":
            src = ("late", value.get("stream_id"), value.get("modality"),
                   *(value.get("src") or ()))
            if self._seen(src):
                return
            self.late.append(value)
            rec = (value.get("modality"), *(value.get("src") or ()))
            if rec in self._placed:
                self.duplicate_records += 1
            else:
                self._placed[rec] = "late"
        else:
            if self._seen(("dlq", value.get("source_topic"), value.get("partition"),
                           value.get("offset"))):
                return
            self.dlq.append(value)

    def _add_window(self, w: dict[str, Any]) -> None:
        wid = w.get("id") or window_id(w["stream_id"], w["window_start"])
        sources = [tuple(x) for x in w.get("sources") or ()]
        self.emissions[wid] += 1
        now = frozenset(sources)
        before = self._newest.get(wid)
        if before is not None and not now >= before:
            self.shrunk.append((wid, before - now))
        self._newest[wid] = now
        ident = ("window", wid, tuple(sorted(sources)))
        if ident in self._ids:
            self.duplicate_windows += 1
            return
        self._ids.add(ident)
        self.windows.append(w)
        if not sources:  # a window from before sources were recorded: trust its counts
            for m, n in w["counts"].items():
                self._merged[m] += n
            return
        for rec in sources:
            if rec in self._placed:
                self.duplicate_records += 1
            else:
                self._placed[rec] = "merged"
                self._merged[rec[0]] += 1

    def _seen(self, ident: tuple[Any, ...]) -> bool:
        if ident in self._ids:
            self.duplicate_other += 1
            return True
        self._ids.add(ident)
        return False


async def collect(
    s: Settings, *, until: Callable[[Outputs], bool], timeout_s: float,
    keys: set[bytes] | None = None, on_window: Callable[[dict[str, Any]], None] | None = None,
    on_alert: Callable[[dict[str, Any]], None] | None = None,
) -> Outputs:
    """Read aligned, late and dlq (and with ``on_alert`` alerts) from the beginning until
    ``until(outputs)`` or the timeout."""
    kinds = {s.topic("aligned"): "aligned", s.topic("late"): "late", s.topic("dlq"): "dlq"}
    if on_alert is not None:
        kinds[s.topic("alerts")] = "alerts"
    out = Outputs()

    def handle(m: ConsumerRecord) -> None:
        if keys is not None and m.key not in keys:
            return
        kind = kinds[m.topic]
        value = decode_map(m.value)
        out.add(kind, value)
        if kind == "aligned" and on_window is not None:
            on_window(value)
        elif kind == "alerts" and on_alert is not None:
            on_alert(value)

    await consume(s, kinds, handle, until=lambda: until(out), timeout_s=timeout_s)
    return out
