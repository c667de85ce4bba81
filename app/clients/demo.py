"""``mmsync demo``: broker, worker, a sample media stream, aligned windows, a summary."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from rich.console import Console

from app.clients.collect import Outputs, collect
from app.clients.produce import publish
from app.clients.render import render_window
from app.clients.synth import SynthSpec, synth_records
from app.kafka.clients import wait_for_broker
from app.kafka.embedded import EmbeddedBroker
from app.kafka.topics import ensure_topics
from app.runtime.process import spawn_worker, stop_process, worker_env
from app.settings import Settings

__all__ = ["demo_records", "demo_specs", "offsets_table", "run_demo"]


def demo_specs(seconds: float) -> list[SynthSpec]:
    """The sample: two streams whose clocks disagree by known amounts (what the aligner finds).

    shop-cam's sound runs 250 ms late; live-42's sound runs 150 ms early and its
    captions 200 ms late (25 fps: the picture places each cut within 20 ms).
    """
    return [
        SynthSpec(stream_id="shop-cam", seconds=seconds, fps=25, seed=1, audio_skew_us=250_000),
        SynthSpec(stream_id="live-42", seconds=seconds, fps=25, seed=2, audio_skew_us=-150_000,
                  text_skew_us=200_000, ch=2, sr=22050),
    ]


def demo_records(seconds: float) -> list[tuple[str, bytes | None, bytes]]:
    recs: list[tuple[str, bytes | None, bytes]] = list(synth_records(demo_specs(seconds)))
    # Bad input, to show the dead-letter path: random bytes and a frame that is not an image.
    recs.insert(len(recs) // 3, ("image", b"shop-cam", os.urandom(64)))
    recs.insert(len(recs) // 2, ("audio", b"live-42", b"\x81\xa1v\x01"))
    return recs


def offsets_table(specs: list[SynthSpec], windows: list[dict[str, Any]]) -> list[str]:
    """Injected against estimated offsets per stream and modality, from each stream's last window.

    The estimate is what the aligner says in the newest window it emitted (by
    event time): the skew it converged to, and how sure it is.
    """
    last: dict[str, dict[str, Any]] = {}
    for w in windows:
        if w["stream_id"] not in last or w["window_start"] > last[w["stream_id"]]["window_start"]:
            last[w["stream_id"]] = w
    lines = [f"{'stream':10} {'modality':8} {'injected':>9} {'estimated':>10} {'error':>7} "
             f"{'confidence':>10}"]
    for sp in specs:
        lw = last.get(sp.stream_id)
        for m in ("audio", "text"):
            want = sp.injected_ms(m, sp.seconds)
            if lw is None:
                lines.append(f"{sp.stream_id:10} {m:8} {want:+8.0f}  {'(no window)':>10}")
                continue
            got = float(lw["offsets_ms"].get(m, 0.0))
            conf = float(lw["confidence"].get(m, 0.0))
            lines.append(f"{sp.stream_id:10} {m:8} {want:+8.0f}  {got:+9.0f}  "
                         f"{abs(got - want):6.0f}  {conf:10.2f}")
    return lines


def run_demo(base: Settings, seconds: float = 20.0, timeout_s: float = 120.0) -> int:
    console = Console(soft_wrap=True)  # one window per line, however narrow the terminal
    t_start = time.monotonic()
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mmsync-demo-")))
        broker_url = base.broker
        embedded = base.broker_embedded
        if not broker_url:
            broker = stack.enter_context(EmbeddedBroker(log_path=workdir / "broker.log"))
            broker_url, embedded = broker.url, True
            console.print(f"[bold]embedded broker[/] {broker.bootstrap} (Tansu, in memory)")
        s = base.model_copy(update={"broker": broker_url, "broker_embedded": embedded})
        asyncio.run(wait_for_broker(s, timeout_s=20))
        asyncio.run(ensure_topics(s))
        env = worker_env(s, MMSYNC_DATA_DIR=str(workdir / "data"))
        log = workdir / "worker.log"
        proc = spawn_worker(env, log)
        stack.callback(stop_process, proc)
        specs = demo_specs(seconds)
        records = demo_records(seconds)
        console.print(f"publishing {len(records)} records of 2 streams ({seconds:.0f} s of "
                      f"media) to {s.topic_prefix}.text/image/audio; their clocks disagree: "
                      + "; ".join(f"{sp.stream_id} audio {sp.injected_ms('audio'):+.0f} ms, "
                                  f"text {sp.injected_ms('text'):+.0f} ms" for sp in specs))
        published = asyncio.run(publish(s, records, total=len(records)))
        console.print("waiting for the worker (first start takes about 10 s) ...")

        def done(o: Outputs) -> bool:
            return o.accounted >= published.total or proc.poll() is not None

        out = asyncio.run(collect(s, until=done, timeout_s=timeout_s,
                                  on_window=lambda w: console.print(render_window(w),
                                                                    highlight=False)))
        ok = out.accounted == published.total
        console.rule("summary")
        by_mod = dict(sorted(published.by_modality.items()))
        console.print(f"events in       {published.total}  {by_mod}")
        console.print(f"windows out     {len(out.windows)}")
        console.print(f"merged          {out.merged()}  "
                      f"{ {m: out.merged(m) for m in ('image', 'audio', 'text')} }")
        console.print(f"late            {len(out.late)}")
        console.print(f"dead letters    {len(out.dlq)}  {sorted({d['error'] for d in out.dlq})}")
        console.print(f"accounted       {out.accounted}/{published.total}  "
                      f"{'[green]OK[/]' if ok else '[red]MISSING[/]'}")
        console.print(f"time            {time.monotonic() - t_start:.1f} s")
        console.rule("clock skew: injected vs found by the aligner (ms, last window)")
        for line in offsets_table(specs, out.windows):
            console.print(line, highlight=False)
        if not ok:
            if proc.poll() is not None:
                console.print(f"[red]worker exited with {proc.returncode}[/]")
            sys.stderr.write(log.read_text(errors="replace")[-4000:])
        return 0 if ok else 1
