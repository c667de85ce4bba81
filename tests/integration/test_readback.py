"""The takeover read-back (``app/runtime/outputs.py``) finds its start by time.

After a rebalance the aligner reads what ``mm.aligned`` and ``mm.late`` already hold
for its new partitions from a moment on (``offsets_for_times``). Apache Kafka looks
the offset up by the records' timestamps; the embedded broker answers with the log's
start, so the read covers the whole partition there: correct (the extra windows are
older than any replay), and slower as the outputs grow (docs/broker.md).
"""

from __future__ import annotations

import msgpack
import pytest

from app.kafka.clients import make_producer
from app.kafka.topics import ensure_topics
from app.runtime.outputs import read_outputs
from tests.integration.brokers import ON_BOTH

pytestmark = pytest.mark.integration

#: windows written per topic and partition; the read-back asks from the middle one on
N = 40
T0_MS = 1_700_000_000_000


@ON_BOTH
async def test_read_back_starts_at_the_records_of_its_time(pipeline, request):
    s = pipeline.settings
    await ensure_topics(s, ["aligned", "late"])
    producer = make_producer(s)
    await producer.start()
    try:
        for p in (0, 1):
            for i in range(N):
                ts = T0_MS + i * 1000
                await producer.send(s.topic("aligned"), msgpack.packb(
                    {"id": f"rb-{p}@{ts}", "stream_id": f"rb-{p}", "i": i}), key=f"rb-{p}".encode(),
                    partition=p, timestamp_ms=ts)
                await producer.send(s.topic("late"), msgpack.packb({"seq": i}),
                                    key=f"rb-{p}".encode(), partition=p, timestamp_ms=ts)
        await producer.flush()
    finally:
        await producer.stop()
    since = T0_MS + (N // 2) * 1000
    back = await read_outputs(s, [0, 1], since)
    assert back.complete
    got = {p: [w["i"] for w in back.parts[p].windows] for p in (0, 1)}
    late = {p: [e["seq"] for e in back.parts[p].late] for p in (0, 1)}
    broker = request.node.callspec.params["pipeline"]
    print(f"\nread-back on {broker}: {back.records} records read for {N} windows and {N} "
          f"late events per partition, {N // 2} of each at or after the time asked, "
          f"{back.seconds * 1000:.0f} ms")
    if broker == "tansu":  # from the log start: everything, in order (docs/broker.md)
        assert got == {0: list(range(N)), 1: list(range(N))}
        assert late == got and back.records == 4 * N
    else:  # by the records' timestamps: exactly those at or after `since`
        assert got == {0: list(range(N // 2, N)), 1: list(range(N // 2, N))}
        assert late == got and back.records == 2 * N
