"""app.kafka.fetchguard: when Faust seeks back to the committed offsets, a partition with
none is sought to its log start too (aiokafka's own seek leaves it where its fetch was)."""

from __future__ import annotations

from types import SimpleNamespace

from aiokafka import TopicPartition
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

from app.kafka import fetchguard

DONE, FRESH, ZERO, GONE = (TopicPartition("mm.features", p) for p in range(4))


class _Consumer:
    """An aiokafka consumer as far as the seek reads it: committed offsets as
    ``seek_to_committed`` returns them, and the seeks made."""

    def __init__(self, committed: dict, assigned: set) -> None:
        self.committed, self.to_start = committed, []
        self._subscription = SimpleNamespace(assigned_partitions=lambda: assigned)

    async def seek_to_committed(self) -> dict:
        return self.committed

    async def seek_to_beginning(self, *tps: TopicPartition) -> bool:
        self.to_start.extend(tps)
        return True


async def test_a_partition_with_no_commit_goes_back_to_its_start() -> None:
    """The CI scene (docs/broker.md): records 0-43 fetched while the flow was stopped for a
    rebalance were discarded and the seek back did not move their partition (nothing
    committed on it), so the aligner's first record after the rebalance was offset 44."""
    c = _Consumer({DONE: 120, FRESH: None, ZERO: 0, GONE: None}, {DONE, FRESH, ZERO})
    got = await fetchguard.seek_to_committed_or_start(c)
    assert got == c.committed  # what Faust reads (its read offsets and committed offsets)
    # committed above 0: aiokafka's seek already moved it; revoked meanwhile: not ours
    assert sorted(c.to_start) == [FRESH, ZERO]


async def test_every_partition_committed_seeks_nothing_more() -> None:
    c = _Consumer({DONE: 5, FRESH: 1}, {DONE, FRESH})
    await fetchguard.seek_to_committed_or_start(c)
    assert c.to_start == []


async def test_install_routes_faust_through_it_once() -> None:
    fetchguard.install()
    seek = AIOKafkaConsumerThread.seek_to_committed
    fetchguard.install()
    assert AIOKafkaConsumerThread.seek_to_committed is seek
    assert getattr(seek, fetchguard._MARK)
    c = _Consumer({FRESH: None}, {FRESH})

    async def call_thread(fun, *args):  # Faust runs it in the consumer's thread
        return await fun(*args)

    thread = SimpleNamespace(call_thread=call_thread, _ensure_consumer=lambda: c)
    assert await seek(thread) == {FRESH: None}  # type: ignore[arg-type]
    assert c.to_start == [FRESH]
