"""No record skipped when a broker answers a fetch with a later batch than the one asked.

Tansu 0.6.0 (the embedded broker) can do that while several producers append to one
partition: a fetch at offset 925 returned the batch at 929, and the batch 925-928,
written by another producer at the same moment, was in the log when read later. aiokafka
takes the later batch as a hole in the log (compaction makes such holes) and moves its
position past it; Faust then counts the hole as done. ``mm.features`` is written by the
feature agents of every worker and by their progress marks at once, so the aligner
skipped such batches: four frames of a stream "lost in the aligner" in the join/leave
fault test (2026-12-07, a loop of it with each fetch logged); the single inputs lost so
in two CI runs before that fit it too (not shown). A tailing aiokafka consumer beside
three producers on one Tansu partition skipped 4 to 20 of about 47,000 offsets in each
of 3 runs of 20 s; on Apache Kafka 3.9.2 it skipped none (docs/broker.md has the account
and the commands).

:func:`install` makes every aiokafka consumer of the process check each fetched batch of
a topic that is not compacted: a batch that starts past the position asked is not
taken. The fetch ends there, the position stays, and the partition is fetched again:
the batch written in between is normally there by then. A hole still there after
:data:`CONFIRM_S` of fetches (a record deleted or compacted away, which these topics do
not do; never seen) is taken as real, with a warning that names the offsets skipped.
Control batches (transaction markers) are batches too, so they leave no hole.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from aiokafka.consumer import fetcher
from aiokafka.structs import TopicPartition

__all__ = ["CONFIRM_S", "GapJudge", "counts", "install", "uninstall"]

log = logging.getLogger(__name__)

#: How long a hole must last (fetched again all along, with no pause: a real hole costs
#: this much busy fetching once) before it is taken as real, s. No hole on Tansu lasted
#: that long in the runs of docs/broker.md.
CONFIRM_S = 1.0


class GapJudge:
    """Whether to take a fetched batch that starts past the offset expected (pure)."""

    def __init__(self, confirm_s: float = CONFIRM_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.confirm_s = confirm_s
        self._clock = clock
        #: partition -> (offset expected, first offset found, when first found)
        self._open: dict[TopicPartition, tuple[int, int, float]] = {}
        #: fetches not taken for a hole, and holes taken as real
        self.refetched = 0
        self.accepted = 0
        self._lock = threading.Lock()  # consumers of several threads share one judge

    def take(self, tp: TopicPartition, expected: int, found: int) -> bool:
        """A batch of ``tp`` starting at ``found`` where ``expected`` was asked: True to
        take it (no hole, or a hole seen for :attr:`confirm_s`), False to fetch again."""
        if found <= expected:  # the common case: no lock unless a hole was open
            if tp in self._open:
                with self._lock:
                    self._open.pop(tp, None)
            return True
        now = self._clock()
        with self._lock:
            seen = self._open.get(tp)
            if seen is not None and seen[0] == expected and now - seen[2] >= self.confirm_s:
                del self._open[tp]
                self.accepted += 1
            else:
                if seen is None or seen[0] != expected:
                    self._open[tp] = (expected, found, now)
                self.refetched += 1
        if seen is None or seen[0] != expected:
            log.info("%s[%d]: the broker answered a fetch at offset %d with offset %d: "
                     "fetched again", tp.topic, tp.partition, expected, found)
            return False
        if now - seen[2] < self.confirm_s:
            return False
        log.warning("%s[%d]: the broker answers a fetch at offset %d with offset %d after "
                    "%.1f s of fetching again: offsets %d-%d taken as a hole in the log",
                    tp.topic, tp.partition, expected, found, now - seen[2], expected,
                    found - 1)
        return True


_JUDGE = GapJudge()
#: topics whose holes are real: compacted ones (app.kafka.clients.COMPACTED_TOPICS)
_EXEMPT: set[str] = set()


def counts() -> tuple[int, int]:
    """(fetches not taken for a hole, holes taken as real) in this process so far."""
    return _JUDGE.refetched, _JUDGE.accepted


class _Checked:
    """A fetch's record batches, ended before the first one that leaves a hole."""

    __slots__ = ("_inner", "_owner", "_pending", "_stopped")

    def __init__(self, inner: Any, owner: Any) -> None:
        self._inner = inner
        self._owner = owner  # the PartitionRecords: its next_fetch_offset is the position
        self._pending: Any = None
        self._stopped = False

    def has_next(self) -> bool:
        if self._pending is not None:
            return True
        if self._stopped or not self._inner.has_next():
            return False
        batch = self._inner.next_batch()
        if batch is None:
            return False
        owner = self._owner
        if not _JUDGE.take(owner._tp, owner.next_fetch_offset, batch.base_offset):
            # aiokafka sets the position to next_fetch_offset, unchanged: fetched again
            self._stopped = True
            return False
        self._pending = batch
        return True

    def next_batch(self) -> Any:
        if not self.has_next():
            return None
        batch, self._pending = self._pending, None
        return batch

    def size_in_bytes(self) -> int:
        return int(self._inner.size_in_bytes())


_Base: Any = fetcher.PartitionRecords


class _GuardedPartitionRecords(_Base):
    def __init__(self, tp: TopicPartition, records: Any, *args: Any, **kwargs: Any) -> None:
        if tp.topic not in _EXEMPT:
            records = _Checked(records, self)
        super().__init__(tp, records, *args, **kwargs)


def install(compacted: Iterable[str] = ()) -> None:
    """Check the batches of every aiokafka consumer of this process (Faust's included),
    except those of the ``compacted`` topics (full names), whose holes are real
    (idempotent; the names add up)."""
    _EXEMPT.update(compacted)
    fetcher.PartitionRecords = _GuardedPartitionRecords


def uninstall() -> None:
    """aiokafka's own ``PartitionRecords`` back, for every consumer of the process from its
    next fetch: what ``scripts/bench_fetch_gaps.py`` measures against. Nothing in mmsync
    calls it, and the next :func:`install` (every ``make_consumer``) guards again."""
    fetcher.PartitionRecords = _Base
