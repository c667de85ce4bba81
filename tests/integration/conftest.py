"""Real brokers per session (the embedded Tansu; Apache Kafka on demand), one set per
pytest-xdist process (``make test`` runs two); a fresh topic prefix and worker per test.

The Kafka nodes start only when a test asks for them (``kafka``, ``kafka_defaults``, or
``pipeline`` parametrized with one of their names), from the jars ``make kafka``
fetched (which version: ``tests/integration/brokers.py``).
"""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from uuid import uuid4

import pytest

from app.kafka.apache import KafkaNode
from app.kafka.embedded import EmbeddedBroker, free_port
from app.runtime.process import spawn_worker, stop_process, worker_env
from app.settings import Settings
from tests.integration.brokers import KAFKA_VERSION, process_group_alive


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    log = tmp_path_factory.mktemp("broker") / "tansu.log"
    with EmbeddedBroker(log_path=log) as b:
        yield b


def _kafka_node(tmp_path_factory: pytest.TempPathFactory, name: str, *, auto_create: bool,
                num_partitions: int = 1) -> Iterator[KafkaNode]:
    log = tmp_path_factory.mktemp(name) / "kafka.log"
    with KafkaNode(version=KAFKA_VERSION, log_path=log, auto_create=auto_create,
                   num_partitions=num_partitions) as node:
        pid = node.pid
        yield node
    assert pid is not None and not process_group_alive(pid), f"Kafka's JVM {pid} outlived stop()"


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaNode]:
    """Apache Kafka as production runs it (docker-compose.yml): topic auto-creation off."""
    yield from _kafka_node(tmp_path_factory, "kafka", auto_create=False)


@pytest.fixture(scope="session")
def kafka_defaults(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaNode]:
    """Apache Kafka with its own defaults: auto-creation on, ``num.partitions=1``."""
    yield from _kafka_node(tmp_path_factory, "kafka-defaults", auto_create=True,
                           num_partitions=1)


@dataclass
class Pipeline:
    settings: Settings
    env: dict[str, str]
    tmp: Path
    procs: list[subprocess.Popen[bytes]]

    def start_worker(self, **extra: str) -> subprocess.Popen[bytes]:
        env = {**self.env, "MMSYNC_WEB_PORT": str(free_port()), **extra}
        n = len(self.procs)
        p = spawn_worker(env, self.tmp / f"worker{n}.log")
        p.web_port = int(env["MMSYNC_WEB_PORT"])  # type: ignore[attr-defined]
        self.procs.append(p)
        return p

    def metrics(self, proc: subprocess.Popen[bytes], timeout_s: float = 30) -> str:
        deadline = time.monotonic() + timeout_s
        url = f"http://127.0.0.1:{proc.web_port}/metrics"  # type: ignore[attr-defined]
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - loopback
                    return r.read().decode()
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)

    def wait_ready(self, proc: subprocess.Popen[bytes], timeout_s: float = 240) -> str:
        """Poll the worker's ``GET /ready`` until it answers 200; its last answer. Fails
        (with the logs) if the worker exits or ``timeout_s`` passes first."""
        deadline = time.monotonic() + timeout_s
        url = f"http://127.0.0.1:{proc.web_port}/ready"  # type: ignore[attr-defined]
        said = "port closed"
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"the worker exited ({proc.returncode})\n{self.logs()}"
            try:
                with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - loopback
                    return r.read().decode()
            except urllib.error.HTTPError as exc:  # 503: up, not ready yet
                said = exc.read().decode()
            except OSError:
                pass  # not listening yet: the models are loading
            time.sleep(0.2)
        raise AssertionError(f"not ready after {timeout_s} s ({said.strip()})\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:]
                         for p in sorted(self.tmp.glob("worker*.log")))


def _pipeline(url: str, embedded: bool, tmp_path: Path) -> Iterator[Pipeline]:
    prefix = f"it-{uuid4().hex[:12]}"
    # the rest (MMSYNC_MODELS_DIR from tests/conftest.py, say) comes from the environment
    s = Settings(broker=url, broker_embedded=embedded, topic_prefix=prefix, partitions=4,
                 data_dir=tmp_path / "data", idle_ms=1500)
    pl = Pipeline(settings=s, env=worker_env(s), tmp=tmp_path, procs=[])
    try:
        yield pl
    finally:
        for p in pl.procs:
            stop_process(p)


@pytest.fixture
def pipeline(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pipeline]:
    """A fresh topic prefix and worker settings on a session broker: the embedded one
    (Tansu, with its workarounds) unless parametrized indirectly with a Kafka node
    fixture's name, ``"kafka"`` (production's configuration) or ``"kafka_defaults"``
    (Kafka's own defaults), which run with no embedded-broker workaround
    (``tests.integration.brokers.ON_KAFKA``)."""
    which = getattr(request, "param", "tansu")
    if which == "tansu":
        broker: EmbeddedBroker = request.getfixturevalue("broker")
        yield from _pipeline(broker.url, True, tmp_path)
    else:
        node: KafkaNode = request.getfixturevalue(which)
        yield from _pipeline(node.url, False, tmp_path)
