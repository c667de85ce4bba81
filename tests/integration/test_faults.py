"""Faults under a live load: what each one costs the consumers (issue 15).

Each test publishes streams at real-time pace (25 fps frames, 100 ms audio
chunks, captions) while reading the outputs, injects one fault, and checks
the goals: late inputs at most 0.5% (the generator sends nothing late), no
window id ever re-emitted with fewer inputs, every input accounted for even
by a consumer that keeps only the newest window per id, and every stream's
output back within the broker session timeout plus 10 s. Figures are printed
(``pytest -s``), with what the takeovers' read-back of the outputs cost.

Tansu's consumer groups (docs/broker.md): a clean leave (SIGTERM) rebalances
at once, a SIGKILLed member is noticed after the session timeout (6 s here),
then the group rebalances eagerly (every member gives up its partitions and
gets a new share, so every worker restores every partition it is given).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections import Counter
from typing import Any

import pytest
from aiokafka.structs import TopicPartition

from app.clients.produce import publish
from app.clients.synth import SynthSpec, synth_records
from app.kafka.clients import default_partition
from app.kafka.topics import ensure_topics
from app.runtime.offsets import GroupOffsets
from app.runtime.process import stop_process
from tests.integration.brokers import ON_BOTH
from tests.integration.faults import LiveRun, all_emitting, held, metric, specs, stream_ids
from tests.integration.lost import feature_inputs

pytestmark = pytest.mark.integration

#: broker_session_timeout in app/runtime/faust_app.py, s
SESSION_S = 6.0
#: the goal (issue 15): every stream's output back within this after a fault, s; printed
#: beside each figure. The assertion allows twice the margin: these tests share two cores
#: with the rest of the suite, and a slow second must not fail them (docs/benchmarks.md
#: has the figures of quiet runs)
RESUME_GOAL_S = SESSION_S + 10.0
RESUME_MAX_S = SESSION_S + 20.0


def _restores(pipeline: Any, procs: list[subprocess.Popen[bytes]]) -> str:
    n = sum(metric(pipeline, p, "mmsync_restore_seconds_count") for p in procs)
    secs = sum(metric(pipeline, p, "mmsync_restore_seconds_sum") for p in procs)
    recs = sum(metric(pipeline, p, "mmsync_restore_records_total") for p in procs)
    parts = sum(metric(pipeline, p, "mmsync_restore_partitions_total") for p in procs)
    if not n:
        return "no read-back by the workers still up"
    return (f"takeover read-back by the workers still up: {n:.0f} rebalances, {parts:.0f} "
            f"partitions; per rebalance {secs / n * 1000:.0f} ms, {recs / n:.0f} output "
            f"records ({secs / parts * 1000:.0f} ms per partition)")


def _resumed(resume: float, fault: str) -> str:
    return f"every stream out again {resume:.1f} s after {fault} (goal {RESUME_GOAL_S:.0f} s)"


async def _kill(proc: subprocess.Popen[bytes]) -> float:
    await asyncio.to_thread(stop_process, proc, signal.SIGKILL)
    return time.monotonic()


@ON_BOTH
async def test_sigkill_of_the_only_worker(pipeline):
    """The issue's case: one worker (real models) SIGKILLed 10 s in, a fresh one 2 s later."""
    s = pipeline.settings  # 4 partitions
    await ensure_topics(s)
    first = pipeline.start_worker()
    run = LiveRun(pipeline, specs(stream_ids(s.partitions)[:3], seconds=24))
    run.start()
    try:
        await run.wait_for(lambda: run.all_streams_out_since(run.t0), 90, "first windows")
        await run.at_media(10)
        t_kill = await _kill(first)
        await asyncio.sleep(2)
        second = pipeline.start_worker()
        await run.wait_for(lambda: run.all_streams_out_since(t_kill), 90, "the new worker")
        resume = run.resume_s(t_kill)
        await run.finish()
    finally:
        await run.cancel()
    run.check("SIGKILL of the only worker, a new one 2 s later",
              figures=(_resumed(resume, "the kill"),
                       _restores(pipeline, [second])))
    assert resume <= RESUME_MAX_S


async def _sigkill_one(pipeline: Any, workers: int, streams: int, seconds: float,
                       what: str) -> None:
    """``workers`` light workers share the partitions; once all emit, SIGKILL one."""
    s = pipeline.settings
    procs = [pipeline.start_worker(MMSYNC_MODELS="light") for _ in range(workers)]
    run = LiveRun(pipeline, specs(stream_ids(s.partitions)[:streams], seconds=seconds))
    run.start()
    try:
        await run.wait_for(lambda: run.all_streams_out_since(run.t0), 120, "first windows")
        await all_emitting(pipeline, procs, 90)
        t_kill = await _kill(procs[0])
        await run.wait_for(lambda: run.all_streams_out_since(t_kill), 60, "takeover")
        resume = run.resume_s(t_kill)
        await run.finish()
    finally:
        await run.cancel()
    survivors = procs[1:]
    assert all(w.poll() is None for w in survivors)
    run.check(what, figures=(_resumed(resume, "the kill"), _restores(pipeline, survivors)))
    assert resume <= RESUME_MAX_S


@ON_BOTH
async def test_sigkill_of_one_of_two_workers(pipeline):
    await ensure_topics(pipeline.settings)  # 4 partitions
    await _sigkill_one(pipeline, 2, 4, 30, "two workers on 4 partitions, SIGKILL one")


async def _partitions(pipeline: Any, n: int) -> Any:
    pipeline.env["MMSYNC_PARTITIONS"] = str(n)
    s = pipeline.settings = pipeline.settings.model_copy(update={"partitions": n})
    await ensure_topics(s)
    return s


@ON_BOTH
async def test_sigkill_of_one_of_three_workers(pipeline):
    await _partitions(pipeline, 8)
    await _sigkill_one(pipeline, 3, 6, 36, "three workers on 8 partitions, SIGKILL one")


@ON_BOTH
async def test_sigkill_of_one_worker_of_each_kind_in_a_split_group(pipeline):
    """The deployment of docs/operations.md ("Captions and sound in their own workers"):
    two workers run the text and audio agents, two the image agent and the aligner, in
    one group. A text/audio worker is SIGKILLed, then, once the other holds its input
    partitions, an image/aligner worker: each survivor takes over its kind's partitions,
    and no input is lost or late, though the aligner's progress marks for captions and
    sound now come from another process than its frames'."""
    s = pipeline.settings
    await ensure_topics(s)  # 4 partitions
    sound = [pipeline.start_worker(MMSYNC_MODELS="light", MMSYNC_AGENTS="text,audio")
             for _ in range(2)]
    picture = [pipeline.start_worker(MMSYNC_MODELS="light", MMSYNC_AGENTS="image,aligner")
               for _ in range(2)]

    def parts() -> str:
        return "; ".join(f"worker {i}: " + ", ".join(
            f"{m} {held(pipeline, w, s.topic(m))}" for m in ("text", "audio", "image",
                                                              "features"))
            for i, w in enumerate([*sound, *picture]))

    # 55 s of media: the second kill must come while the streams still run, after the
    # first windows, the first takeover (10-12 s here) and windows after it
    run = LiveRun(pipeline, specs(stream_ids(s.partitions), seconds=55))
    run.start()
    try:
        await run.wait_for(lambda: run.all_streams_out_since(run.t0), 120, "first windows")
        await all_emitting(pipeline, picture, 90)
        t_sound = await _kill(sound[0])
        try:
            await run.wait_for(
                lambda: all(len(held(pipeline, sound[1], s.topic(m))) == s.partitions
                            for m in ("text", "audio")), 60, "the text/audio survivor's takeover")
        except AssertionError as exc:
            raise AssertionError(f"partitions held: {parts()}\n{exc}") from None
        t_took = time.monotonic()
        took = t_took - t_sound
        await run.wait_for(lambda: run.all_streams_out_since(t_took), 30,
                           "windows after the text/audio takeover")
        t_picture = await _kill(picture[0])
        await run.wait_for(lambda: run.all_streams_out_since(t_picture), 60,
                           "the image/aligner survivor's takeover")
        resume = run.resume_s(t_picture)
        await run.finish()
    finally:
        await run.cancel()
    survivors = [sound[1], picture[1]]
    assert all(w.poll() is None for w in survivors)
    run.check("two text/audio and two image/aligner workers on 4 partitions, SIGKILL one of"
              " each", figures=(f"the text/audio survivor held every text and audio partition"
                                f" {took:.1f} s after the kill",
                                _resumed(resume, "the image/aligner kill"),
                                _restores(pipeline, [picture[1]])))
    assert resume <= RESUME_MAX_S


@ON_BOTH
async def test_a_worker_joins_and_one_leaves_under_load(pipeline):
    """A stream on every one of the 8 partitions, so that every worker always holds
    partitions that carry one and must emit. With 6 streams two partitions carried none,
    and Faust's sticky assignor (each worker keeps up to ceil(8/4) = 2 of its partitions)
    could leave a worker, or the joiner, with only those two: on Apache Kafka 2 runs of
    3 failed so, one worker's window count frozen after the join (Kafka's member ids
    order the group differently from Tansu's). The check names each worker's features
    partitions when it fails."""
    s = await _partitions(pipeline, 8)
    workers = [pipeline.start_worker(MMSYNC_MODELS="light") for _ in range(3)]
    run = LiveRun(pipeline, specs(stream_ids(s.partitions), seconds=50))
    run.start()
    try:
        await run.wait_for(lambda: run.all_streams_out_since(run.t0), 120, "first windows")
        await all_emitting(pipeline, workers, 90)
        t_join = time.monotonic()
        joiner = pipeline.start_worker(MMSYNC_MODELS="light")
        await run.wait_for(lambda: metric(pipeline, joiner, "mmsync_windows_total") > 0, 90,
                           "the joiner emitting")
        joined = time.monotonic() - t_join
        await run.wait_for(lambda: run.all_streams_out_since(t_join + joined), 60,
                           "steady after the join")
        await all_emitting(pipeline, [*workers, joiner], 60)
        t_leave = time.monotonic()
        await asyncio.to_thread(stop_process, workers[0], signal.SIGTERM)
        await run.wait_for(lambda: run.all_streams_out_since(t_leave), 60, "after the leave")
        resume = run.resume_s(t_leave)
        await run.finish()
    finally:
        await run.cancel()
    survivors = [*workers[1:], joiner]
    assert all(w.poll() is None for w in survivors)
    run.check("three workers on 8 partitions, 8 streams, a fourth joins, one leaves (SIGTERM)",
              figures=(f"the joiner's first window {joined:.1f} s after its start",
                       _resumed(resume, "the leave"),
                       _restores(pipeline, survivors)))
    assert resume <= RESUME_MAX_S


@ON_BOTH
async def test_a_worker_stopped_mid_batch_commits_none_of_it(pipeline):
    """SIGTERM while a batch of frames is in the image model: its features never reached
    the broker, so the worker must not commit it, and the next worker extracts it. Faust's
    take_events acks the batch it yielded whatever ends the loop, and the worker's last
    commit covered it: a join/leave run lost 2 frames of each of 2 partitions so
    (2026-12-05). The worker holds such a batch (app.kafka.commitguard.hold); without the
    hold this test finds the batch's partitions committed. A drill makes each batch of
    frames take 8 s longer, so that the SIGTERM lands inside one."""
    s = pipeline.settings
    await ensure_topics(s)
    slow = pipeline.start_worker(MMSYNC_MODELS="light", MMSYNC_DRILL_EXTRACT_S="8")
    await asyncio.to_thread(pipeline.wait_ready, slow)
    frames = [r for r in synth_records([SynthSpec(stream_id=sid, seconds=2, fps=5)
                                        for sid in stream_ids(s.partitions)])
              if r[0] == "image"]
    await publish(s, frames, progress=False)
    deadline = time.monotonic() + 60
    while metric(pipeline, slow, "mmsync_batch_size_count") < 1:  # a batch is in the drill
        assert time.monotonic() < deadline, f"no batch taken\n{pipeline.logs()}"
        await asyncio.sleep(0.1)
    await asyncio.to_thread(stop_process, slow)  # SIGTERM; the drill ends within 8 s
    image = [TopicPartition(s.topic("image"), p) for p in range(s.partitions)]
    offsets = GroupOffsets(s, f"mmsync-{s.topic_prefix}")
    try:
        committed = await offsets.committed(image)
    finally:
        await offsets.close()
    assert all(off < 0 for off in committed.values()), (
        f"the unfinished batch was committed: {committed}\n{pipeline.logs()}")

    pipeline.start_worker(MMSYNC_MODELS="light")
    per = Counter(default_partition(key, s.partitions) for _, key, _ in frames)
    want = {("image", p, o) for p, n in per.items() for o in range(n)}
    got = await feature_inputs(s, until=want, timeout_s=120)
    assert want <= got, f"{len(want - got)} frames never extracted\n{pipeline.logs()}"


@ON_BOTH
async def test_image_models_slow_to_load(pipeline):
    """A worker whose image models take 10 s longer to load, with the load published from
    its start: it joins the group only once they are loaded (the records wait in Kafka),
    so no window closes without its frames. Before issue 29 it joined first, and
    progress marks were what kept audio and captions from closing those windows."""
    s = pipeline.settings
    await ensure_topics(s)
    worker = pipeline.start_worker(MMSYNC_MODELS="light", MMSYNC_DRILL_IMAGE_LOAD_S="10")
    run = LiveRun(pipeline, specs(stream_ids(s.partitions)[:3], seconds=24))
    run.start()
    try:
        await run.wait_for(lambda: run.all_streams_out_since(run.t0), 120, "first windows")
        first = time.monotonic() - run.t0
        await run.finish()
    finally:
        await run.cancel()
    assert worker.poll() is None
    run.check("one worker whose image models take 10 s to load, publishing from its start",
              figures=(f"first window of every stream {first:.1f} s after publishing began",))
