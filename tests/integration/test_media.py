"""A real video with sound and captions, through `mmsync produce --video` and a real worker."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections import Counter

import pytest

from app.clients.collect import collect
from app.clients.media import probe, video_records
from app.kafka.topics import ensure_topics
from tests.helpers import make_video, write_srt
from tests.integration.brokers import ON_BOTH

pytestmark = pytest.mark.integration

TIMEOUT = 90
START = 1_700_000_000_000_000  # on a window boundary, in the past


def _cli(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=timeout)


@ON_BOTH
async def test_produce_video_every_frame_chunk_and_caption_aligned(pipeline, tmp_path):
    s = pipeline.settings
    video = make_video(tmp_path / "clip", seconds=3.0, fps=15, sr=16000)
    srt = write_srt(tmp_path / "clip.srt")
    await ensure_topics(s)
    pipeline.start_worker()  # the full models, as in production: NSFW on the real JPEGs

    r = _cli(pipeline.env, "produce", "--video", str(video), "--srt", str(srt), "--fps", "10",
             "--chunk-ms", "100", "--stream-id", "film-1", "--start-us", str(START), "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"published (\d+) records: (\{.*\})", r.stdout)
    assert m, r.stdout
    total, sent = int(m.group(1)), ast.literal_eval(m.group(2))
    # what the CLI sent is what the file holds: 3 s at 15 fps picked to 10 fps, 100 ms chunks
    expect = Counter(mod for mod, _, _ in video_records(video, "film-1", START, fps=10,
                                                        chunk_ms=100, srt=srt))
    assert sent == dict(expect) and sent["image"] == 30 and sent["text"] == 3
    assert sent["audio"] >= 30

    out = await collect(s, until=lambda o: o.accounted >= total, timeout_s=TIMEOUT)
    assert out.accounted == total, pipeline.logs()
    assert not out.dlq and not out.late
    for mod in ("image", "audio", "text"):
        assert out.merged(mod) == sent[mod], (mod, pipeline.logs())
    windows = sorted(out.windows, key=lambda w: w["window_start"])
    assert {w["stream_id"] for w in windows} == {"film-1"}
    duration = probe(video).duration_us
    assert windows[0]["window_start"] <= START
    assert windows[-1]["window_end"] >= START + duration
    # image is the reference clock: 10 picked frames in each of the 3 seconds
    assert [w["counts"]["image"] for w in windows if w["counts"].get("image")] == [10, 10, 10]
    traces = {t for w in windows for t in w["trace_ids"]}
    assert {"film-1:image:0", "film-1:audio:0", "film-1:text:2"} <= traces

    # the clients on the same output: tail --json and moderate
    n = len(windows)
    r = _cli(pipeline.env, "tail", "--json", "--count", str(n), "--timeout", "30")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(lines) == n and all("emb" not in w["grid"]["image"] for w in lines)
    scored = [w for w in windows if isinstance(w["moderation"].get("nsfw_max"), float)]
    assert len(scored) == 3  # every window with frames carries the NSFW score
    # threshold 0: every scored window is flagged, one line each, and counted in the report
    r = _cli(pipeline.env, "moderate", "--count", str(n), "--timeout", "30", "--terms",
             "--nsfw-threshold", "0")
    assert r.returncode == 0, r.stderr
    flagged = [x for x in r.stdout.splitlines() if x.startswith("FLAG film-1 [")]
    assert len(flagged) == len(scored), r.stdout
    assert f"{n} windows, {len(scored)} flagged" in r.stdout and "film-1" in r.stdout
