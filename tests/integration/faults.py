"""A live run for fault tests: a paced publisher and a reader of the outputs, side by side.

Media is published at ``speed`` x real time while the outputs are read live, so
what a fault costs is visible per stream: how long its windows stop, how many
inputs went late, and whether a window id came out again with fewer inputs
(contract, "Window identity": a consumer keeping the newest window per id must
lose nothing).
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from app.clients.collect import Outputs, collect
from app.clients.produce import Record, paced, publish
from app.clients.synth import SynthSpec, synth_events
from app.kafka.clients import default_partition
from schemas.events import encode_event
from tests.integration.lost import where_lost

__all__ = ["LiveRun", "all_emitting", "held", "metric", "specs", "stream_ids"]

#: Late inputs a fault may cost, as a share of the inputs (issue 15; the aim is zero).
LATE_SHARE_MAX = 0.005


def stream_ids(n_partitions: int, prefix: str = "sc") -> list[str]:
    """One stream id per partition (the default partitioner: murmur2 of the key)."""
    got: dict[int, str] = {}
    i = 0
    while len(got) < n_partitions:
        sid = f"{prefix}-{i}"
        got.setdefault(default_partition(sid.encode(), n_partitions), sid)
        i += 1
    return [got[p] for p in range(n_partitions)]


def specs(ids: list[str], seconds: float, fps: float = 25.0) -> list[SynthSpec]:
    """The issue's load: 25 fps frames, 100 ms audio chunks, captions at scene cuts, audio
    skews of a few hundred ms, jitter."""
    skews = (-200_000, 0, 300_000, 100_000)
    return [SynthSpec(stream_id=sid, seconds=seconds, fps=fps, audio_chunk_ms=100, seed=40 + i,
                      audio_skew_us=skews[i % len(skews)], jitter_us=5_000)
            for i, sid in enumerate(ids)]


def metric(pipeline: Any, proc: subprocess.Popen[bytes], name: str) -> float:
    """One unlabelled sample of a worker's /metrics (0 if it does not answer)."""
    url = f"http://127.0.0.1:{proc.web_port}/metrics"  # type: ignore[attr-defined]
    try:
        with urllib.request.urlopen(url, timeout=1) as r:  # noqa: S310 - loopback
            text = r.read().decode()
    except OSError:
        return 0.0
    m = re.search(rf"^{re.escape(name)} ([\d.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def held(pipeline: Any, proc: subprocess.Popen[bytes], topic: str) -> list[int]:
    """The partitions of ``topic`` a worker holds now (its ``mmsync_consumer_lag`` series;
    empty if it does not answer)."""
    url = f"http://127.0.0.1:{proc.web_port}/metrics"  # type: ignore[attr-defined]
    try:
        with urllib.request.urlopen(url, timeout=1) as r:  # noqa: S310 - loopback
            text = r.read().decode()
    except OSError:
        return []
    held_now = []
    for m in re.finditer(r"^mmsync_consumer_lag\{([^}]*)\}", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))  # in any order
        if labels.get("topic") == topic:
            held_now.append(int(labels["partition"]))
    return sorted(held_now)


async def all_emitting(pipeline: Any, procs: list[subprocess.Popen[bytes]],
                       timeout_s: float) -> list[float]:
    """Wait until every worker's window counter grows over 2.5 s (it holds partitions
    now); the counters at the end."""
    deadline = time.monotonic() + timeout_s
    while True:
        a = [metric(pipeline, p, "mmsync_windows_total") for p in procs]
        await asyncio.sleep(2.5)
        b = [metric(pipeline, p, "mmsync_windows_total") for p in procs]
        if all(y > x for x, y in zip(a, b, strict=True)):
            return b
        if time.monotonic() > deadline:
            parts = [held(pipeline, p, pipeline.settings.topic("features")) for p in procs]
            raise AssertionError(f"not every worker is emitting: {a} -> {b}; features "
                                 f"partitions held: {parts}\n{pipeline.logs()}")


class LiveRun:
    """Publish ``specs`` paced while reading the outputs; then check what a fault cost."""

    def __init__(self, pipeline: Any, stream_specs: list[SynthSpec], speed: float = 1.0) -> None:
        self.pl = pipeline
        self.s = pipeline.settings
        self.speed = speed
        self.events = sorted((((ev.ts - sp.start_us) / 1e6, ev) for sp in stream_specs
                              for ev in synth_events(sp)[0]), key=lambda p: p[0])
        self.stream_ids = [sp.stream_id for sp in stream_specs]
        self.sent: Counter[str] = Counter()
        self.stop = asyncio.Event()
        self.published = False
        self.published_at = 0.0
        self.t0 = 0.0
        #: (modality, partition, offset) of every record sent
        self.sources: set[tuple[str, int, int]] = set()
        #: stream -> monotonic arrival times of its windows (replays included)
        self.arrivals: dict[str, list[float]] = defaultdict(list)
        self.out: Outputs | None = None
        #: where the inputs no output names were lost (finish() asks when there are any)
        self.lost_report = ""
        self._pub: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[Outputs] | None = None

    # -- running -----------------------------------------------------------
    def start(self, timeout_s: float = 300) -> None:
        self._pub = asyncio.create_task(self._publish())
        self._reader = asyncio.create_task(self._read(timeout_s))

    def media_s(self) -> float:
        """Media seconds published so far."""
        return 0.0 if not self.t0 else (time.monotonic() - self.t0) * self.speed

    async def _publish(self) -> None:
        self.t0 = time.monotonic()

        def sent(rec: Record, md: Any) -> None:
            self.sent[rec[0]] += 1
            self.sources.add((rec[0], md.partition, md.offset))

        timed = ((int(t * 1e6), (ev.modality, ev.stream_id.encode(), encode_event(ev)))
                 for t, ev in self.events)
        try:
            await publish(self.s, paced(timed, self.speed, stop=self.stop), progress=False,
                          on_sent=sent, linger_ms=2)
        finally:
            self.published_at = time.monotonic()
            self.published = True

    async def _read(self, timeout_s: float) -> Outputs:
        def until(o: Outputs) -> bool:
            # every record sent is out (in the newest window of its id, or late), or a
            # minute has passed since the last one was sent
            return self.published and (o.accounted_newest >= len(self.sources) > 0
                                       or time.monotonic() > self.published_at + 60)

        def on_window(w: dict[str, Any]) -> None:
            self.arrivals[w["stream_id"]].append(time.monotonic())

        return await collect(self.s, until=until, timeout_s=timeout_s, on_window=on_window)

    async def wait_for(self, cond: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}\n{self.pl.logs()}")
            await asyncio.sleep(0.25)

    async def at_media(self, seconds: float) -> float:
        """Wait until ``seconds`` of media were published; the monotonic time then."""
        await self.wait_for(lambda: self.media_s() >= seconds, seconds / self.speed + 60,
                            f"{seconds} s of media")
        return time.monotonic()

    async def finish(self) -> Outputs:
        """Let the publisher end, then the reader; however it went, nothing left running."""
        assert self._pub is not None and self._reader is not None
        try:
            await self._pub
            self.out = await self._reader
        finally:
            self.stop.set()
            self._reader.cancel()
            await asyncio.gather(self._pub, self._reader, return_exceptions=True)
        lost = self.sources - self.out.inputs
        if lost:
            self.lost_report = await where_lost(self.s, lost)
        return self.out

    async def cancel(self) -> None:
        self.stop.set()
        for task in (self._pub, self._reader):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (self._pub, self._reader) if t is not None),
                             return_exceptions=True)

    # -- what it cost ------------------------------------------------------
    def all_streams_out_since(self, t: float) -> bool:
        return all(any(a > t for a in self.arrivals[sid]) for sid in self.stream_ids)

    def resume_s(self, t: float) -> float:
        """From ``t`` until every stream had a window out again, s."""
        return max(min(a for a in self.arrivals[sid] if a > t) for sid in self.stream_ids) - t

    def check(self, what: str, *, figures: tuple[str, ...] = ()) -> list[str]:
        """Assert the issue's goals on the outputs; print and return the figures."""
        out = self.out
        assert out is not None, "finish() first"
        total = sum(self.sent.values())
        late = out.late_inputs
        again = sum(1 for n in out.emissions.values() if n > 1)
        lines = [
            f"{what}: sent {total} {dict(self.sent)}; merged {out.merged()}, late {late} "
            f"({late / max(total, 1):.2%}), dead letters {len(out.dlq)}; windows "
            f"{len(out.windows)}, ids published again {again} (with fewer inputs "
            f"{len(out.shrunk)}); accounted {out.accounted}/{total}, by "
            f"the newest window per id {out.accounted_newest}/{total}",
            *figures,
        ]
        print("\n" + "\n  ".join(lines))
        assert len(self.sources) == total
        assert not out.dlq, out.dlq[:3]
        assert not out.shrunk, f"window ids re-emitted with fewer inputs: {out.shrunk[:3]}"
        assert out.accounted == total and out.accounted_newest == total, (
            f"{self.lost_report}\n{self.pl.logs()}")
        assert late <= LATE_SHARE_MAX * total, (
            f"{late} late inputs of {total}\n{late_report(out)}\n{self.pl.logs()}")
        return lines


def late_report(out: Outputs) -> str:
    """The late events by stream and modality: how many, their media times, the windows
    they missed, when they went late, and how far the stream's windows had been emitted
    by then (s; a failure's first clue)."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for ev in out.late:
        by[(str(ev["stream_id"]), str(ev["modality"]))].append(ev)
    emitted: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for w in out.windows:
        emitted[str(w["stream_id"])].append((int(w["emitted_at"]), int(w["window_end"])))
    rows = []
    for (sid, mod), evs in sorted(by.items()):
        ts = [int(e["ts"]) / 1e6 for e in evs]
        win = [int(e["window"]["start"]) / 1e6 for e in evs]
        at = min(int(e["at"]) for e in evs)
        until = max((end for t, end in emitted[sid] if t <= at), default=-1) / 1e6
        srcs = sorted(tuple(e["src"]) for e in evs)
        rows.append(f"  {sid} {mod}: {len(evs)} late, ts {min(ts):.2f}-{max(ts):.2f} s, "
                    f"windows {min(win):.0f}-{max(win):.0f} s; the stream's windows emitted "
                    f"to {until:.2f} s when the first went late; inputs {srcs[0]}..{srcs[-1]}")
    return "late inputs:\n" + "\n".join(rows)
