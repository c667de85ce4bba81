"""Producers in other clients, run exactly as docs/clients.md shows them.

confluent-kafka (librdkafka) partitions a keyed record by CRC32 of its key, aiokafka and
Faust by murmur2: the same stream_id can land on different partition numbers. The
feature agents re-key every feature record by stream_id before the aligner, so inputs
need not be co-partitioned: one stream here has its frames from aiokafka and its audio
and captions from confluent-kafka, on different partitions, and still comes out merged.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import re
import shutil
import subprocess
import sys
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg

from app.clients.collect import collect
from app.kafka.clients import consume, default_partition
from app.kafka.topics import ensure_topics
from app.settings import MODALITIES
from schemas.events import TextEvent, encode_event
from tests.integration.brokers import ON_BOTH

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(importlib.util.find_spec("confluent_kafka") is None,
                       reason="confluent-kafka is an optional dev dependency (pip install "
                              "-e '.[dev]')"),
]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "scripts" / "examples"
_LINE = re.compile(r"^(\S+) partition (\d+): (\d+) records$", re.M)


def _crc32_partition(key: str, n: int) -> int:
    """librdkafka's default (``consistent_random``) for a keyed record."""
    return zlib.crc32(key.encode()) % n


def _murmur2(key: str, n: int) -> int:
    """aiokafka's and Faust's default (Java client compatible)."""
    return default_partition(key.encode(), n)


def _jpegs(tmp: Path, n: int) -> list[Path]:
    """n frames that differ (one scene change per second, as the example shows them)."""
    out = []
    rng = np.random.default_rng(3)
    for i in range(n):
        img = np.full((48, 64, 3), 40 + 60 * i, dtype=np.uint8)
        img[:24, :32, i % 3] = 250
        img = np.clip(img + rng.integers(0, 4, img.shape), 0, 255).astype(np.uint8)
        p = tmp / f"shot{i}.jpg"
        p.write_bytes(simplejpeg.encode_jpeg(img, quality=85))
        out.append(p)
    return out


def _run(script: str, *args: str) -> Counter[tuple[str, int]]:
    """Run an example as its docstring says; its per-partition report, parsed."""
    res = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True,
                         text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    sent = Counter({(t, int(p)): int(n) for t, p, n in _LINE.findall(res.stdout)})
    assert sent, res.stdout
    return sent


async def _features(s, total: int) -> list[tuple[bytes, int, str, int]]:
    """(key, partition, modality, input partition) of the feature records on ``mm.features``."""
    from schemas.features import FeatureRecord, decode_features

    out: list[tuple[bytes, int, str, int]] = []

    def handle(m: Any) -> None:
        rec = decode_features(m.value)
        if isinstance(rec, FeatureRecord):  # progress marks are not features
            out.append((m.key, m.partition, rec.modality, rec.src_partition))

    await consume(s, [s.topic("features")], handle, until=lambda: len(out) >= total,
                  timeout_s=30)
    return out


@ON_BOTH
async def test_confluent_and_aiokafka_producers_every_input_merged(pipeline, tmp_path):
    s = pipeline.settings
    n = s.partitions
    await ensure_topics(s)
    # The image (reference) modality of the mixed stream arrives from another client a
    # moment after its audio: idle_ms long enough that the aligner waits for it.
    worker = pipeline.start_worker(MMSYNC_MODELS="light", MMSYNC_IDLE_MS="6000")
    shots = _jpegs(tmp_path, 3)
    expected: dict[str, int] = {}

    # 1. The confluent-kafka example, as docs/clients.md runs it, three streams.
    for sid in ("cam-1", "cam-2", "cam-3"):
        sent = _run("produce_confluent.py", s.bootstrap, sid, *map(str, shots),
                    "--prefix", s.topic_prefix)
        assert {t for t, _ in sent} == {s.topic(m) for m in MODALITIES}
        assert {p for _, p in sent} == {_crc32_partition(sid, n)}, sent
        expected[sid] = sum(sent.values())
    assert any(_crc32_partition(sid, n) != _murmur2(sid, n) for sid in expected)

    # 2. The aiokafka example, as docs/clients.md runs it: captions only.
    sent = _run("produce_aiokafka.py", s.bootstrap, "chat-1", "hello", "你好", "再见",
                "--prefix", s.topic_prefix)
    assert set(sent) == {(s.topic("text"), _murmur2("chat-1", n))}
    expected["chat-1"] = sum(sent.values())

    # 3. One stream from both clients: frames through aiokafka, audio and captions
    #    through confluent-kafka, so its inputs sit on different partition numbers.
    sys.path.insert(0, str(EXAMPLES))
    try:
        ck = importlib.import_module("produce_confluent")
        ak = importlib.import_module("produce_aiokafka")
    finally:
        sys.path.remove(str(EXAMPLES))
    sid = "mix-0"
    assert _crc32_partition(sid, n) != _murmur2(sid, n)
    events = list(ck.demo_events(shots, start_us=2_000_000_000))
    frames = [e for e in events if e[0] == "image"]
    rest = [e for e in events if e[0] != "image"]
    by_confluent = await asyncio.to_thread(ck.publish, s.bootstrap, sid, rest, s.topic_prefix)
    by_aiokafka = await ak.publish(s.bootstrap, sid, frames, s.topic_prefix)
    assert set(by_confluent) == {(s.topic(m), _crc32_partition(sid, n)) for m in ("audio",
                                                                                  "text")}
    assert set(by_aiokafka) == {(s.topic("image"), _murmur2(sid, n))}
    expected[sid] = sum(by_confluent.values()) + sum(by_aiokafka.values())

    total = sum(expected.values())
    out = await collect(s, until=lambda o: o.accounted >= total, timeout_s=120)
    assert out.accounted == total, pipeline.logs()
    assert not out.dlq and not out.late, (out.dlq[:3], out.late[:3])
    merged = Counter()
    for w in out.windows:
        merged[w["stream_id"]] += sum(w["counts"].values())
    assert merged == expected
    assert out.duplicate_windows == out.duplicate_records == 0
    assert worker.poll() is None

    # Why it works with any number of workers: every feature record is keyed by its
    # stream_id and lands on that key's murmur2 partition, whatever its input's partition.
    feats = await _features(s, total)
    assert len(feats) == total
    assert all(p == _murmur2(key.decode(), n) for key, p, _, _ in feats)
    assert {(m, p) for k, _, m, p in feats if k == sid.encode()} == {
        ("image", _murmur2(sid, n)), ("audio", _crc32_partition(sid, n)),
        ("text", _crc32_partition(sid, n))}
    print(f"\nclients: {total} inputs in {len(expected)} streams, all merged once: "
          f"{dict(expected)}; {sid}: image on partition {_murmur2(sid, n)}, "
          f"audio and text on {_crc32_partition(sid, n)}")


@pytest.mark.skipif(shutil.which("kcat") is None,
                    reason="kcat is not on PATH (Debian and Ubuntu: apt-get install kcat); "
                           "the one client here that does not come from PyPI")
@pytest.mark.parametrize("pipeline", ["kafka"], indirect=True)
async def test_kcat_produces_captions_and_reads_the_windows_on_kafka(pipeline, tmp_path):
    """kcat 1.7.1 as Debian ships it (librdkafka 2.0.2), as docs/clients.md shows it: one
    file per record (a msgpack caption) with its stream_id as key, then the windows read
    back. Apache Kafka only: kcat cannot read the embedded broker's metadata
    (docs/broker.md)."""
    s = pipeline.settings
    await ensure_topics(s)
    # every agent, not just text: the aligner holds a window for a modality whose agent
    # sends no progress marks for up to MMSYNC_MAX_HOLD_MS (30 s), on any broker
    worker = pipeline.start_worker(MMSYNC_MODELS="light")
    files = []
    for i, text in enumerate(["hello from kcat", "你好", "goodbye"]):
        f = tmp_path / f"caption{i}.msgpack"
        f.write_bytes(encode_event(TextEvent(stream_id="kcat-1", ts=3_000_000_000 + i * 400_000,
                                             seq=i, text=text, dur=300_000)))
        files.append(str(f))
    t0 = time.monotonic()
    res = subprocess.run(["kcat", "-P", "-b", s.bootstrap, "-t", s.topic("text"), "-k",
                          "kcat-1", *files], capture_output=True, text=True, timeout=60,
                         check=False)
    assert res.returncode == 0, res.stderr
    t_sent = time.monotonic()
    out = await collect(s, until=lambda o: o.accounted >= len(files), timeout_s=90)
    t_out = time.monotonic()
    assert out.accounted == out.merged("text") == len(files), pipeline.logs()
    assert not out.dlq and not out.late
    # and kcat reads them back: each window's key is its stream_id
    res = subprocess.run(["kcat", "-C", "-b", s.bootstrap, "-t", s.topic("aligned"), "-o",
                          "beginning", "-e", "-q", "-f", "%k\\n"], capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    print(f"\nkcat: produce {t_sent - t0:.1f} s, windows out {t_out - t_sent:.1f} s later, "
          f"read back by kcat in {time.monotonic() - t_out:.1f} s")
    keys = res.stdout.split()
    assert keys and set(keys) == {"kcat-1"} and len(keys) >= len(out.windows), res.stdout
    assert worker.poll() is None
