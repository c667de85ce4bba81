"""Real events through a real broker and a real worker to aligned windows: the embedded
broker and Apache Kafka (as production runs it, and with its own defaults)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter

import msgpack
import pytest
from aiokafka.structs import ConsumerRecord

from app.clients.collect import collect
from app.clients.produce import publish
from app.clients.synth import SynthSpec, synth_records
from app.kafka.clients import consume
from app.kafka.topics import ensure_topics
from schemas.events import TextEvent, encode_event
from schemas.features import ProgressMark, decode_features
from tests.integration.brokers import ON_BOTH, ON_EVERY

pytestmark = pytest.mark.integration

TIMEOUT = 90


@ON_EVERY
async def test_multimodal_stream_every_input_accounted(pipeline):
    s = pipeline.settings
    await ensure_topics(s)
    pipeline.start_worker()
    specs = [SynthSpec(stream_id="cam-a", seconds=4, seed=3),
             SynthSpec(stream_id="cam-b", seconds=4, seed=4, sr=22050, ch=2)]
    recs = list(synth_records(specs))
    recs.insert(10, ("image", b"cam-a", os.urandom(100)))
    recs.insert(20, ("text", b"cam-b", msgpack.packb({"v": 1, "stream_id": "cam-b"})))
    recs.insert(30, ("audio", b"cam-a", msgpack.packb(
        {"v": 1, "stream_id": "cam-a", "ts": 5, "data": b"\0" * 3, "sr": 16000})))
    pub = await publish(s, recs, progress=False)
    out = await collect(s, until=lambda o: o.accounted >= pub.total, timeout_s=TIMEOUT)
    assert out.accounted == pub.total, pipeline.logs()
    assert len(out.dlq) == 3
    assert sorted(d["error"] for d in out.dlq) == ["bad_audio", "bad_msgpack", "schema"]
    assert not out.late
    # every valid input merged once, per modality
    sent = Counter(m for m, _, _ in recs)
    for m in ("image", "audio", "text"):
        assert out.merged(m) == sent[m] - 1
    # image is the reference clock: 4 s of it fill exactly 4 windows of 5 frames;
    # audio and text move by their estimated skew (true skew 0 here, but 5 fps
    # cannot pin it closer than tens of ms), so they may spill into a 5th.
    image_windows = Counter(w["stream_id"] for w in out.windows if w["counts"]["image"])
    assert image_windows == {"cam-a": 4, "cam-b": 4}
    for w in out.windows:
        assert w["window_end"] - w["window_start"] == 1_000_000
        assert w["rate_hz"] == 20.0
        assert len(w["grid"]["image"]["luma"]) == 20 and len(w["grid"]["audio"]["rms"]) == 20
        assert w["counts"]["image"] in (0, 5)
        assert w["offsets_ms"]["image"] == 0 and w["confidence"]["image"] == 1.0
        assert all(0.0 <= c <= 1.0 for c in w["confidence"].values())
        # the true skew is 0: an estimate is near it, no estimate yet is 0
        assert abs(w["offsets_ms"]["audio"]) <= 150, w["offsets_ms"]
        assert len(w["trace_ids"]) == sum(w["counts"].values())
        assert w["id"] == f"{w['stream_id']}@{w['window_start']}"
    texts = [t for w in out.windows for tick in w["grid"]["text"]["tokens"] for t in tick]
    assert "欢迎" in texts
    # the agents' progress marks say when each end was fetched (what a "drained" vouches
    # for: app.align.progress), no later than the mark was made
    marks: list[ProgressMark] = []

    def keep(m: ConsumerRecord) -> None:
        rec = decode_features(m.value)
        if isinstance(rec, ProgressMark):
            marks.append(rec)

    await consume(s, [s.topic("features")], keep, until=lambda: len(marks) >= 30,
                  timeout_s=30)
    timed = [(m.at, us) for m in marks for p, us in m.polled.items() if p in m.parts]
    assert timed, marks[:3]
    assert all(at - 10_000_000 <= us <= at for at, us in timed), timed[:5]


@ON_BOTH
async def test_malformed_frame_dead_lettered_with_original_bytes(pipeline):
    s = pipeline.settings
    await ensure_topics(s)
    worker = pipeline.start_worker()
    garbage = os.urandom(333)
    good = list(synth_records([SynthSpec(stream_id="g", seconds=2)]))
    pub = await publish(s, [("image", b"g", garbage), *good], progress=False)
    out = await collect(s, until=lambda o: o.accounted >= pub.total, timeout_s=TIMEOUT)
    assert out.accounted == pub.total, pipeline.logs()
    [dl] = out.dlq
    assert dl["value"] == garbage and dl["key"] == b"g"
    assert dl["source_topic"] == s.topic("image") and dl["error"] == "bad_msgpack"
    assert dl["detail"] and dl["offset"] >= 0
    assert out.merged() == len(good)  # it kept going
    assert worker.poll() is None
    # the reason also travels as the `error` header
    headers: list[dict[str, bytes]] = []
    await consume(s, [s.topic("dlq")], lambda m: headers.append(dict(m.headers)),
                  until=lambda: bool(headers), timeout_s=10)
    assert headers == [{"error": b"bad_msgpack"}]
    text = pipeline.metrics(worker)
    assert re.search(r'mmsync_dlq_total\{error="bad_msgpack"\} 1\.0', text)


@ON_BOTH
async def test_late_and_duplicate_events(pipeline):
    s = pipeline.settings
    await ensure_topics(s)
    worker = pipeline.start_worker()
    base = 50_000_000
    first = [TextEvent(stream_id="t", ts=base + i * 300_000, seq=i, text=f"line {i}",
                       dur=100_000) for i in range(10)]
    recs = [("text", b"t", encode_event(e)) for e in first]
    recs.append(("text", b"t", encode_event(first[3])))  # a duplicate (same seq)
    pub = await publish(s, recs, progress=False)
    # 10 distinct records; the duplicate is dropped and counted in metrics
    out = await collect(s, until=lambda o: o.accounted >= pub.total - 1, timeout_s=TIMEOUT)
    assert out.merged() == 10 and not out.late, pipeline.logs()
    late = TextEvent(stream_id="t", ts=base + 100_000, seq=99, text="too late")
    await publish(s, [("text", b"t", encode_event(late))], progress=False)
    out = await collect(s, until=lambda o: len(o.late) >= 1, timeout_s=TIMEOUT)
    [lt] = out.late
    assert lt["seq"] == 99 and lt["window"]["start"] == base
    assert lt["window"]["id"] == f"t@{base}"
    text = pipeline.metrics(worker)
    assert re.search(r'mmsync_events_total\{modality="text",outcome="duplicate"\} 1\.0', text)
    assert re.search(r'mmsync_late_total\{modality="text"\} 1\.0', text)
    assert out.merged() == 10  # nothing merged twice


def test_mmsync_demo_command_exits_zero(tmp_path):
    env = {**os.environ, "MMSYNC_DATA_DIR": str(tmp_path)}
    env.pop("MMSYNC_BROKER", None)
    r = subprocess.run([sys.executable, "-m", "app.cli", "demo", "--seconds", "3"], env=env,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "accounted" in r.stdout and "OK" in r.stdout
    assert re.search(r"dead letters\s+2", r.stdout)
