"""Real clips through the product: ``mmsync produce --video --realtime`` into a real worker.

A fresh broker (the embedded one, or Apache Kafka with ``--broker kafka``) and one
light worker are started; each clip case is
published by its own ``mmsync produce --video F --srt S --fps N --chunk-ms C
--realtime`` process (all at once, one stream each, as concurrent live
sources); the windows read back from ``mm.aligned`` are scored against the
clip's truth exactly as the offline replay's are. Only replays that add no
shift of their own can go this way (``produce`` publishes the file as it is).
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from app.clients.collect import Outputs, collect
from app.runtime.process import worker_env
from scripts.benchlib.corpus.build import build
from scripts.benchlib.corpus.cases import Case
from scripts.benchlib.corpus.clips import clip_paths
from scripts.benchlib.corpus.oracle import oracle
from scripts.benchlib.corpus.replay import Replay, Window
from scripts.benchlib.corpus.run import CaseResult
from scripts.benchlib.corpus.score import score_captions, score_windows
from scripts.benchlib.corpus.synth import START_US
from scripts.benchlib.worker import light_worker

__all__ = ["live_clips"]

_PUBLISHED = re.compile(r"published (\d+) records")


def _produce(env: dict[str, str], case: Case, speed: float) -> subprocess.Popen[str]:
    video, srt, _ = clip_paths(str(case.params["clip"]))
    cmd = [sys.executable, "-m", "app.cli", "produce", "--video", str(video), "--srt", str(srt),
           "--fps", str(case.params.get("fps", 25)), "--chunk-ms",
           str(case.params.get("chunk_ms", 100)), "--realtime", "--speed", str(speed),
           "--stream-id", case.name, "--start-us", str(START_US), "--quiet"]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _caption(c: dict[str, Any], w: dict[str, Any]) -> tuple[int | None, int, int, float, int]:
    """A window's caption as the offline replay records it: (seq, ts, aligned ts, conf,
    ts less the window's text offset); the seq from its trace id (``produce`` ends it
    with ``:text:<seq>``, the caption's index in the subtitle file)."""
    tail = str(c.get("trace_id", "")).rsplit(":", 1)[-1]
    seq = int(tail) if tail.isdigit() else None
    ts = int(c["ts"])
    return (seq, ts, int(c["aligned_ts"]), float(c["conf"]),
            ts - round(float(w["offsets_ms"].get("text", 0.0)) * 1000))


def _result(case: Case, out: Outputs, sent: int, wall_s: float) -> CaseResult:
    (st,) = build(case)  # the same events produce sent: for the truth and the oracle
    tr = st.truth
    ours = [w for w in out.windows if w["stream_id"] == case.name]
    rep = Replay(truths={case.name: tr}, events=sent)
    for w in ours:
        rep.windows.append(Window(
            stream_id=case.name, start_us=int(w["window_start"]), end_us=int(w["window_end"]),
            emitted_s=w["emitted_at"] / 1e6, offsets_ms=dict(w["offsets_ms"]),
            confidence=dict(w["confidence"]), counts=dict(w["counts"]),
            captions=tuple(_caption(c, w) for c in w.get("captions", ()))))
    rep.outcomes = Counter(merged=sum(sum(w["counts"].values()) for w in ours),
                           late=sum(1 for x in out.late if x.get("stream_id") == case.name))
    style = tr.offsets["text"].style if "text" in tr.offsets else None
    lags = {case.name: oracle(st.events, tr.start_us, tr.seconds, text_style=style)}
    wins = [(w.start_us, w.end_us, w.offsets_ms, w.confidence) for w in rep.windows]
    caps = score_captions(case, tr, (c for w in rep.windows for c in w.captions))
    return CaseResult(case, rep, score_windows(case, tr, wins, lags[case.name]), caps, lags,
                      wall_s)


def live_clips(cases: Sequence[Case], speed: float = 1.0, broker: str = "tansu"
               ) -> tuple[list[CaseResult], list[float]]:
    """Publish every clip case at once through a real worker on a fresh broker of kind
    ``broker`` (``tansu`` or ``kafka``); (results, sync latencies ms)."""
    bad = [c.name for c in cases if c.kind != "clip" or c.params.get("add_audio_ms")
           or c.params.get("add_text_ms")]
    if bad:
        raise ValueError(f"not publishable as they are (a synthetic case or an added shift): {bad}")
    with light_worker("corpus", broker=broker) as s:
        env = {**os.environ, **worker_env(s)}
        t0 = time.monotonic()
        producers = [(c, _produce(env, c, speed)) for c in cases]
        sent: dict[str, int] = {}
        for c, p in producers:
            text, _ = p.communicate(timeout=600)
            m = _PUBLISHED.search(text)
            if p.returncode != 0 or m is None:
                raise RuntimeError(f"mmsync produce for {c.name} failed: {text[-2000:]}")
            sent[c.name] = int(m.group(1))
        total = sum(sent.values())

        def done(o: Outputs) -> bool:
            return o.accounted >= total

        out = asyncio.run(collect(s, until=done, timeout_s=120))
        wall = time.monotonic() - t0
    if out.accounted < total:
        print(f"warning: accounted {out.accounted} of {total} records")
    sync = [w["stages"]["sync"] * 1000 for w in out.windows if "sync" in w.get("stages", {})]
    return [_result(c, out, sent[c.name], wall) for c in cases], sync

