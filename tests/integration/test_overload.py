"""Overload: twice the sustainable frame rate for a minute, real models, real pace.

Every frame is a different picture (no cache, no near-duplicates to lean on),
so at level 0 the image models at FP32 (15 to 43 frames/s raw on the 2-core
machines, docs/benchmarks.md; more with the embedding skipped for a batch that is
behind) cannot keep up with 90 frames/s. FP32 whatever the
CPU: on a CPU with VNNI the default precision is INT8 (about 75 frames/s
there), which kept up with the 40 frames/s this test sent before and left it
without its premise (issue 24's Kafka run: level 0 throughout); at FP32 and 40
frames/s the level rose for a few seconds only (one sample of level 1 on Kafka). What must hold: the
degradation level goes up (mmsync_degradation_level), the backlog stays
bounded and drains within seconds of the load stopping, peak RSS stays under
the cap that the bounded buffers give, and every record is accounted for.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time

import numpy as np
import pytest
import simplejpeg
from PIL import Image, ImageDraw

from app.clients.collect import collect
from app.clients.produce import paced, publish
from app.kafka.topics import ensure_topics
from app.runtime.process import peak_rss_bytes
from schemas.events import AudioChunk, FrameEvent, TextEvent, encode_event
from tests.integration.brokers import ON_BOTH
from tests.integration.faults import metric

pytestmark = pytest.mark.integration

#: 90 frames/s: about twice what FP32 sustains here with Open-NSFW alone (a batch behind
#: skips the embedding, MMSYNC_DEGRADE_EMBED_LAG_MS: at 60 frames/s the worker kept up on
#: Kafka at level 0 once its producer lingered 5 ms)
STREAMS, FPS, SECONDS = 6, 15, 60
#: The cap this test holds the worker to, with MMSYNC_BUFFER_MAX=64: the warm
#: models (326 MiB peak, scripts/measure_rss.py), Faust and aiokafka, and the
#: bounded buffers, with room to spare; an unbounded queue grows past any cap.
RSS_CAP_BYTES = 2 << 30


def _frame(rng: np.random.Generator) -> bytes:
    img = Image.new("RGB", (320, 180), tuple(int(c) for c in rng.integers(0, 255, 3)))
    d = ImageDraw.Draw(img)
    for _ in range(6):
        x, y = int(rng.integers(0, 280)), int(rng.integers(0, 140))
        d.rectangle([x, y, x + int(rng.integers(10, 60)), y + int(rng.integers(10, 60))],
                    fill=tuple(int(c) for c in rng.integers(0, 255, 3)))
    return simplejpeg.encode_jpeg(np.asarray(img), quality=80)


def _schedule() -> list[tuple[float, str, str, bytes]]:
    """(send at, s from start; modality; stream; value), in send order."""
    rng = np.random.default_rng(11)
    out = []
    t0_us = int(time.time() * 1e6)
    for k in range(STREAMS):
        sid = f"ov-{k}"
        for i in range(SECONDS * FPS):
            t = i / FPS
            out.append((t, "image", sid, encode_event(FrameEvent(
                stream_id=sid, ts=t0_us + int(t * 1e6), seq=i, data=_frame(rng), fmt="jpeg"))))
        for i in range(SECONDS * 10):
            t = i / 10
            x = (0.2 * np.sin(np.arange(1600) * (0.05 + 0.01 * (i % 7)))).astype(np.float32)
            out.append((t, "audio", sid, encode_event(AudioChunk(
                stream_id=sid, ts=t0_us + int(t * 1e6), seq=i,
                data=(x * 32767).astype("<i2").tobytes(), sr=16000))))
        for i in range(SECONDS):
            out.append((float(i), "text", sid, encode_event(TextEvent(
                stream_id=sid, ts=t0_us + i * 1_000_000, seq=i, text=f"caption {k} {i}",
                dur=900_000))))
    out.sort(key=lambda r: r[0])
    return out


@ON_BOTH
async def test_twice_the_sustainable_rate_degrades_and_loses_nothing(pipeline):
    s = pipeline.settings
    await ensure_topics(s)
    # FP32 scores only: the INT8 fallback of batches behind (MMSYNC_DEGRADE_INT8) scores
    # them 2.7x faster, so 90 frames/s would no longer be twice what the worker sustains
    worker = pipeline.start_worker(MMSYNC_CACHE="false", MMSYNC_BUFFER_MAX="64",
                                   MMSYNC_DEGRADE_LAG_MS="1000", MMSYNC_PRECISION="fp32",
                                   MMSYNC_DEGRADE_INT8="false")
    # Ready when its models are loaded: the load stage has a sample.
    deadline = time.monotonic() + 120
    while 'mmsync_stage_seconds_count{stage="load_image"}' not in pipeline.metrics(worker):
        assert time.monotonic() < deadline, pipeline.logs()
        await asyncio.sleep(1)
    sched = _schedule()

    levels: list[tuple[float, float, float]] = []  # (t, image level, max lag)
    stop = threading.Event()

    def watch() -> None:
        t0 = time.monotonic()
        while not stop.is_set():
            text = pipeline.metrics(worker)
            lv = re.search(r'mmsync_degradation_level\{modality="image"\} ([0-9.]+)', text)
            lags = [float(v) for v in re.findall(
                r'mmsync_consumer_lag\{partition="\d+",topic="[^"]+\.image"\} ([0-9.e+]+)', text)]
            levels.append((time.monotonic() - t0, float(lv.group(1)) if lv else 0.0,
                           max(lags, default=0.0)))
            stop.wait(2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    t0 = time.monotonic()
    await publish(s, paced((int(at * 1e6), (m, sid.encode(), v)) for at, m, sid, v in sched),
                  progress=False)
    sent_s = time.monotonic() - t0
    t_end = time.monotonic()
    out = await collect(s, until=lambda o: o.accounted >= len(sched), timeout_s=180)
    drain_s = time.monotonic() - t_end
    stop.set()
    watcher.join()
    peak = peak_rss_bytes(worker.pid)
    top = max(lv for _, lv, _ in levels)
    await asyncio.sleep(1.5)  # the counters are fed once a second
    unembedded = metric(pipeline, worker, "mmsync_image_unembedded_total")
    print(f"\noverload: {len(sched)} records in {sent_s:.0f} s ({STREAMS * FPS} frames/s); "
          f"merged {out.merged()}, late {len(out.late)}, dead letters {len(out.dlq)}; "
          f"highest level {top:.0f}; drained {drain_s:.1f} s after the load stopped; "
          f"max image lag {max(lag for *_, lag in levels):.0f} records; "
          f"peak RSS {peak / 2**20:.0f} MiB (cap {RSS_CAP_BYTES / 2**20:.0f}); "
          f"frames scored without the embedding {unembedded:.0f}")
    print("level over time: " + " ".join(f"{t:.0f}s:{lv:.0f}" for t, lv, _ in levels[::3]))
    assert out.accounted == len(sched), pipeline.logs()
    assert not out.dlq and worker.poll() is None
    assert top >= 1, "twice the sustainable rate must raise the degradation level"
    # batches behind their alerts' bound skip EfficientNet, and the metric says how many
    assert unembedded > 0, "a backlog must make batches skip the embedding"
    assert drain_s < 45, "the backlog must stay bounded"
    assert peak < RSS_CAP_BYTES
