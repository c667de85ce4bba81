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
