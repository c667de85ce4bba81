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
    """

    windows: list[dict[str, Any]] = field(default_factory=list)
    late: list[dict[str, Any]] = field(default_factory=list)
    dlq: list[dict[str, Any]] = field(default_factory=list)
    duplicate_windows: int = 0
    duplicate_records: int = 0
    duplicate_other: int = 0
    _ids: set[Any] = field(default_factory=set)
    #: input record -> where it was counted ("merged" or "late")
    _placed: dict[tuple[Any, ...], str] = field(default_factory=dict)
    _merged: Counter[str] = field(default_factory=Counter)

    def merged(self, modality: str | None = None) -> int:
        return self._merged[modality] if modality else sum(self._merged.values())

    @property
    def accounted(self) -> int:
        return len(self._placed) + len(self.dlq)

    def add(self, kind: str, value: dict[str, Any]) -> None:
        if kind == "aligned":
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
) -> Outputs:
    """Read aligned, late and dlq from the beginning until ``until(outputs)`` or the timeout."""
    kinds = {s.topic("aligned"): "aligned", s.topic("late"): "late", s.topic("dlq"): "dlq"}
    out = Outputs()

    def handle(m: ConsumerRecord) -> None:
        if keys is not None and m.key not in keys:
            return
        kind = kinds[m.topic]
        value = decode_map(m.value)
        out.add(kind, value)
        if kind == "aligned" and on_window is not None:
            on_window(value)

    await consume(s, kinds, handle, until=lambda: until(out), timeout_s=timeout_s)
    return out
