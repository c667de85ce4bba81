"""Apache Kafka, the production broker: a local KRaft node the project fetches, starts
and stops, ``mmsync broker --kafka``, and a worker on it with no embedded-broker
workaround (issue 24)."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from uuid import uuid4

import msgpack
import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import UnknownTopicOrPartitionError

from app.clients.collect import collect
from app.clients.produce import publish
from app.clients.synth import SynthSpec, synth_records
from app.kafka.apache import KafkaNode, metadata_brokers
from app.kafka.clients import default_partition, make_producer
from app.kafka.embedded import free_port
from app.kafka.topics import ensure_topics
from app.runtime.process import spawn_worker, stop_process, worker_env
from app.settings import Settings
from tests.integration.brokers import KAFKA_VERSION, process_group_alive
from tests.integration.faults import stream_ids

pytestmark = pytest.mark.integration

#: issue 24's goal: `mmsync broker --kafka` answers within this, s
START_GOAL_S = 30
TIMEOUT = 90


async def _partitions(s: Settings, topics: list[str]) -> dict[str, int]:
    """Partition count of each of ``topics`` that exists. Ask only about topics that
    exist on a broker with auto-creation on: aiokafka's metadata requests ask for it
    (allow_auto_topic_creation is true from Metadata v4 on)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=s.bootstrap)
    await admin.start()
    try:
        return {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics(topics)
                if t["error_code"] == 0}
    finally:
        await admin.close()


async def test_node_with_kafka_defaults_starts_creates_on_produce_and_stops_clean(tmp_path):
    node = KafkaNode(version=KAFKA_VERSION, auto_create=True, num_partitions=1,
                     log_path=tmp_path / "kafka.log")
    with node:
        assert node.start_s is not None and node.start_s < START_GOAL_S
        pid, workdir = node.pid, node.workdir
        assert pid is not None and process_group_alive(pid)
        assert workdir is not None and (workdir / "data" / "meta.properties").exists()
        # Kafka's own defaults: the first produce to a topic makes it, with one partition
        s = Settings(broker=node.url)
        producer = make_producer(s)
        await producer.start()
        try:
            await producer.send_and_wait("made-on-produce", b"v", key=b"k")
        finally:
            await producer.stop()
        assert await _partitions(s, ["made-on-produce"]) == {"made-on-produce": 1}
    # stopped: the JVM's whole process group is gone, its storage too, the port is silent
    assert not process_group_alive(pid)
    assert not workdir.exists() and node.workdir is None
    assert metadata_brokers(node.host, node.port, timeout=0.5) is None
    assert "Kafka Server started" in (tmp_path / "kafka.log").read_text(errors="replace")


async def test_production_node_does_not_create_topics(kafka):
    s = Settings(broker=kafka.url)
    producer = make_producer(s, request_timeout_ms=3000)
    await producer.start()
    try:
        with pytest.raises(UnknownTopicOrPartitionError):
            await producer.send_and_wait(f"it-{uuid4().hex}", b"v")
    finally:
        await producer.stop()


def _child_pids(pid: int) -> list[int]:
    """Live children of ``pid`` (Linux /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def test_broker_kafka_command_prints_export_and_stops_its_jvm_on_sigterm():
    port = free_port()
    cmd = [sys.executable, "-m", "app.cli", "broker", "--kafka", "--port", str(port),
           "--kafka-version", KAFKA_VERSION]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        # raw reads of the pipe (a buffered readline could hold the second line back
        # while select() says nothing more is coming)
        t0, out, export = time.monotonic(), b"", None
        while export is None and time.monotonic() - t0 < START_GOAL_S:
            ready, _, _ = select.select([proc.stdout], [], [], 0.5)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                out += chunk
                export = re.search(rb"export MMSYNC_BROKER=(\S+)\n", out)
        assert export is not None, out.decode(errors="replace")
        assert export.group(1) == f"kafka://127.0.0.1:{port}".encode()
        assert b"MMSYNC_BROKER_EMBEDDED" not in out
        assert (metadata_brokers("127.0.0.1", port) or 0) >= 1
        [jvm] = _child_pids(proc.pid)
        assert "kafka.Kafka" in Path(f"/proc/{jvm}/cmdline").read_text()
        proc.send_signal(signal.SIGTERM)  # to mmsync alone, not to the JVM's group
        assert proc.wait(timeout=30) == 0
        assert not process_group_alive(jvm)
        assert metadata_brokers("127.0.0.1", port, timeout=0.5) is None
    finally:
        if proc.poll() is None:  # stopped as a user would, so its temporary folder goes too
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.mark.parametrize("pipeline", ["kafka", "kafka_defaults"], indirect=True)
async def test_light_worker_on_kafka_accounts_for_every_input(pipeline):
    pl = pipeline
    s = pl.settings
    assert not s.broker_embedded and "MMSYNC_BROKER_EMBEDDED" not in os.environ
    await ensure_topics(s)
    pl.start_worker(MMSYNC_MODELS="light")
    recs = list(synth_records([SynthSpec(stream_id="k-a", seconds=3, seed=5),
                               SynthSpec(stream_id="k-b", seconds=3, seed=6)]))
    recs.insert(7, ("image", b"k-a", os.urandom(64)))
    recs.insert(15, ("text", b"k-b", msgpack.packb({"v": 1, "stream_id": "k-b"})))
    pub = await publish(s, recs, progress=False)
    out = await collect(s, until=lambda o: o.accounted >= pub.total, timeout_s=TIMEOUT)
    assert out.accounted == pub.total, pl.logs()
    assert sorted(d["error"] for d in out.dlq) == ["bad_msgpack", "schema"]
    sent = Counter(m for m, _, _ in recs)
    for m in ("image", "audio", "text"):
        assert out.merged(m) == sent[m] - (m in ("image", "text"))
    assert not out.late and out.duplicate_records == 0
    # nothing of ours was made by the broker's auto-creation (1 partition on the defaults)
    ours = [s.topic(n) for n in ("text", "image", "audio", "features", "aligned", "late",
                                 "alerts", "dlq", "skew")]
    assert set((await _partitions(s, ours)).values()) == {s.partitions}


async def test_broker_restart_mid_run_loses_nothing_and_skips_nothing(tmp_path):
    """Apache Kafka (production's configuration) stopped with SIGTERM under a running
    worker, 5 s down, started again on the same ports and storage
    (``KafkaNode.restart``), a node of its own so that no other test sees the outage.

    Three loads: one the worker has processed before the stop; one published right
    before it (in flight at the stop); one after the restart, on every partition, the
    ones the worker had read before included. The worker must survive and every input
    of the three come out merged, exactly: nothing lost, nothing skipped, nothing late,
    no window id again with fewer inputs. On the embedded broker a restart loses
    everything (``test_broker_trouble.py``); here the logs and the committed offsets
    stay, so the worker must carry on where it was (docs/broker.md)."""
    nparts = 4
    node = KafkaNode(version=KAFKA_VERSION, log_path=tmp_path / "kafka.log")
    with node:
        s = Settings(broker=node.url, topic_prefix=f"kr-{uuid4().hex[:10]}", partitions=nparts,
                     data_dir=tmp_path / "data", idle_ms=1500)
        await ensure_topics(s)
        worker = spawn_worker(worker_env(s, MMSYNC_MODELS="light"), tmp_path / "worker.log")
        try:
            before = [SynthSpec(stream_id=sid, seconds=3, seed=5 + k)
                      for k, sid in enumerate(stream_ids(nparts, "kr-before")[:2])]
            pub1 = await publish(s, list(synth_records(before)), progress=False)
            out1 = await collect(s, until=lambda o: o.accounted >= pub1.total, timeout_s=TIMEOUT)
            assert out1.accounted == pub1.total, _tail(tmp_path / "worker.log")
            used = {default_partition(sp.stream_id.encode(), nparts) for sp in before}

            flight = [SynthSpec(stream_id="kr-flight", seconds=3, seed=9)]
            pub2 = await publish(s, list(synth_records(flight)), progress=False)
            # the main thread (the JVM's parent-death signal follows the starting thread);
            # nothing else of this process runs meanwhile
            t_down = time.monotonic()
            node.restart(down_s=5)
            t_up = time.monotonic()
            assert worker.poll() is None, "the worker died while the broker was away"

            after = [SynthSpec(stream_id=sid, seconds=3, seed=20 + k)
                     for k, sid in enumerate(stream_ids(nparts, "kr-after"))]
            assert used <= {default_partition(sp.stream_id.encode(), nparts) for sp in after}
            pub3 = await publish(s, list(synth_records(after)), progress=False)
            total = pub1.total + pub2.total + pub3.total
            first: list[float] = []
            out = await collect(s, until=lambda o: o.accounted >= total, timeout_s=120,
                                on_window=lambda w: None if first or not w["stream_id"]
                                .startswith("kr-after") else first.append(time.monotonic()))
            log = _tail(tmp_path / "worker.log", 100_000)
            print(f"\nKafka restart: down {t_up - t_down:.1f} s (start {node.start_s:.1f} s); "
                  f"{pub1.total} before, {pub2.total} in flight, {pub3.total} after; "
                  f"{out.accounted}/{total} accounted ({out.merged()} merged, "
                  f"{len(out.late)} late, {len(out.dlq)} dlq, windows again "
                  f"{out.duplicate_windows}, records again {out.duplicate_records}); first "
                  f"window of the after load {(first[0] - t_up) if first else float('nan'):.1f}"
                  f" s after the broker was back")
            if out.late:
                print("late:", Counter((e.get("stream_id"), e.get("modality")) for e in out.late))
            assert worker.poll() is None, log[-3000:]
            assert out.accounted == total and out.accounted_newest == total, log[-3000:]
            # Every input merged, none skipped, dead or late. Until the aligner stopped
            # trusting a "drained" mark that a record read from beyond its end contradicts
            # (app.align.progress), 8 to 21 inputs of the load in flight at the stop went
            # late in about half the runs (docs/broker.md).
            assert not out.dlq and not out.late, log[-3000:]
            assert out.merged() == total, log[-3000:]
            assert not out.shrunk, out.shrunk[:3]
            assert "Traceback" not in log, log[-3000:]
        finally:
            stop_process(worker)


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""
