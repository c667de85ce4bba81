"""``mmsync demo``: broker, worker, a sample media stream, aligned windows, a summary."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from rich.console import Console

from app.clients.collect import Outputs, collect
from app.clients.produce import publish
from app.clients.render import render_window
from app.clients.synth import SynthSpec, synth_records
from app.kafka.clients import create_topics, wait_for_broker
from app.kafka.embedded import EmbeddedBroker
from app.runtime.process import spawn_worker, stop_process, worker_env
from app.settings import Settings

__all__ = ["demo_records", "run_demo"]


def demo_records(seconds: float) -> list[tuple[str, bytes | None, bytes]]:
    specs = [
        SynthSpec(stream_id="shop-cam", seconds=seconds, seed=1, audio_skew_us=0),
        SynthSpec(stream_id="live-42", seconds=seconds, seed=2, audio_skew_us=0, ch=2, sr=22050),
    ]
    recs: list[tuple[str, bytes | None, bytes]] = list(synth_records(specs))
    # Bad input, to show the dead-letter path: random bytes and a frame that is not an image.
    recs.insert(len(recs) // 3, ("image", b"shop-cam", os.urandom(64)))
    recs.insert(len(recs) // 2, ("audio", b"live-42", b"\x81\xa1v\x01"))
    return recs


def run_demo(base: Settings, seconds: float = 8.0, timeout_s: float = 120.0) -> int:
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
        asyncio.run(create_topics(s))
        env = worker_env(s, MMSYNC_DATA_DIR=str(workdir / "data"))
        log = workdir / "worker.log"
        proc = spawn_worker(env, log)
        stack.callback(stop_process, proc)
        records = demo_records(seconds)
        console.print(f"publishing {len(records)} records of 2 streams ({seconds:.0f} s of "
                      f"media) to {s.topic_prefix}.text/image/audio")
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
        if not ok:
            if proc.poll() is not None:
                console.print(f"[red]worker exited with {proc.returncode}[/]")
            sys.stderr.write(log.read_text(errors="replace")[-4000:])
        return 0 if ok else 1
