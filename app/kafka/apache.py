"""A local Apache Kafka node: one KRaft process, broker and controller in one JVM.

The jars come from Maven Central through the project's own set-up
(``deploy/kafka/pom.xml``; ``make kafka`` copies them into
``.kafka/<version>/libs`` once, offline afterwards). :class:`KafkaNode` has the
shape of :class:`app.kafka.embedded.EmbeddedBroker`: a free loopback port,
storage formatted in a temporary folder (deleted at stop), start, wait until the
broker is in the cluster's metadata, stop; :meth:`KafkaNode.restart` stops and
starts it on the same ports and storage, as a production broker restarts. The JVM
runs in its own process group with a bounded heap; stop signals the group, waits,
then kills it, and the JVM also gets SIGTERM should the Python process die without stopping it
(``setpriv --pdeathsig``, where util-linux has it).
"""

from __future__ import annotations

import atexit
import base64
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import IO

from app.errors import BrokerStartError
from app.kafka.embedded import free_port
from app.runtime.children import die_with_parent

__all__ = ["DEFAULT_KAFKA_VERSION", "KafkaNode", "kafka_libs", "locate_java",
           "metadata_brokers"]

#: The 3.9 line docker-compose.yml runs; the version the test suite proves.
DEFAULT_KAFKA_VERSION = "3.9.2"
_ROOT = Path(__file__).resolve().parents[2]
#: A single-node cluster: its own records and the internal topics fit in this heap
#: beside two workers on 2 cores (about 320 MB resident measured with 384 MiB).
DEFAULT_HEAP_MB = 384
#: Small-footprint JVM: one GC thread; the quick (C1) compiler only (to ready in 2.4 to
#: 2.7 s of JVM CPU time instead of 3.5 to 3.7 with tiered compilation, 2 cores); no
#: /tmp/hsperfdata files.
_JVM_FLAGS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData",
              "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
              "-Dorg.slf4j.simpleLogger.showDateTime=true",
              "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
              "-Dorg.slf4j.simpleLogger.log.org.apache.kafka.common.config=warn")
#: As docker-compose.yml's kafka service: an 8 MiB frame plus its envelope
#: (app/kafka/clients.py MAX_REQUEST_BYTES).
_MESSAGE_MAX_BYTES = 12 * 1024 * 1024


def kafka_libs(version: str = DEFAULT_KAFKA_VERSION) -> Path:
    """Where ``make kafka KAFKA_VERSION=version`` puts the jars: the repository's
    ``.kafka/<version>/libs`` (elsewhere: ``KafkaNode(libs=...)``)."""
    return _ROOT / ".kafka" / version / "libs"


def locate_java() -> str:
    """``$JAVA_HOME/bin/java``, or ``java`` on ``PATH``."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise BrokerStartError("no java on PATH (nor in JAVA_HOME): mmsync broker --kafka needs "
                               "a JDK, 17 or newer; `mmsync broker` (the embedded one) needs none")
    return found


def _send(sock: socket.socket, api_key: int, version: int, corr: int, body: bytes) -> bytes:
    """One request (header v1), the body of its answer (header v0, correlation checked)."""
    client = b"mmsync-probe"
    msg = struct.pack(">hhih", api_key, version, corr, len(client)) + client + body
    sock.sendall(struct.pack(">i", len(msg)) + msg)
    size = struct.unpack(">i", _recv(sock, 4))[0]
    data = _recv(sock, size)
    if struct.unpack(">i", data[:4])[0] != corr:
        raise OSError("correlation id mismatch")
    return data[4:]


def _recv(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            raise OSError("connection closed")
        buf += part
    return buf


def metadata_brokers(host: str, port: int, timeout: float = 1.0) -> int | None:
    """How many live brokers a Metadata request lists (None: no answer). A KRaft broker
    lists itself once it has caught up with the controller and is unfenced, i.e. ready.

    ApiVersions v0 first (every broker keeps it), then Metadata at the lowest version of
    4 to 8 the broker accepts (Kafka 4.0 dropped 0 to 3; 9 and up change the encoding),
    asking for no topics."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            body = _send(s, 18, 0, 1, b"")
            err, n = struct.unpack(">hi", body[:6])
            if err:
                return None
            ranges = {k: (lo, hi) for k, lo, hi in
                      (struct.unpack(">hhh", body[6 + 6 * i: 12 + 6 * i]) for i in range(n))}
            lo, hi = ranges.get(3, (0, -1))
            version = max(lo, 4)
            if version > min(hi, 8):
                return None
            # topics: an empty array (no topics); allow_auto_topic_creation: false
            body = _send(s, 3, version, 2, struct.pack(">ib", 0, 0))
            return int(struct.unpack(">i", body[4:8])[0])  # after throttle_time_ms
    except (OSError, struct.error):
        return None


def _cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding (never one
    that starts with '-', which Kafka's own generator avoids too)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


class KafkaNode:
    """An Apache Kafka KRaft node on loopback. Use as a context manager or start()/stop().

    ``auto_create=False`` is production's configuration (docker-compose.yml: topics
    come only from whoever creates them); ``auto_create=True`` with ``num_partitions=1``
    is Kafka's own default. Either way the node takes compose's message size limit and
    replication factors of 1 (one node).

    Start it from a thread that outlives it (the main thread, as the CLI and pytest
    do): the JVM's parent-death signal follows the thread that started it.
    """

    def __init__(self, port: int | None = None, host: str = "127.0.0.1", *,
                 version: str = DEFAULT_KAFKA_VERSION, libs: Path | None = None,
                 auto_create: bool = False, num_partitions: int = 1,
                 heap_mb: int = DEFAULT_HEAP_MB, log_path: Path | None = None,
                 start_timeout_s: float = 60.0, stop_timeout_s: float = 20.0) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.version = version
        self.libs = libs or kafka_libs(version)
        self.auto_create = auto_create
        self.num_partitions = num_partitions
        self.heap_mb = heap_mb
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        #: seconds from start() to ready, and of that the storage format (measured)
        self.start_s: float | None = None
        self.format_s: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._dir: Path | None = None

    @property
    def url(self) -> str:
        return f"kafka://{self.host}:{self.port}"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def config(self, log_dir: Path, controller_port: int) -> dict[str, str]:
        """The node's ``server.properties``."""
        h = self.host
        return {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{h}:{controller_port}",
            "listeners": f"PLAINTEXT://{h}:{self.port},CONTROLLER://{h}:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://{h}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(log_dir),
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "true" if self.auto_create else "false",
            "num.partitions": str(self.num_partitions),
            "message.max.bytes": str(_MESSAGE_MAX_BYTES),
            "replica.fetch.max.bytes": str(_MESSAGE_MAX_BYTES),
        }

    def _java(self, java: str, heap_mb: int, *args: str) -> list[str]:
        return die_with_parent(
            [java, f"-Xmx{heap_mb}m", *_JVM_FLAGS, "-cp", str(self.libs / "*"), *args])

    def start(self) -> KafkaNode:
        if not any(self.libs.glob("kafka_2.13-*.jar")):
            raise BrokerStartError(
                f"Apache Kafka {self.version} is not fetched ({self.libs} has no jars): run "
                f"`make kafka KAFKA_VERSION={self.version}` (needs Maven and a JDK once)")
        java = locate_java()
        t0 = time.monotonic()
        if self._dir is None:  # else: restart() kept it, with its formatted storage
            self._dir = Path(tempfile.mkdtemp(prefix="mmsync-kafka-"))
        try:  # whatever stops the start (an error, Ctrl-C) stops what it started
            self._start(java, t0)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, java: str, t0: float) -> None:
        assert self._dir is not None
        props = self._dir / "server.properties"
        self._log = open(self.log_file, "ab")  # noqa: SIM115 - closed in stop()
        if props.exists():  # a restart: same ports, same storage, no format
            self.format_s = 0.0
        else:
            cfg = self.config(self._dir / "data", free_port(self.host))
            props.write_text("".join(f"{k}={v}\n" for k, v in cfg.items()))
            self._format(java, props, t0)
        self._run(java, props, t0)

    def _format(self, java: str, props: Path, t0: float) -> None:
        try:
            fmt = subprocess.run(
                self._java(java, 128, "kafka.tools.StorageTool", "format", "-t", _cluster_id(),
                           "-c", str(props)),
                stdout=self._log, stderr=subprocess.STDOUT, timeout=self.start_timeout_s,
                check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BrokerStartError(f"formatting Kafka's storage failed: {exc}") from exc
        if fmt.returncode != 0:
            raise BrokerStartError(f"formatting Kafka's storage failed (code {fmt.returncode})"
                                   f":\n{self.tail()}")
        self.format_s = time.monotonic() - t0

    def _run(self, java: str, props: Path, t0: float) -> None:
        try:
            self._proc = subprocess.Popen(
                self._java(java, self.heap_mb, "kafka.Kafka", str(props)), stdout=self._log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            raise BrokerStartError(f"cannot run {java}: {exc}") from exc
        atexit.register(self.stop)
        deadline = t0 + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise BrokerStartError(f"Kafka exited with code {self._proc.returncode} at start"
                                       f" (port {self.port} taken?):\n{self.tail()}")
            if (metadata_brokers(self.host, self.port, timeout=1.0) or 0) >= 1:
                self.start_s = time.monotonic() - t0
                return
            time.sleep(0.1)
        raise BrokerStartError(f"Kafka did not become ready on {self.bootstrap} within "
                               f"{self.start_timeout_s:g} s:\n{self.tail()}")

    @property
    def workdir(self) -> Path | None:
        """The temporary folder of this run (``server.properties``, the storage in
        ``data/``); None when stopped (it is deleted)."""
        return self._dir

    @property
    def log_file(self) -> Path:
        """The node's log (the storage format's output, then the broker's): ``log_path``,
        or a file in the temporary folder, gone at stop."""
        if self.log_path is not None:
            return self.log_path
        if self._dir is None:
            raise RuntimeError("the node is not started")
        return self._dir / "kafka.log"

    def tail(self, lines: int = 15) -> str:
        """The last lines of the log (for error messages)."""
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except (OSError, RuntimeError):
            return ""

    def restart(self, down_s: float = 0.0) -> KafkaNode:
        """Stop the node (SIGTERM: Kafka's clean shutdown), wait ``down_s``, start it
        again on the same ports with the same storage: its topics, records and committed
        offsets are all still there, as after a production broker's restart."""
        self.stop(keep_storage=True)
        time.sleep(down_s)
        return self.start()

    def stop(self, *, keep_storage: bool = False) -> None:
        """SIGTERM to the JVM's process group, SIGKILL after ``stop_timeout_s``; then
        the storage folder goes, unless ``keep_storage`` (for :meth:`restart`). Safe to
        call twice."""
        proc, self._proc = self._proc, None
        if proc is not None:
            atexit.unregister(self.stop)
            if proc.poll() is None:
                _killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=self.stop_timeout_s)
                except subprocess.TimeoutExpired:
                    _killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._dir is not None and not keep_storage:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> KafkaNode:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
