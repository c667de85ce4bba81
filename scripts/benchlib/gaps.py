"""Several producers append to one partition while a consumer tails it: which offsets did
the tail skip? (Tansu 0.6.0 can answer a fetch with a batch past the one asked while
another producer's batch is being appended: app/kafka/gapguard.py, docs/broker.md.)

Shared by ``tests/integration/test_fetch_gaps.py`` (asserts none, guarded) and
``scripts/bench_fetch_gaps.py`` (counts them with and without the guard).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from aiokafka import TopicPartition

from app.kafka import gapguard
from app.kafka.clients import make_consumer, make_producer
from app.settings import Settings

__all__ = ["TailRun", "tail_run"]


@dataclass(frozen=True)
class TailRun:
    #: records the producers sent, and the offsets the tail took, in order
    sent: int
    seen: list[int]
    #: the guard's counts over the run: fetches made again, holes taken as real
    refetched: int
    accepted: int

    @property
    def skipped(self) -> list[int]:
        """Offsets the tail stepped over (every one of them is in the log: it ends at
        ``sent - 1`` and has no hole of its own)."""
        return [o for a, b in zip(self.seen, self.seen[1:], strict=False)
                for o in range(a + 1, b)]


async def _produce(s: Settings, topic: str, i: int, stop: asyncio.Event) -> int:
    producer = make_producer(s, linger_ms=0)
    await producer.start()
    n = sent = 0
    try:
        while not stop.is_set():
            # batches of 1 to 8 records, as the feature agents and their marks send
            futs = [await producer.send(topic, b"%d-%d-%d" % (i, n, k), partition=0)
                    for k in range(1 + n % 8)]
            await asyncio.gather(*futs)
            sent += len(futs)
            n += 1
            await asyncio.sleep(0.002 * (i + 1))
    finally:
        await producer.stop()
    return sent


async def tail_run(s: Settings, topic: str, *, producers: int, seconds: float,
                   guard: bool = True) -> TailRun:
    """``producers`` producers write partition 0 of ``topic`` (empty, made) for
    ``seconds`` while one consumer tails it from the start; then the tail reads the rest.
    The consumer is guarded as every mmsync consumer is; ``guard=False``: not (the
    baseline), and the guard is put back after."""
    tp = TopicPartition(topic, 0)
    consumer = make_consumer(s)  # installs the guard
    if not guard:
        gapguard.uninstall()
    try:
        return await _tail(consumer, tp, s, producers, seconds)
    finally:
        gapguard.install()


async def _tail(consumer: Any, tp: TopicPartition, s: Settings, producers: int,
                seconds: float) -> TailRun:
    await consumer.start()
    consumer.assign([tp])
    await consumer.seek_to_beginning(tp)
    refetched0, accepted0 = gapguard.counts()
    stop = asyncio.Event()
    tasks = [asyncio.create_task(_produce(s, tp.topic, i, stop)) for i in range(producers)]
    seen: list[int] = []
    try:
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end:
            got = await consumer.getmany(tp, timeout_ms=50, max_records=7)
            seen += [r.offset for r in got.get(tp, [])]
        stop.set()
        sent = sum(await asyncio.gather(*tasks))
        # the rest of the log (Tansu's end offsets fall short: docs/broker.md)
        while not seen or seen[-1] < sent - 1:
            got = await consumer.getmany(tp, timeout_ms=1000)
            if not got:
                break
            seen += [r.offset for r in got.get(tp, [])]
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await consumer.stop()
    refetched, accepted = (a - b for a, b in zip(gapguard.counts(), (refetched0, accepted0),
                                                 strict=True))
    return TailRun(sent, seen, refetched, accepted)
