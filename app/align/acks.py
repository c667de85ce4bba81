"""Acking a partition's records in offset order only (pure; no Faust import).

Faust commits the first run of consecutive acked offsets of a partition. When
nothing has been committed on it yet (a new topic, or a partition whose first
commit has not happened), it does not check that this run starts where
consumption started: with offsets 0-9 held in an open window and 10-30 acked,
it commits 31, and a crash then loses 0-9 (seen in tests/integration/
test_scaling.py: records that reached ``mm.features`` and came out nowhere).
The aligner finishes records out of order (windows of different streams close
at different times), so it acks through this: an event is acked only once it
and every earlier event of its partition are done.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, Protocol

__all__ = ["OrderedAcks"]


class _Ackable(Protocol):
    def ack(self) -> Any: ...


class OrderedAcks:
    """Per partition, events in arrival (offset) order; acks the done prefix."""

    def __init__(self) -> None:
        self._q: dict[int, OrderedDict[int, list[Any]]] = {}

    def hold(self, partition: int, offset: int, event: _Ackable) -> None:
        self._q.setdefault(partition, OrderedDict())[offset] = [event, False]

    def done(self, partition: int, offset: int) -> int:
        """Mark one event done; ack every done event at the head. Returns how many."""
        q = self._q.get(partition)
        if q is None or offset not in q:
            return 0
        q[offset][1] = True
        n = 0
        while q:
            first = next(iter(q.values()))
            if not first[1]:
                break
            q.popitem(last=False)
            first[0].ack()
            n += 1
        return n

    def drop(self, partitions: Iterable[int]) -> None:
        """Forget revoked partitions: their events are no longer ours to ack."""
        for p in partitions:
            self._q.pop(p, None)

    def waiting(self) -> int:
        """Events held: not done, or done behind one that is not."""
        return sum(len(q) for q in self._q.values())
