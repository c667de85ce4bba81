"""Topics at start, and sends that cannot crash a worker (issue 23).

Each test starts from what a user would have: the README's flow verbatim on a
broker of its own, a worker first on an empty broker, input topics an operator
made beforehand, a topic with the wrong partition count, a topic deleted under a
running worker. The embedded broker, like Apache Kafka with its defaults, makes a
missing topic on the first request that names it, with its own count (Tansu: 4):
the tests run with 8 partitions, so a topic the broker made instead of mmsync
shows. Every worker runs the light models (the topics are the point here).
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from app.clients.collect import collect
from app.clients.produce import publish
from app.clients.synth import SynthSpec, synth_records
from app.errors import TopicConfigError
from app.kafka.embedded import free_port
from app.kafka.topics import ALL_TOPICS, MAX_MESSAGE_BYTES, ensure_topics
from app.runtime.process import stop_process
from app.settings import Settings
from tests.integration.brokers import ON_EVERY

pytestmark = pytest.mark.integration

CLIP = Path(__file__).resolve().parents[1] / "data" / "corpus" / "en-music.mp4"
PARTITIONS = 8
TIMEOUT = 90


def _eight(pipeline: Any) -> Settings:
    """The pipeline fixture's settings with 8 partitions (the default, and not Tansu's 4)."""
    pipeline.env["MMSYNC_PARTITIONS"] = str(PARTITIONS)
    s: Settings = pipeline.settings.model_copy(update={"partitions": PARTITIONS})
    pipeline.settings = s
    return s


async def _partitions(s: Settings) -> dict[str, int]:
    """Topic -> partition count, for every topic of ``s``'s prefix (one metadata request
    for all topics: it makes none)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=s.bootstrap)
    await admin.start()
    try:
        return {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics()
                if t["topic"].startswith(f"{s.topic_prefix}.")}
    finally:
        await admin.close()


async def _make(s: Settings, names: list[str], partitions: int) -> None:
    """Topics made by an operator's admin client: no configs, the count given."""
    admin = AIOKafkaAdminClient(bootstrap_servers=s.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(s.topic(n), partitions, 1) for n in names])
    finally:
        await admin.close()


def _send_errors(metrics: str) -> dict[tuple[str, str], float]:
    return {(m[1], m[2]): float(m[3]) for m in re.finditer(
        r'mmsync_send_errors_total\{reason="(\w+)",topic="(\w+)"\} (\S+)', metrics)}


async def _run_a_producer_after_the_worker(pipeline: Any, s: Settings, worker: Any,
                                           what: str) -> None:
    """Once the worker serves /metrics (its topics were made or checked before that), a
    producer of the user's own (no topic check) publishes; every input must come out."""
    t0 = time.monotonic()
    pipeline.metrics(worker, timeout_s=60)
    t_up = time.monotonic() - t0
    have = await _partitions(s)
    assert have == {s.topic(n): PARTITIONS for n in ALL_TOPICS}, have
    recs = list(synth_records([SynthSpec(stream_id=f"{what}-{i}", seconds=3, seed=i + 1)
                               for i in range(3)]))
    pub = await publish(s, recs, progress=False)
    out = await collect(s, until=lambda o: o.accounted >= pub.total, timeout_s=TIMEOUT)
    metrics = pipeline.metrics(worker)
    print(f"\n{what}: worker serving {t_up:.1f} s after start; {pub.total} inputs, "
          f"{out.accounted} accounted ({out.merged()} merged, {len(out.late)} late)")
    assert worker.poll() is None, pipeline.logs()
    assert out.accounted == pub.total and out.merged() == pub.total, pipeline.logs()
    assert not any(_send_errors(metrics).values()), _send_errors(metrics)
    assert "Traceback" not in pipeline.logs(), pipeline.logs()


@ON_EVERY
async def test_worker_first_on_an_empty_broker(pipeline):
    """The issue's first case: before, the progress marks went to partitions 4..7 of a
    features topic the broker had made with 4, and the worker crashed (0 inputs out)."""
    s = _eight(pipeline)
    assert await _partitions(s) == {}
    worker = pipeline.start_worker(MMSYNC_MODELS="light")
    await _run_a_producer_after_the_worker(pipeline, s, worker, "empty")


async def test_worker_after_an_operator_made_the_input_topics(pipeline):
    """The issue's second case: the input topics made beforehand with 8 partitions, as
    docs/clients.md asks, and nothing else."""
    s = _eight(pipeline)
    await _make(s, ["text", "image", "audio"], PARTITIONS)
    worker = pipeline.start_worker(MMSYNC_MODELS="light")
    await _run_a_producer_after_the_worker(pipeline, s, worker, "inputs-first")


async def test_a_topic_with_another_count_stops_worker_and_producer(pipeline):
    """One clear line and a non-zero exit within 10 s, before anything is consumed or
    made; ``mmsync produce`` refuses the same way before it sends anything."""
    s = _eight(pipeline)
    await _make(s, ["image"], 4)
    # frames waiting on it: a worker that consumed anything would form its group
    frames = [r for r in synth_records([SynthSpec(stream_id="w", seconds=1)]) if r[0] == "image"]
    await publish(s, frames, progress=False)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MMSYNC_")},
           **pipeline.env, "MMSYNC_MODELS": "light"}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "app.cli", "worker"], env=env,
                       capture_output=True, text=True, timeout=60)
    wall = time.monotonic() - t0
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    print(f"\nwrong count: worker exit {r.returncode} after {wall:.1f} s: {lines}")
    assert r.returncode not in (0, None)
    assert wall < 10
    assert len(lines) == 1 and not r.stdout.strip(), r.stdout + r.stderr
    assert (f"topic {s.topic('image')} has 4 partitions, MMSYNC_PARTITIONS is {PARTITIONS}"
            in lines[0]), lines
    # nothing made (the check comes before any creation) and no group formed
    assert await _partitions(s) == {s.topic("image"): 4}
    admin = AIOKafkaAdminClient(bootstrap_servers=s.bootstrap)
    await admin.start()
    try:
        groups = [g[0] for g in await admin.list_consumer_groups()]
    finally:
        await admin.close()
    assert f"mmsync-{s.topic_prefix}" not in groups

    r = subprocess.run([sys.executable, "-m", "app.cli", "produce", "--text", "hello",
                        "--quiet"], env=env, capture_output=True, text=True, timeout=60)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode not in (0, None) and len(lines) == 1, r.stdout + r.stderr
    assert lines[0].startswith("mmsync produce: topic ") and "4 partitions" in lines[0]
    assert "published" not in r.stdout


async def test_check_only_and_what_is_made(pipeline):
    """``MMSYNC_CREATE_TOPICS=false`` (no create ACL) names a missing topic and makes
    nothing; otherwise every topic is made with the count and the configs mmsync needs,
    and a second call finds them all there."""
    s = _eight(pipeline)
    with pytest.raises(TopicConfigError, match=r"does not exist and MMSYNC_CREATE_TOPICS is "
                       r"false") as err:
        await ensure_topics(s.model_copy(update={"create_topics": False}))
    assert err.value.topic == s.topic(ALL_TOPICS[0])
    assert await _partitions(s) == {}
    made = await ensure_topics(s)
    assert set(made.created) == {s.topic(n) for n in ALL_TOPICS} and not made.existing
    again = await ensure_topics(s.model_copy(update={"create_topics": False}))
    assert set(again.existing) == set(made.created) and not again.created
    assert not again.warnings
    admin = AIOKafkaAdminClient(bootstrap_servers=s.bootstrap)
    await admin.start()
    try:
        [resp] = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, s.topic(n)) for n in ("skew", "image")])
    finally:
        await admin.close()
    cfg = {r[3]: dict((e[0], e[1]) for e in r[4]) for r in resp.resources}
    assert cfg[s.topic("skew")]["cleanup.policy"] == "compact"
    assert cfg[s.topic("image")]["max.message.bytes"] == str(MAX_MESSAGE_BYTES)


def _inputs_of(out: Any, streams: set[str]) -> int:
    """Inputs of ``streams`` accounted for: merged into a window (its ``sources``), late,
    or dead-lettered; each once."""
    seen = {tuple(src) for w in out.windows if w["stream_id"] in streams
            for src in w["sources"]}
    seen |= {(lt["modality"], *lt["src"]) for lt in out.late if lt["stream_id"] in streams}
    return len(seen) + sum(1 for d in out.dlq if d["key"] and d["key"].decode() in streams)


async def test_a_topic_deleted_under_a_running_worker(pipeline):
    """``PREFIX.aligned`` deleted while the worker runs and sends to it: the worker stays
    up, makes it again with 8 partitions (not the broker's 4), says so in one line,
    counts it, and every input of streams published from then on is accounted for.

    On the embedded broker a deleted topic's records linger and collide with the new
    topic's (docs/broker.md): sends fail with UnknownError for a few seconds and are
    sent again; the windows of before the deletion may come back or not, so only the
    streams published after it are counted."""
    s = _eight(pipeline)
    await ensure_topics(s)
    worker = pipeline.start_worker(MMSYNC_MODELS="light")
    pipeline.metrics(worker, timeout_s=60)
    before = await publish(s, list(synth_records([SynthSpec(stream_id="before", seconds=3)])),
                           progress=False)
    out = await collect(s, until=lambda o: o.accounted >= before.total, timeout_s=TIMEOUT)
    assert out.accounted == before.total, pipeline.logs()

    admin = AIOKafkaAdminClient(bootstrap_servers=s.bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([s.topic("aligned")])
    finally:
        await admin.close()
    t0 = time.monotonic()
    # a metadata request for all topics: naming the topic would make the broker create it
    while s.topic("aligned") not in (have := await _partitions(s)):
        assert time.monotonic() - t0 < 30, "the worker did not make the topic again"
        assert worker.poll() is None, pipeline.logs()
        time.sleep(0.5)
    t_back = time.monotonic() - t0
    assert have[s.topic("aligned")] == PARTITIONS
    streams = {f"after-{i}" for i in range(3)}
    after = await publish(s, list(synth_records([SynthSpec(stream_id=sid, seconds=3, seed=i + 2)
                                                 for i, sid in enumerate(sorted(streams))])),
                          progress=False)
    out = await collect(s, until=lambda o: _inputs_of(o, streams) >= after.total,
                        timeout_s=TIMEOUT)
    metrics = pipeline.metrics(worker)
    logs = pipeline.logs()
    print(f"\ndeleted aligned: made again {t_back:.1f} s later; {after.total} inputs after "
          f"it, {_inputs_of(out, streams)} accounted; send errors "
          f"{ {k: v for k, v in _send_errors(metrics).items() if v} }")
    assert worker.poll() is None, logs
    assert _inputs_of(out, streams) == after.total, logs
    assert re.search(r'mmsync_topic_faults_total\{fault="missing",topic="aligned"\} [1-9]',
                     metrics), metrics
    assert logs.count(f"topics {s.topic('aligned')} are gone") == 1, logs
    assert "Traceback" not in logs and "crash" not in logs, logs


async def test_features_made_again_with_another_count_under_a_running_worker(pipeline):
    """The issue's crash path itself, at run time: ``PREFIX.features`` deleted and made
    again with 4 partitions (as a broker's auto-creation would) while the worker sends
    progress marks to partitions 0..7 by number. The worker says what is wrong (once per
    change), sends its marks to the partitions that exist, counts the others in
    ``mmsync_send_errors_total{topic="features",reason="unknown_partition"}`` and stays
    up. What it cannot do is keep stream_id keys on their partitions: no accounting is
    promised here, the error line tells the operator to make new topics."""
    s = _eight(pipeline)
    await ensure_topics(s)
    worker = pipeline.start_worker(MMSYNC_MODELS="light")
    pipeline.metrics(worker, timeout_s=60)
    pub = await publish(s, list(synth_records([SynthSpec(stream_id="m", seconds=2)])),
                        progress=False)
    out = await collect(s, until=lambda o: o.accounted >= pub.total, timeout_s=TIMEOUT)
    assert out.accounted == pub.total, pipeline.logs()
    admin = AIOKafkaAdminClient(bootstrap_servers=s.bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([s.topic("features")])
        await admin.create_topics([NewTopic(s.topic("features"), 4, 1)])
    finally:
        await admin.close()
    t0 = time.monotonic()
    skipped = 0.0
    while skipped == 0:  # the worker's next topic check (10 s) refreshes its metadata
        assert time.monotonic() - t0 < 30, pipeline.logs()
        assert worker.poll() is None, pipeline.logs()
        time.sleep(1)
        skipped = _send_errors(pipeline.metrics(worker))[("unknown_partition", "features")]
    time.sleep(3)  # six more rounds of marks
    metrics, logs = pipeline.metrics(worker), pipeline.logs()
    print(f"\nfeatures made again with 4: marks to partitions 4..7 skipped "
          f"{_send_errors(metrics)[('unknown_partition', 'features')]:.0f} times in "
          f"{time.monotonic() - t0:.1f} s; worker alive: {worker.poll() is None}")
    assert worker.poll() is None, logs
    assert re.search(r'mmsync_topic_faults_total\{fault="partitions",topic="features"\} '
                     r'[1-9]', metrics), metrics
    assert (f"topic {s.topic('features')} has 4 partitions now, MMSYNC_PARTITIONS is "
            f"{PARTITIONS}") in logs
    assert f"progress marks not sent to {s.topic('features')} partitions [4, 5, 6, 7]" in logs
    assert "Traceback" not in logs and "crash" not in logs.lower(), logs


def test_readme_flow_verbatim(tmp_path: Path) -> None:
    """README, "Running it yourself": ``mmsync broker`` in one shell, ``mmsync worker`` in
    another with the variables the broker printed, then ``mmsync produce --video``. Before
    issue 23 this worker crashed 5-10 s after its start with no input at all."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("MMSYNC_")}
    broker = subprocess.Popen([sys.executable, "-m", "app.cli", "broker",
                               "--port", str(free_port())], env=base, stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    worker = None
    try:
        assert broker.stdout is not None
        exports: dict[str, str] = {}
        while not exports:
            line = broker.stdout.readline()
            assert line, "mmsync broker printed no export line"
            if "export " in line:
                exports = dict(kv.split("=", 1) for kv in line.split("export ", 1)[1].split())
        env = {**base, **exports, "MMSYNC_DATA_DIR": str(tmp_path / "data"),
               "MMSYNC_WEB_PORT": str(free_port()), "MMSYNC_MODELS": "light"}
        log = tmp_path / "worker.log"
        with open(log, "wb") as out:
            worker = subprocess.Popen([sys.executable, "-m", "app.cli", "worker"], env=env,
                                      stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        s = Settings(broker=exports["MMSYNC_BROKER"], broker_embedded=True)
        _wait_for_metrics(int(env["MMSYNC_WEB_PORT"]), worker, log)
        time.sleep(10)  # where the worker used to crash, before any input
        assert worker.poll() is None, log.read_text(errors="replace")[-3000:]
        r = subprocess.run([sys.executable, "-m", "app.cli", "produce", "--video", str(CLIP)],
                           env={**base, **exports}, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        total = int(re.search(r"published (\d+) records", r.stdout).group(1))  # type: ignore[union-attr]
        out = asyncio.run(collect(s, until=lambda o: o.accounted >= total, timeout_s=TIMEOUT))
        text = log.read_text(errors="replace")
        print(f"\nREADME flow: {total} records published, {out.accounted} accounted "
              f"({out.merged()} merged, {len(out.late)} late, {len(out.dlq)} dead letters)")
        assert worker.poll() is None, text[-3000:]
        assert out.accounted == total and not out.dlq, text[-3000:]
        assert "Traceback" not in text and "crash" not in text, text[-3000:]
    finally:
        if worker is not None:
            stop_process(worker)
        stop_process(broker)  # type: ignore[arg-type]


def _wait_for_metrics(port: int, proc: subprocess.Popen[bytes], log: Path,
                      timeout_s: float = 60) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",  # noqa: S310
                                        timeout=2):
                return
        except OSError:
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.3)
