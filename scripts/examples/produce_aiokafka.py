"""Publish captions (or any mmsync input events) with aiokafka, one a second.

    pip install aiokafka msgpack
    python scripts/examples/produce_aiokafka.py 127.0.0.1:9092 chat-1 "hello" "你好"

Record shapes: docs/contract.md, "Values".
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter

import msgpack
from aiokafka import AIOKafkaProducer


async def publish(bootstrap: str, stream_id: str, events, prefix: str = "mm") -> Counter:
    """Send (modality, fields) events in time order; returns records per (topic, partition)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                max_request_size=10 * 1024 * 1024)  # 8 MiB frames fit
    delivered: Counter = Counter()
    await producer.start()
    try:
        sends = []
        for modality, fields in events:
            value = msgpack.packb({"v": 1, "stream_id": stream_id, **fields}, use_bin_type=True)
            # The key is the stream_id's UTF-8 bytes; any partitioner will do (docs/clients.md).
            sends.append(await producer.send(f"{prefix}.{modality}", value=value,
                                             key=stream_id.encode()))
        for sent in sends:  # each resolves once the broker has the record (acks=all)
            meta = await sent
            delivered[meta.topic, meta.partition] += 1
    finally:
        await producer.stop()
    return delivered


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bootstrap", help="host:port of a broker")
    ap.add_argument("stream_id")
    ap.add_argument("lines", nargs="+", help="one caption each, a second apart")
    ap.add_argument("--prefix", default="mm", help="topic prefix (MMSYNC_TOPIC_PREFIX)")
    args = ap.parse_args(argv)
    start_us = time.time_ns() // 1000
    events = [("text", {"ts": start_us + i * 1_000_000, "seq": i, "text": line,
                        "dur": 900_000}) for i, line in enumerate(args.lines)]
    sent = asyncio.run(publish(args.bootstrap, args.stream_id, events, args.prefix))
    for (topic, partition), n in sorted(sent.items()):
        print(f"{topic} partition {partition}: {n} records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
