"""app.kafka.commitguard's hold, on Faust's own commit arithmetic (no broker: the
consumer state it reads is a handful of dicts; the generation -1 guard is staged on a
real broker in tests/integration/test_broker_trouble.py)."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
from faust.transport.consumer import Consumer
from faust.types import TP
from faust.types.tuples import ConsumerMessage
from faust.utils.tracing import noop_span
from intervaltree import IntervalTree

from app.kafka import commitguard

TP0 = TP("mm.image", 4)
TP1 = TP("mm.image", 5)


@pytest.fixture(autouse=True)
def _guarded() -> None:
    commitguard.install()


def _consumer(committed: int | None, acked: list[int], generation: int = 3) -> Any:
    acks: defaultdict[TP, list[int]] = defaultdict(list)
    acks[TP0] = list(acked)
    index: defaultdict[TP, set[int]] = defaultdict(set)
    index[TP0] = set(acked)
    return SimpleNamespace(
        _acked=acks, _acked_index=index, _gap=defaultdict(IntervalTree),
        _committed_offset=defaultdict(lambda: None, {TP0: committed}),
        app=SimpleNamespace(consumer_generation_id=generation),
        ack=lambda message: pytest.fail(f"offset {message.offset} acked"))


def _event(offset: int, generation: int = 3, tp: TP = TP0) -> Any:
    msg = ConsumerMessage(tp.topic, tp.partition, offset, 0.0, 0, None, b"k", b"v", None,
                          generation_id=generation)
    msg.incref()  # as Faust's conductor does for the one stream that reads the topic
    return SimpleNamespace(message=msg)


def test_faust_commits_past_one_unacked_offset_at_the_head_unless_it_is_held() -> None:
    # 7 was consumed and never finished; 8-10 were. Faust takes the lone gap at the head
    # for a compacted offset (faust-streaming issue 606) and commits 11: 7 is lost.
    c = _consumer(committed=7, acked=[8, 9, 10])
    assert Consumer._new_offset(c, TP0) == 11
    c = _consumer(committed=7, acked=[8, 9, 10])
    assert commitguard.hold(c, [_event(7)]) == 1
    assert Consumer._new_offset(c, TP0) is None
    assert sorted(c._acked[TP0]) == [8, 9, 10]  # kept for after the generation


def test_a_hold_stops_the_commit_below_it_and_keeps_the_acks_above() -> None:
    c = _consumer(committed=7, acked=list(range(7, 12)) + [13, 14])
    commitguard.hold(c, [_event(12), _event(15)])
    assert Consumer._new_offset(c, TP0) == 12
    assert sorted(c._acked[TP0]) == [13, 14]
    c._committed_offset[TP0] = 12  # as the commit of 12 sets it
    # unguarded, Faust would commit 15 now: 12 is the lone gap at the head again
    assert Consumer._new_offset(c, TP0) is None


def test_a_hold_of_an_earlier_generation_is_ignored() -> None:
    # After a rebalance the partition is consumed again from the committed offset, which
    # the hold kept below it: the replayed record is acked anew and commits go on.
    c = _consumer(committed=7, acked=[7, 8, 9, 10], generation=4)
    commitguard.hold(c, [_event(8, generation=3)])
    assert Consumer._new_offset(c, TP0) == 11


def test_the_ack_take_events_gives_a_held_message_is_not_the_final_one() -> None:
    c = _consumer(committed=7, acked=[])
    ev = _event(7)
    commitguard.hold(c, [ev])
    assert ev.message.ack(c) is False  # the consumer's ack (which fails this test) not called
    assert not ev.message.acked


def test_no_commit_past_a_record_a_stream_holds_unacked_in_a_fresh_group() -> None:
    """A fresh group has no committed offset, and Faust checks its first run of acked
    offsets against the committed one only when there is one: offsets 0-3 still open in
    the aligner (acked once their window is emitted), 4-9 acked, and Faust commits 10,
    so a takeover starts past 0-3 (a stream's first records lost in the aligner, kafka
    fault test, 2026-12-06)."""
    c = _consumer(committed=None, acked=list(range(4, 10)))
    assert Consumer._new_offset(c, TP0) == 10
    c = _consumer(committed=None, acked=list(range(4, 10)))
    open_ = [_event(k).message for k in range(4)]  # taken by the stream, not acked
    c._unacked_messages = set(open_)
    assert Consumer._new_offset(c, TP0) is None
    assert sorted(c._acked[TP0]) == list(range(4, 10))  # kept for when 0-3 are done
    open_[0].acked = True  # acked: no longer in the unacked set either
    c._unacked_messages.discard(open_[0])
    c._acked[TP0].insert(0, 0)
    assert Consumer._new_offset(c, TP0) == 1  # up to the next record still open


def test_an_unacked_record_of_another_generation_or_partition_does_not_stop_commits() -> None:
    c = _consumer(committed=7, acked=[7, 8, 9], generation=4)
    c._unacked_messages = {_event(3, generation=3).message}  # fetched before the rebalance
    assert Consumer._new_offset(c, TP0) == 10
    c = _consumer(committed=7, acked=[7, 8, 9], generation=4)
    c._unacked_messages = {_event(3, generation=4, tp=TP1).message}  # open on another partition
    assert Consumer._new_offset(c, TP0) == 10


class _Counted(set[Any]):
    """An unacked set that counts how often it is read through."""

    reads = 0

    def __iter__(self) -> Any:
        type(self).reads += 1
        return super().__iter__()


def test_one_commit_reads_the_unacked_set_once_for_all_its_partitions() -> None:
    c = _consumer(committed=7, acked=list(range(7, 12)))
    c._acked[TP1] = [20, 21]
    c._acked_index[TP1] = {20, 21}
    c._committed_offset[TP1] = 20
    c._unacked_messages = _Counted({_event(9).message, _event(21, tp=TP1).message})
    c._new_offset = lambda tp: Consumer._new_offset(c, tp)
    c._should_commit = lambda tp, offset: True
    got = Consumer._filter_committable_offsets(c, [TP0, TP1])
    assert got == {TP0: 9, TP1: 21}  # each stops at its own open record
    assert _Counted.reads == 1
    assert "_mmsync_open_low" not in c.__dict__  # nothing kept past the commit


def _member(generation: int = 3) -> Any:
    """A consumer whose ack, revoke and assignment are Faust's own (guarded), with the
    state they touch; ``on_revoked`` stands for what the app does on a revoke."""
    c = _consumer(committed=2476, acked=[], generation=generation)
    c._acked.clear()
    c._acked_index.clear()
    c._unacked_messages = set()
    c._n_acked = 0
    c._waiting_for_ack = None
    c._read_offset = {}
    c._active_partitions = None
    c._paused_partitions = set()
    c.diag = SimpleNamespace(set_flag=lambda flag: None, unset_flag=lambda flag: None)
    c.app.topics = SimpleNamespace(acks_enabled_for=lambda topic: True)
    c.app._start_span_from_rebalancing = lambda name: noop_span()
    c.app.on_rebalance_return = lambda: None
    c._set_active_tps = lambda tps: None
    c.ack = lambda message: Consumer.ack(c, message)
    c.on_revoked = []

    async def _on_partitions_revoked(revoked: set[TP]) -> None:
        for step in c.on_revoked:
            step()

    async def _on_partitions_assigned(assigned: set[TP], generation_id: int) -> None:
        c._committed_offset.update({tp: 2476 for tp in assigned})  # Faust's seek

    c._on_partitions_revoked = _on_partitions_revoked
    c._on_partitions_assigned = _on_partitions_assigned
    return c


def _taken(c: Any, offset: int, generation: int = 3) -> Any:
    """A message of TP0 a stream took (tracked in the unacked set, as Faust does)."""
    msg = _event(offset, generation).message
    c._unacked_messages.add(msg)
    return msg


async def test_records_skipped_in_a_rebalance_are_not_committed_past_the_open_ones() -> None:
    """The scene of the CI failure (2026-12-06): the aligner holds 2476-2477 open in a
    window; 2478-2490 wait in the stream's buffer. The partition is revoked: Faust clears
    its acks and committed offset, the aligner drops its windows (the open messages leave
    the unacked set), and the stream skips the buffered records and acks them. Counted,
    those acks start from nothing and the commit timer commits 2491: whoever holds the
    partition next starts past 2476-2477."""
    c = _member()
    open_ = [_taken(c, 2476), _taken(c, 2477)]
    buffered = [_event(k).message for k in range(2478, 2491)]

    def aligner_drops() -> None:
        c._unacked_messages.difference_update(open_)

    def stream_skips() -> None:
        for msg in buffered:
            assert msg.ack(c) is False  # Faust's skip: "otherwise the lag would increase"

    c.on_revoked = [aligner_drops, stream_skips]
    await Consumer.on_partitions_revoked(c, {TP0})
    assert all(msg.acked for msg in buffered)  # done with: nothing waits for them
    assert not c._acked[TP0] and Consumer._new_offset(c, TP0) is None
    # what the acks would have made of it, unguarded (Faust's own arithmetic)
    bare = _consumer(committed=None, acked=list(range(2478, 2491)))
    assert Consumer._new_offset(bare, TP0) == 2491


async def test_after_the_assignment_acks_of_the_new_generation_count_and_old_ones_do_not() -> None:
    c = _member()
    late = _taken(c, 2480)  # taken before the rebalance, finished after it
    await Consumer.on_partitions_revoked(c, {TP0})
    c.app.consumer_generation_id = 4  # aiokafka's listener sets it, then assigns
    await Consumer.on_partitions_assigned(c, {TP0}, 4)
    assert late.ack(c) is False and not c._acked[TP0]
    replayed = [_taken(c, k, generation=4) for k in (2476, 2477)]
    assert all(msg.ack(c) for msg in replayed)
    assert Consumer._new_offset(c, TP0) == 2478


async def test_a_revoke_of_one_partition_leaves_the_acks_of_another_counted() -> None:
    c = _member()
    await Consumer.on_partitions_revoked(c, {TP1})
    msg = _taken(c, 2476)
    assert msg.ack(c) is True
    assert Consumer._new_offset(c, TP0) == 2477
