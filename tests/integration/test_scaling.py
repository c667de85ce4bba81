"""Several workers sharing the partitions: a SIGKILL, a join and a clean leave mid-run.

Media is published paced (faster than real time) while the outputs are read
live, so the stall a rebalance causes is visible per stream. Tansu's consumer
groups (docs/broker.md): two or more consumers split partitions, a clean leave
(SIGTERM, LeaveGroup) rebalances at once, a SIGKILLed member is noticed only
after the session timeout (Faust's ``broker_session_timeout=6`` s here), then
the group rebalances (eager: every member gives up its partitions and gets a
new share).

What is observable per worker: its own ``/metrics`` (``mmsync_windows_total``,
``mmsync_events_total``): a worker that owns a partition with a stream on it
emits that stream's windows. Each test keys exactly one stream onto each
partition, so "every worker emitted windows" means "every worker got
partitions".
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from app.clients.collect import Outputs, collect
from app.clients.produce import Record, paced, publish
from app.clients.synth import SynthSpec, synth_events
from app.kafka.clients import consume, create_topics, default_partition
from app.runtime.process import stop_process
from schemas.events import Event, encode_event

pytestmark = pytest.mark.integration

#: media seconds per wall second while publishing
SPEED = 2.0


def _stream_ids(n_partitions: int) -> list[str]:
    """One stream id per partition (the default partitioner: murmur2 of the key)."""
    got: dict[int, str] = {}
    i = 0
    while len(got) < n_partitions:
        sid = f"sc-{i}"
        got.setdefault(default_partition(sid.encode(), n_partitions), sid)
        i += 1
    return [got[p] for p in range(n_partitions)]


def _paced(specs: list[SynthSpec]) -> list[tuple[float, Event]]:
    """(media second, event) of all streams, in media order."""
    out: list[tuple[float, Event]] = []
    for sp in specs:
        out.extend(((ev.ts - sp.start_us) / 1e6, ev) for ev in synth_events(sp)[0])
    out.sort(key=lambda p: p[0])
    return out


class _Run:
    """A paced publisher and a live reader of the outputs, side by side."""

    def __init__(self, pipeline: Any, specs: list[SynthSpec]) -> None:
        self.pl = pipeline
        self.s = pipeline.settings
        self.events = _paced(specs)
        self.stream_ids = [sp.stream_id for sp in specs]
        self.sent: Counter[str] = Counter()
        self.stop = asyncio.Event()
        self.published = False
        self.published_at = 0.0
        #: (modality, partition, offset) of every record sent
        self.sources: set[tuple[str, int, int]] = set()
        #: every window read, replays included: (id, sources)
        self.all_windows: list[tuple[str, list[Any]]] = []
        #: sources of every window read, replays included
        self.emitted: set[tuple[str, int, int]] = set()
        #: stream -> monotonic arrival times of its windows (replays included)
        self.arrivals: dict[str, list[float]] = defaultdict(list)
        self.t0 = 0.0
        self.exact = False
        self.lost: set[tuple[str, int, int]] = set()

    async def publish(self) -> None:
        self.t0 = time.monotonic()

        def sent(rec: Record, md: Any) -> None:
            self.sent[rec[0]] += 1
            self.sources.add((rec[0], md.partition, md.offset))

        timed = ((int(media_s * 1e6), (ev.modality, ev.stream_id.encode(), encode_event(ev)))
                 for media_s, ev in self.events)
        try:
            await publish(self.s, paced(timed, SPEED, stop=self.stop), progress=False,
                          on_sent=sent, linger_ms=2)
        finally:
            self.published_at = time.monotonic()
            self.published = True

    def _on_window(self, w: dict[str, Any]) -> None:
        self.arrivals[w["stream_id"]].append(time.monotonic())
        self.all_windows.append((w["id"], w["sources"]))
        self.emitted.update(tuple(src) for src in w["sources"])

    async def read(self, timeout_s: float) -> Outputs:
        def until(o: Outputs) -> bool:
            # every record sent is out somewhere (in a window, replays included, or
            # late), or a minute has passed since the last one was sent
            if not self.published:
                return False
            late = {(x["modality"], *x["src"]) for x in o.late}
            return (not self.sources - self.emitted - late
                    or time.monotonic() > self.published_at + 60)

        return await collect(self.s, until=until, timeout_s=timeout_s,
                             on_window=self._on_window)

    async def wait_for(self, cond: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}\n{self.pl.logs()}")
            await asyncio.sleep(0.25)

    def all_streams_out_since(self, t: float) -> bool:
        return all(any(a > t for a in self.arrivals[sid]) for sid in self.stream_ids)

    def resume_s(self, t: float) -> float:
        """From ``t`` until every stream had a window out again, s."""
        return max(min(a for a in self.arrivals[sid] if a > t) for sid in self.stream_ids) - t

    def stall_s(self, t0: float, t1: float) -> tuple[float, str]:
        """Longest silence of any stream's windows that overlaps [t0, t1], s."""
        worst, who = 0.0, ""
        for sid in self.stream_ids:
            ts = self.arrivals[sid]
            for a, b in zip(ts, ts[1:], strict=False):
                if b > t0 and a < t1 and b - a > worst:
                    worst, who = b - a, sid
        return worst, who

    def check_accounting(self, out: Outputs) -> str:
        """Exact accounting after de-duplication by input record, measured and reported.

        Every record sent must be in an emitted window (replays included) or on the
        late topic, counted once (``Outputs`` de-duplicates by each window's
        ``sources``); nothing may be dead-lettered. A record replayed after a
        rebalance is bucketed again with a fresh skew estimate and can land in
        another window than the first time: it then comes out twice and the
        second copy is dropped (reported as ``duplicate records``).
        """
        total = sum(self.sent.values())
        assert len(self.sources) == total
        kept = Counter(tuple(src) for w in out.windows for src in w["sources"])
        late = {(x["modality"], *x["src"]) for x in out.late}
        lost = self.sources - self.emitted - late
        assert not out.dlq
        twice = sum(1 for v in kept.values() if v > 1)
        both = len(late & set(kept))
        figures = (f"sent {total} {dict(self.sent)}; merged {out.merged()}, late {len(out.late)}, "
                   f"windows {len(out.windows)}, replayed windows dropped "
                   f"{out.duplicate_windows}, duplicate records dropped "
                   f"{out.duplicate_records} (in two windows {twice}, late and merged "
                   f"{both}); in no window at all {len(lost)} {sorted(lost)[:5]}")
        self.lost = lost
        self.exact = out.accounted == total and not lost
        if self.exact:
            for m in ("image", "audio", "text"):
                late_m = sum(1 for x in out.late if x["modality"] == m
                             and (m, *x["src"]) not in kept)
                assert out.merged(m) + late_m == self.sent[m], m
        return figures

    async def finish_tasks(self, pub: asyncio.Task[None], reader: asyncio.Task[Outputs]
                           ) -> Outputs:
        """Stop publishing, wait for the publisher, then for the reader's outputs."""
        self.stop.set()
        await pub
        return await reader

    async def cancel_tasks(self, pub: asyncio.Task[None], reader: asyncio.Task[Outputs]
                           ) -> None:
        """However the test ended: no publisher or reader left running."""
        self.stop.set()
        await asyncio.gather(pub, return_exceptions=True)
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)

    def finish(self, figures: list[str]) -> None:
        for f in figures:
            print("  " + f)
        if not self.exact:
            raise AssertionError("accounting after a rebalance not exact (figures above)\n"
                                 + self.pl.logs())


async def _on_features(s: Any, lost: set[tuple[str, int, int]]) -> list[Any]:
    """Which of ``lost`` made it to the features topic (features agent vs aligner)."""
    from schemas.features import FeatureRecord

    found = []

    def handle(m: Any) -> None:
        r = FeatureRecord.decode(m.value)
        if (r.modality, r.src_partition, r.src_offset) in lost:
            found.append((r.modality, r.src_partition, r.src_offset, m.partition, m.offset, r.ts))

    await consume(s, [s.topic("features")], handle, idle_polls=1, timeout_s=10, poll_ms=300)
    return found


def _windows_total(pipeline: Any, proc: subprocess.Popen[bytes]) -> float:
    """The worker's ``mmsync_windows_total``; 0 while its web server is not up yet.

    One quick try, no retries: it runs on the test's event loop, between the paced
    publisher and the live reader.
    """
    url = f"http://127.0.0.1:{proc.web_port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=1) as r:  # noqa: S310 - loopback
            text = r.read().decode()
    except OSError:
        return 0.0
    m = re.search(r"^mmsync_windows_total ([\d.e+]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


async def _all_emitting(run: _Run, procs: list[subprocess.Popen[bytes]],
                        timeout_s: float) -> list[float]:
    """Wait until every worker's window counter grows over 2.5 s (it holds partitions
    now, not only earlier); the counters at the end."""
    deadline = time.monotonic() + timeout_s
    while True:
        a = [_windows_total(run.pl, p) for p in procs]
        await asyncio.sleep(2.5)
        b = [_windows_total(run.pl, p) for p in procs]
        if all(y > x for x, y in zip(a, b, strict=True)):
            return b
        if time.monotonic() > deadline:
            raise AssertionError(f"not every worker is emitting: {a} -> {b}\n{run.pl.logs()}")


def _specs(stream_ids: list[str], seconds: float) -> list[SynthSpec]:
    skews = (-200_000, 0, 300_000, 100_000)
    return [SynthSpec(stream_id=sid, seconds=seconds, fps=5, seed=40 + i,
                      audio_skew_us=skews[i % len(skews)], jitter_us=5_000)
            for i, sid in enumerate(stream_ids)]


async def test_two_workers_sigkill_one_the_other_takes_over(pipeline):
    s = pipeline.settings  # 4 partitions
    await create_topics(s)
    w1 = pipeline.start_worker(MMSYNC_MODELS="light")
    w2 = pipeline.start_worker(MMSYNC_MODELS="light")
    run = _Run(pipeline, _specs(_stream_ids(s.partitions), seconds=60))
    pub = asyncio.create_task(run.publish())
    reader = asyncio.create_task(run.read(timeout_s=240))
    try:
        await run.wait_for(lambda: run.t0 > 0 and run.all_streams_out_since(run.t0), 120,
                           "every stream's first window")
        # both workers hold partitions before the kill (rebalances while the
        # second one joins are over once both have emitted)
        await _all_emitting(run, [w1, w2], 60)
        t_steady = time.monotonic()
        await run.wait_for(lambda: run.all_streams_out_since(t_steady), 30, "steady state")
        await asyncio.to_thread(stop_process, w1, signal.SIGKILL)
        t_kill = time.monotonic()
        await run.wait_for(lambda: run.all_streams_out_since(t_kill), 90, "takeover")
        resume = run.resume_s(t_kill)
        stall, who = run.stall_s(t_kill, t_kill + resume)
        t_after = time.monotonic()
        await run.wait_for(lambda: run.all_streams_out_since(t_after), 30, "steady again")
        out = await run.finish_tasks(pub, reader)
    finally:
        await run.cancel_tasks(pub, reader)
    acc = run.check_accounting(out)
    assert w2.poll() is None
    print("\ntwo workers on 4 partitions, SIGKILL one:")
    run.finish([acc, f"resume after the kill {resume:.1f} s (every stream out again), "
                     f"longest stall {stall:.1f} s ({who})"])


async def test_three_workers_share_eight_partitions_join_and_leave(pipeline):
    pipeline.env["MMSYNC_PARTITIONS"] = "8"
    s = pipeline.settings = pipeline.settings.model_copy(update={"partitions": 8})
    await create_topics(s)
    workers = [pipeline.start_worker(MMSYNC_MODELS="light") for _ in range(3)]
    run = _Run(pipeline, _specs(_stream_ids(8), seconds=150))
    pub = asyncio.create_task(run.publish())
    reader = asyncio.create_task(run.read(timeout_s=280))
    figures: list[str] = []
    try:
        await run.wait_for(lambda: run.t0 > 0 and run.all_streams_out_since(run.t0), 150,
                           "every stream's first window")
        shares = await _all_emitting(run, workers, 90)
        figures.append(f"windows per worker before the join {shares}")

        # a fourth worker joins
        t_join = time.monotonic()
        w4 = pipeline.start_worker(MMSYNC_MODELS="light")
        await run.wait_for(lambda: _windows_total(pipeline, w4) > 0, 120, "the joiner emitting")
        t_joined = time.monotonic()
        await run.wait_for(lambda: run.all_streams_out_since(t_joined), 60, "steady after join")
        stall, who = run.stall_s(t_join, t_joined)
        figures.append(f"join: first window from the new worker {t_joined - t_join:.1f} s "
                       f"after its start; longest stall of a stream {stall:.1f} s ({who})")

        # one of the first three leaves cleanly, once all four hold partitions
        await _all_emitting(run, [*workers, w4], 60)
        leaver = workers[0]
        before_leave = _windows_total(pipeline, leaver)
        t_leave = time.monotonic()
        await asyncio.to_thread(stop_process, leaver, signal.SIGTERM)
        left_s = time.monotonic() - t_leave
        await run.wait_for(lambda: run.all_streams_out_since(t_leave + left_s), 90,
                           "takeover after the leave")
        resume = run.resume_s(t_leave)
        stall, who = run.stall_s(t_leave, t_leave + resume)
        figures.append(f"leave (SIGTERM, exit {leaver.returncode} in {left_s:.1f} s, had emitted "
                       f"{before_leave:.0f} windows): every stream out again {resume:.1f} s "
                       f"after the signal; longest stall {stall:.1f} s ({who})")
        t_after = time.monotonic()
        await run.wait_for(lambda: run.all_streams_out_since(t_after), 30, "steady again")
        survivors = [*workers[1:], w4]
        assert all(w.poll() is None for w in survivors)
        end_shares = [_windows_total(pipeline, w) for w in survivors]
        out = await run.finish_tasks(pub, reader)
    finally:
        await run.cancel_tasks(pub, reader)
    acc = run.check_accounting(out)
    if run.lost:
        acc += f"; of those lost, on {s.topic('features')}: {await _on_features(s, run.lost)}"
    print("\nthree workers on 8 partitions, one joins, one leaves:")
    run.finish([acc, *figures, f"windows per survivor at the end {end_shares}"])
