"""Reading the output topics and checking the contract's accounting."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.kafka import make_consumer
from app.settings import Settings
from schemas.aligned import window_id
from schemas.codec import decode_map

__all__ = ["Outputs", "collect"]


@dataclass
class Outputs:
    windows: list[dict[str, Any]] = field(default_factory=list)
    late: list[dict[str, Any]] = field(default_factory=list)
    dlq: list[dict[str, Any]] = field(default_factory=list)
    #: window ids seen more than once (a replay after a crash); not counted twice.
    duplicate_windows: int = 0
    #: late events and dead letters seen again (replayed after a crash).
    duplicate_other: int = 0
    _ids: set[Any] = field(default_factory=set)

    def merged(self, modality: str | None = None) -> int:
        return sum(v for w in self.windows for m, v in w["counts"].items()
                   if modality is None or m == modality)

    @property
    def accounted(self) -> int:
        return self.merged() + len(self.late) + len(self.dlq)

    def add(self, kind: str, value: dict[str, Any]) -> None:
        if kind == "aligned":
            wid = value.get("id") or window_id(value["stream_id"], value["window_start"])
            if wid in self._ids:
                self.duplicate_windows += 1
                return
            self._ids.add(wid)
            self.windows.append(value)
        elif kind == "late":
            if self._seen(("late", value.get("stream_id"), value.get("modality"),
                           *(value.get("src") or ()))):
                return
            self.late.append(value)
        else:
            if self._seen(("dlq", value.get("source_topic"), value.get("partition"),
                           value.get("offset"))):
                return
            self.dlq.append(value)

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
    consumer = make_consumer(s, *kinds)
    out = Outputs()
    await consumer.start()
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not until(out) and loop.time() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            for tp, msgs in batch.items():
                for m in msgs:
                    if keys is not None and m.key not in keys:
                        continue
                    kind = kinds[tp.topic]
                    value = decode_map(m.value)
                    out.add(kind, value)
                    if kind == "aligned" and on_window is not None:
                        on_window(value)
    finally:
        await consumer.stop()
    return out
