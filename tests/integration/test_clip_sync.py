"""A real encoded clip through the product: ``mmsync produce --video --srt`` into a worker.

The clip (tests/data/corpus/en-talking.mp4: espeak-ng speech, a card on screen
while each phrase is spoken, a drifting noisy background; the sound 280 ms
late in the file, the sidecar .srt 150 ms early) is published at 4x real time
to a real worker on the embedded broker, and the windows read back from
``mm.aligned`` must carry the offsets the file was made with (issue 14).
Bounds are loose; docs/benchmarks.md has the measured figures.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from app.clients.collect import collect
from app.kafka.topics import ensure_topics
from tests.integration.brokers import ON_BOTH

pytestmark = pytest.mark.integration

CLIP = Path(__file__).resolve().parents[1] / "data" / "corpus" / "en-talking"
START = 1_700_000_000_000_000


@ON_BOTH
async def test_real_clip_offsets_through_produce_and_a_worker(pipeline):
    s = pipeline.settings
    await ensure_topics(s)
    pipeline.start_worker(MMSYNC_MODELS="light")
    truth = json.loads(CLIP.with_suffix(".json").read_text())["offsets"]
    r = subprocess.run(
        [sys.executable, "-m", "app.cli", "produce", "--video", str(CLIP.with_suffix(".mp4")),
         "--srt", str(CLIP.with_suffix(".srt")), "--fps", "25", "--chunk-ms", "100",
         "--realtime", "--speed", "4", "--stream-id", "clip", "--start-us", str(START),
         "--quiet"], env={**os.environ, **pipeline.env}, capture_output=True, text=True,
        timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    total = int(re.search(r"published (\d+) records", r.stdout).group(1))  # type: ignore[union-attr]
    out = await collect(s, until=lambda o: o.accounted >= total, timeout_s=90)
    assert out.accounted == total and not out.late and not out.dlq, pipeline.logs()
    late_enough = [w for w in out.windows if w["window_start"] - START >= 10_000_000]
    assert len(late_enough) >= 20
    for modality in ("audio", "text"):
        want = truth[modality]["skew_ms"]
        errs = [abs(w["offsets_ms"][modality] - want) for w in late_enough]
        sure = [e for w, e in zip(late_enough, errs, strict=True)
                if w["confidence"][modality] >= 0.5]
        print(f"\nclip {modality}: truth {want:+.0f} ms, |error| median {np.median(errs):.0f} "
              f"p95 {np.percentile(errs, 95):.0f} ms, confidence >= 0.5 in "
              f"{len(sure)}/{len(errs)} windows")
        # the product's promise: right in the median, and right where it says it is sure
        # (a live run on a loaded machine can have a stretch where it is not)
        assert np.median(errs) <= 40, (modality, errs)
        assert len(sure) >= len(errs) / 2 and max(sure, default=0) <= 100, (modality, sure)
    # issue 25: every caption listed once, in the window of its aligned time or later (the
    # oldest open one, where its own had closed), each near its speech (the srt's cue
    # start, its shift taken off: these are subtitles)
    caps = [c for w in out.windows for c in w["captions"]]
    assert len(caps) == sum(w["counts"]["text"] for w in out.windows)
    assert all(c["aligned_ts"] < w["window_end"] for w in out.windows for c in w["captions"])
    speech = sorted(START + round(c["speech_s"] * 1e6) for c in truth["text"]["captions"])
    errs = [min(abs(c["aligned_ts"] - t) for t in speech) / 1000 for c in caps]
    print(f"clip captions: |aligned_ts - speech start| median {np.median(errs):.0f} ms")
    assert np.median(errs) <= 40, errs
