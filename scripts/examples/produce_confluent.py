"""Publish one stream's frames, audio and captions to mmsync with confluent-kafka.

    pip install confluent-kafka msgpack
    python scripts/examples/produce_confluent.py 127.0.0.1:9092 cam-1 a.jpg b.jpg

Each JPEG is shown for one second (5 frames), with a 440 Hz tone as 100 ms chunks of
16 kHz PCM and one caption per image. Record shapes: docs/contract.md, "Values".
"""

from __future__ import annotations

import argparse
import math
import struct
import sys
import time
from collections import Counter
from pathlib import Path

import msgpack
from confluent_kafka import KafkaException, Producer


def frame(ts_us: int, seq: int, jpeg: bytes) -> tuple[str, dict]:
    return "image", {"ts": ts_us, "seq": seq, "data": jpeg, "fmt": "jpeg"}


def audio(ts_us: int, seq: int, pcm: bytes, sr: int = 16000, ch: int = 1) -> tuple[str, dict]:
    return "audio", {"ts": ts_us, "seq": seq, "data": pcm, "sr": sr, "ch": ch}


def caption(ts_us: int, seq: int, text: str, dur_us: int) -> tuple[str, dict]:
    return "text", {"ts": ts_us, "seq": seq, "text": text, "dur": dur_us}


def publish(bootstrap: str, stream_id: str, events, prefix: str = "mm") -> Counter:
    """Send (modality, fields) events in time order; returns records per (topic, partition)."""
    producer = Producer({
        "bootstrap.servers": bootstrap,
        "acks": "all",
        # The embedded broker has no idempotent producer (docs/broker.md); on Apache
        # Kafka you may turn it on.
        "enable.idempotence": False,
        "message.max.bytes": 10 * 1024 * 1024,  # a frame may be 8 MiB plus its envelope
    })
    delivered: Counter = Counter()

    def on_delivery(err, msg) -> None:
        if err is not None:
            raise KafkaException(err)
        delivered[msg.topic(), msg.partition()] += 1

    for modality, fields in events:
        value = msgpack.packb({"v": 1, "stream_id": stream_id, **fields}, use_bin_type=True)
        # The key is the stream_id's UTF-8 bytes; any partitioner will do (docs/clients.md).
        producer.produce(f"{prefix}.{modality}", key=stream_id.encode(), value=value,
                         on_delivery=on_delivery)
        producer.poll(0)
    if producer.flush(30) > 0:
        raise KafkaException("records still undelivered after 30 s")
    return delivered


def demo_events(images: list[Path], start_us: int):
    """Five frames, ten audio chunks and one caption per image second, in time order."""
    tone = struct.pack("<1600h", *(int(8000 * math.sin(2 * math.pi * 440 * i / 16000))
                                   for i in range(1600)))
    for i, path in enumerate(images):
        t = start_us + i * 1_000_000
        yield caption(t, i, f"image {i}: {path.name}", dur_us=800_000)
        for k in range(10):
            if k % 2 == 0:
                yield frame(t + k * 100_000, i * 5 + k // 2, path.read_bytes())
            yield audio(t + k * 100_000, i * 10 + k, tone)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bootstrap", help="host:port of a broker")
    ap.add_argument("stream_id")
    ap.add_argument("images", nargs="+", type=Path, help="JPEG files")
    ap.add_argument("--prefix", default="mm", help="topic prefix (MMSYNC_TOPIC_PREFIX)")
    args = ap.parse_args(argv)
    events = demo_events(args.images, start_us=time.time_ns() // 1000)
    sent = publish(args.bootstrap, args.stream_id, events, args.prefix)
    for (topic, partition), n in sorted(sent.items()):
        print(f"{topic} partition {partition}: {n} records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
