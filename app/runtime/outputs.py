"""Reading back what the outputs already hold for some partitions (the aligner's memory).

After a takeover the aligner asks what ``mm.aligned`` and ``mm.late`` hold for
the features partitions it was given (same keys, same partitioning: partition
q of the outputs holds the streams of features partition q), from a moment
on, so that replayed records already in an emitted window are not emitted
again (``AlignRunner.restore``). All the partitions of one rebalance are read
at once.

The start is found by time (``offsets_for_times``); a broker that cannot look
offsets up by time (the embedded one answers with the log start) makes this
read the partition from its start: correct, slower (docs/broker.md). The end
is each partition's high watermark from the fetches themselves.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from aiokafka.structs import TopicPartition

from app.errors import InvalidInputError
from app.kafka.clients import make_consumer
from app.settings import Settings
from schemas.codec import decode_map

__all__ = ["PartitionOutputs", "ReadBack", "read_outputs"]

#: A read that has not reached the end of every partition by then gives what it has, s.
_READ_TIMEOUT_S = 10.0


@dataclass
class PartitionOutputs:
    windows: list[dict[str, Any]] = field(default_factory=list)
    late: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ReadBack:
    """What one read-back found, per partition, and what it cost."""

    parts: dict[int, PartitionOutputs]
    #: records read (windows, late events, and any that did not decode)
    records: int = 0
    seconds: float = 0.0
    #: the read reached the end of every partition (False: it timed out first)
    complete: bool = True


async def read_outputs(s: Settings, partitions: list[int], since_ms: int) -> ReadBack:
    """Windows and late events of ``partitions`` with a Kafka timestamp >= ``since_ms``:
    one consumer (no group) for all of them, closed again."""
    t0 = time.perf_counter()
    kinds = {s.topic("aligned"): "windows", s.topic("late"): "late"}
    out = ReadBack(parts={p: PartitionOutputs() for p in partitions})
    c = make_consumer(s)
    await c.start()
    try:
        tps = [TopicPartition(name, p) for name in kinds for p in partitions]
        c.assign(tps)
        starts = await c.offsets_for_times(dict.fromkeys(tps, max(0, since_ms)))
        todo = set()
        for tp in tps:
            found = starts.get(tp)
            if found is not None:  # None: nothing at or after since_ms
                c.seek(tp, found.offset)
                todo.add(tp)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _READ_TIMEOUT_S
        while todo and loop.time() < deadline:
            batch = await c.getmany(*todo, timeout_ms=200)
            for tp, msgs in batch.items():
                into = getattr(out.parts[tp.partition], kinds[tp.topic])
                for m in msgs:
                    out.records += 1
                    try:
                        into.append(decode_map(m.value))
                    except InvalidInputError:
                        continue  # not a record we wrote: nothing to restore from it
            for tp in list(todo):
                end = c.highwater(tp)
                if end is not None and await c.position(tp) >= end:
                    todo.discard(tp)
        out.complete = not todo
    finally:
        await c.stop()
    out.seconds = time.perf_counter() - t0
    return out
