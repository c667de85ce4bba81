"""A worker started as a new pod starts: an empty models directory, a load already running.

Issue 29: a worker that joined its group before its models were built (INT8 export,
quantization and the measurement of the first start: 39 s on 2 AVX2 cores) owned
partitions it could not serve, and 1532-1800 of 1800 frames went late. The models now
load before the worker subscribes; it says when it is ready (``GET /ready``,
``mmsync_ready``), and a load published from its start loses nothing.
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request

import pytest

from app.kafka.topics import ensure_topics
from tests.integration.brokers import ON_BOTH
from tests.integration.faults import LiveRun, metric, specs, stream_ids

pytestmark = pytest.mark.integration


@ON_BOTH
async def test_a_new_worker_on_an_empty_models_dir_loses_nothing_of_a_running_load(
        pipeline, tmp_path):
    s = pipeline.settings
    await ensure_topics(s)
    models = tmp_path / "models"  # nothing built: the first start of a new machine or pod
    t0 = time.monotonic()
    worker = pipeline.start_worker(MMSYNC_MODELS_DIR=str(models), MMSYNC_LOG_LEVEL="info")
    # the load runs from the worker's start (a producer that was there before it), at the
    # issue's rate: 3 streams of 25 fps frames, 100 ms audio chunks and captions
    run = LiveRun(pipeline, specs(stream_ids(s.partitions)[:3], seconds=24))
    run.start()
    try:
        said = await asyncio.to_thread(pipeline.wait_ready, worker, 240)
        ready_s = time.monotonic() - t0
        assert said.strip() == "ready"
        assert metric(pipeline, worker, "mmsync_ready") == 1.0
        await run.finish()
    finally:
        await run.cancel()
    assert worker.poll() is None
    log = (pipeline.tmp / "worker0.log").read_text(errors="replace")
    # the order of the start: models first, then the group
    assert log.index("models loaded in") < log.index("worker ready"), log
    assert sorted(p.name for p in models.iterdir() if p.suffix == ".onnx"), "nothing was built"
    run.check("one worker on an empty models dir, publishing from its start",
              figures=(f"ready {ready_s:.1f} s after its start (goal: 60 s on 2 cores)",))


@ON_BOTH
async def test_ready_is_503_until_the_partitions_are_assigned(pipeline):
    """Up is not ready: the endpoint says what is missing until the first assignment."""
    await ensure_topics(pipeline.settings)
    worker = pipeline.start_worker(MMSYNC_MODELS="light")
    url = f"http://127.0.0.1:{worker.web_port}/ready"
    seen: list[tuple[int, str]] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - loopback
                seen.append((r.status, r.read().decode()))
                break
        except urllib.error.HTTPError as exc:
            seen.append((exc.code, exc.read().decode()))
        except OSError:
            pass
        await asyncio.sleep(0.05)
    assert seen and seen[-1] == (200, "ready\n"), (seen, pipeline.logs())
    assert all(code == 503 and body == "not ready: waiting for its partitions\n"
               for code, body in seen[:-1]), seen
