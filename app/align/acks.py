"""Acking a partition's records in offset order only (pure; no Faust import).

Faust commits the first run of consecutive acked offsets of a partition. When
nothing has been committed on it yet (a new topic, or a partition whose first
commit has not happened), it does not check that this run starts where
consumption started: with offsets 0-9 held in an open window and 10-30 acked,
it commits 31, and a crash then loses 0-9 (seen in tests/integration/
test_scaling.py: records that reached ``mm.features`` and came out nowhere).
The aligner finishes records out of order (windows of different streams close
at different times), so it acks through this: an offset is released only once it
and every earlier offset of its partition are done.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

__all__ = ["OrderedAcks"]


class OrderedAcks:
    """Per partition, offsets in arrival order; releases the done prefix."""

    def __init__(self) -> None:
        #: partition -> offset -> done
        self._q: dict[int, OrderedDict[int, bool]] = {}

    def hold(self, partition: int, offset: int) -> None:
        self._q.setdefault(partition, OrderedDict())[offset] = False

    def done(self, partition: int, offset: int) -> list[int]:
        """Mark one offset done; returns the offsets at the head that may now be acked,
        in order (empty while an earlier one is still open)."""
        q = self._q.get(partition)
        if q is None or offset not in q:
            return []
        q[offset] = True
        out: list[int] = []
        while q:
            first, is_done = next(iter(q.items()))
            if not is_done:
                break
            q.popitem(last=False)
            out.append(first)
        return out

    def drop(self, partitions: Iterable[int]) -> None:
        """Forget revoked partitions: their offsets are no longer ours to ack."""
        for p in partitions:
            self._q.pop(p, None)

    def waiting(self) -> int:
        """Offsets held: not done, or done behind one that is not."""
        return sum(len(q) for q in self._q.values())
