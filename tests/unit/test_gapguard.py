"""app.kafka.gapguard: a fetch answered with a batch past the position asked is fetched
again, not taken as a hole, until the hole has lasted CONFIRM_S. Played through aiokafka's
own record batches and ``PartitionRecords`` (what its fetcher builds from a response)."""

from __future__ import annotations

import logging
import struct

import pytest
from aiokafka import TopicPartition
from aiokafka.consumer import fetcher
from aiokafka.record.default_records import DefaultRecordBatchBuilder, _DefaultRecordBatchPy
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.record.util import calc_crc32c

from app.kafka import gapguard
from app.kafka.clients import make_consumer
from app.runtime.faust_app import make_app
from app.settings import Settings

TP = TopicPartition("mm.features", 7)
SKEW = TopicPartition("mm.skew", 0)


def _batch(base: int, n: int, *, control: bool = False) -> bytes:
    """A record batch of ``n`` records at offsets ``base``...: built as a producer does
    (base offset 0), the base offset then written as the broker does (outside the CRC)."""
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=int(control),
                                  producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                  batch_size=1 << 20)
    for i in range(n):
        b.append(i, timestamp=1_700_000_000_000 + i, key=b"k", value=b"v%d" % i, headers=[])
    buf = bytearray(b.build())
    struct.pack_into(">q", buf, 0, base)
    if control:  # a transaction marker: the control bit, and the CRC over it again
        at = _DefaultRecordBatchPy.ATTRIBUTES_OFFSET
        attrs = struct.unpack_from(">h", buf, at)[0] | _DefaultRecordBatchPy.CONTROL_MASK
        struct.pack_into(">h", buf, at, attrs)
        struct.pack_into(">I", buf, _DefaultRecordBatchPy.CRC_OFFSET, calc_crc32c(buf[at:]))
    return bytes(buf)


def _fetch(tp: TopicPartition, position: int, *batches: bytes) -> tuple[list[int], int]:
    """The offsets a consumer at ``position`` takes from a response holding ``batches``,
    and its position after (aiokafka sets it to ``next_fetch_offset``)."""
    records = fetcher.PartitionRecords(tp, MemoryRecords(b"".join(batches)), None, position,
                                       None, None, True, 0)
    return [r.offset for r in records], records.next_fetch_offset


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    """A judge on a clock the test moves, and the guard in place with ``mm.skew`` exempt
    (both put back after the test)."""
    c = _Clock()
    monkeypatch.setattr(gapguard, "_JUDGE", gapguard.GapJudge(clock=c))
    monkeypatch.setattr(gapguard, "_EXEMPT", {"mm.skew"})
    monkeypatch.setattr(fetcher, "PartitionRecords", gapguard._GuardedPartitionRecords)
    return c


def test_install_puts_the_check_where_aiokafkas_fetcher_builds_its_batches(monkeypatch):
    monkeypatch.setattr(fetcher, "PartitionRecords", gapguard._Base)
    monkeypatch.setattr(gapguard, "_EXEMPT", set())
    gapguard.install(["a.skew"])
    gapguard.install(["b.skew"])  # idempotent; the names add up
    assert fetcher.PartitionRecords is gapguard._GuardedPartitionRecords
    assert fetcher.PartitionRecords.__mro__[1] is gapguard._Base
    assert gapguard._Base.__module__ == "aiokafka.consumer.fetcher"
    assert gapguard._EXEMPT == {"a.skew", "b.skew"}


async def test_a_worker_and_the_clients_install_it_with_the_compacted_topic_exempt(
        tmp_path, monkeypatch):
    monkeypatch.setattr(gapguard, "_EXEMPT", set())
    monkeypatch.setattr(fetcher, "PartitionRecords", gapguard._Base)
    s = Settings(data_dir=tmp_path, broker="kafka://127.0.0.1:9", topic_prefix="gg")
    make_app(s)  # the worker's Faust app: its consumer is aiokafka's
    assert fetcher.PartitionRecords is gapguard._GuardedPartitionRecords
    assert gapguard._EXEMPT == {"gg.skew"}
    monkeypatch.setattr(gapguard, "_EXEMPT", set())
    monkeypatch.setattr(fetcher, "PartitionRecords", gapguard._Base)
    consumer = make_consumer(s)  # the read-back, mmsync tail, the benchmarks', tests' readers
    await consumer.stop()  # never started: only closes what the constructor made
    assert fetcher.PartitionRecords is gapguard._GuardedPartitionRecords
    assert gapguard._EXEMPT == {"gg.skew"}


def test_a_later_batch_ends_the_fetch_and_the_position_stays(clock):
    # Tansu, seen: the batch 925-928 of another producer not there yet, 929-930 is
    got, pos = _fetch(TP, 917, _batch(917, 8), _batch(929, 2))
    assert (got, pos) == (list(range(917, 925)), 925)
    got, pos = _fetch(TP, 925, _batch(929, 2))  # the next fetch, at once: the same
    assert (got, pos) == ([], 925)
    got, pos = _fetch(TP, 925, _batch(925, 4), _batch(929, 2))  # there now
    assert (got, pos) == (list(range(925, 931)), 931)
    assert (gapguard._JUDGE.refetched, gapguard._JUDGE.accepted) == (2, 0)


def test_a_hole_that_lasts_is_taken_with_a_warning(clock, caplog):
    caplog.set_level(logging.INFO, logger=gapguard.__name__)
    assert _fetch(TP, 10, _batch(14, 3)) == ([], 10)
    clock.now += gapguard.CONFIRM_S / 2
    assert _fetch(TP, 10, _batch(14, 3)) == ([], 10)
    clock.now += gapguard.CONFIRM_S / 2
    assert _fetch(TP, 10, _batch(14, 3)) == ([14, 15, 16], 17)
    assert (gapguard._JUDGE.refetched, gapguard._JUDGE.accepted) == (2, 1)
    assert "offsets 10-13 taken as a hole" in caplog.text
    # a new hole is timed from its own first sight
    assert _fetch(TP, 17, _batch(20, 1)) == ([], 17)


def test_no_hole_no_refetch(clock):
    # a fetch inside a batch (the broker returns the whole batch), batches back to back
    assert _fetch(TP, 2, _batch(0, 4), _batch(4, 2)) == ([2, 3, 4, 5], 6)
    # a transaction marker is a batch of its own: no hole after it
    assert _fetch(TP, 0, _batch(0, 2), _batch(2, 1, control=True), _batch(3, 2)) == (
        [0, 1, 3, 4], 5)
    assert gapguard._JUDGE.refetched == 0


def test_a_compacted_topic_keeps_its_holes(clock):
    assert _fetch(SKEW, 0, _batch(0, 1), _batch(5, 1)) == ([0, 5], 6)
    assert gapguard._JUDGE.refetched == 0


def test_the_judge_forgets_a_hole_once_filled():
    c = _Clock()
    judge = gapguard.GapJudge(confirm_s=1.0, clock=c)
    assert not judge.take(TP, 10, 14)
    assert judge.take(TP, 10, 10)
    c.now += 5
    assert not judge.take(TP, 10, 14)  # a hole again, timed afresh
    assert not judge.take(TopicPartition("mm.features", 0), 3, 4)  # per partition
