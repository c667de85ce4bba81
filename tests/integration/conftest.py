"""A real embedded broker per session; a fresh topic prefix and worker per test."""

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

from app.kafka.embedded import EmbeddedBroker, free_port
from app.runtime.process import spawn_worker, stop_process, worker_env
from app.settings import Settings


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    log = tmp_path_factory.mktemp("broker") / "tansu.log"
    with EmbeddedBroker(log_path=log) as b:
        yield b


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


@pytest.fixture
def pipeline(broker: EmbeddedBroker, tmp_path: Path) -> Iterator[Pipeline]:
    prefix = f"it-{uuid4().hex[:12]}"
    # the rest (MMSYNC_MODELS_DIR from tests/conftest.py, say) comes from the environment
    s = Settings(broker=broker.url, broker_embedded=True, topic_prefix=prefix, partitions=4,
                 data_dir=tmp_path / "data", idle_ms=1500)
    pl = Pipeline(settings=s, env=worker_env(s), tmp=tmp_path, procs=[])
    try:
        yield pl
    finally:
        for p in pl.procs:
            stop_process(p)
