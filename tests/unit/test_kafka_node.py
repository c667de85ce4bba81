"""KafkaNode without a JVM: its configuration, its clear errors, the readiness probe."""

from __future__ import annotations

import re
import socket
import struct
import threading
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]

from app.errors import BrokerStartError
from app.kafka.apache import DEFAULT_KAFKA_VERSION, KafkaNode, locate_java, metadata_brokers
from app.kafka.embedded import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_production_config_is_compose_s_and_defaults_are_kafka_s(tmp_path: Path) -> None:
    prod = KafkaNode(port=9999).config(tmp_path, 9998)
    assert prod["auto.create.topics.enable"] == "false"
    assert prod["process.roles"] == "broker,controller"
    assert prod["controller.quorum.voters"] == "1@127.0.0.1:9998"
    assert prod["listeners"] == "PLAINTEXT://127.0.0.1:9999,CONTROLLER://127.0.0.1:9998"
    assert prod["log.dirs"] == str(tmp_path)
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    env = compose["services"]["kafka"]["environment"]
    # what the compose file sets, the node sets the same, addresses and folders aside
    local = {"listeners", "advertised.listeners", "controller.quorum.voters",
             "listener.security.protocol.map", "log.dirs"}
    same = {}
    for var, value in env.items():
        key = var.removeprefix("KAFKA_").lower().replace("_", ".")
        if key in prod and key not in local:
            same[key] = (prod[key], str(value))
    assert all(a == b for a, b in same.values()), same
    assert {"auto.create.topics.enable", "message.max.bytes", "replica.fetch.max.bytes",
            "offsets.topic.replication.factor", "transaction.state.log.min.isr",
            "group.initial.rebalance.delay.ms", "node.id"} <= same.keys()
    dflt = KafkaNode(auto_create=True, num_partitions=1).config(tmp_path, 1)
    assert dflt["auto.create.topics.enable"] == "true" and dflt["num.partitions"] == "1"


def test_the_suite_proves_the_version_compose_runs() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    assert re.search(rf"apache/kafka:{re.escape(DEFAULT_KAFKA_VERSION)}\b", text)
    pom = (ROOT / "deploy" / "kafka" / "pom.xml").read_text()
    assert f"<kafka.version>{DEFAULT_KAFKA_VERSION}</kafka.version>" in pom


def test_missing_jars_say_how_to_fetch_them(tmp_path: Path) -> None:
    with pytest.raises(BrokerStartError, match=r"make kafka KAFKA_VERSION=9\.9\.9"):
        KafkaNode(version="9.9.9", libs=tmp_path).start()


def test_missing_java_says_what_is_needed(monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(BrokerStartError, match="JDK"):
        locate_java()


def test_probe_of_a_closed_port_is_none() -> None:
    assert metadata_brokers("127.0.0.1", free_port(), timeout=0.2) is None


def _fake_broker(metadata_range: tuple[int, int], brokers: int) -> tuple[int, list[int]]:
    """A one-connection server answering ApiVersions v0 and Metadata; the Metadata
    versions it was asked for go into the returned list."""
    srv = socket.create_server(("127.0.0.1", 0))
    asked: list[int] = []

    def recv(c: socket.socket) -> tuple[int, int, int]:
        size = struct.unpack(">i", c.recv(4))[0]
        data = b""
        while len(data) < size:
            data += c.recv(size - len(data))
        return struct.unpack(">hhi", data[:8])

    def answer(c: socket.socket, corr: int, body: bytes) -> None:
        c.sendall(struct.pack(">ii", 4 + len(body), corr) + body)

    def serve() -> None:
        c, _ = srv.accept()
        with c, srv:
            _, _, corr = recv(c)
            lo, hi = metadata_range
            answer(c, corr, struct.pack(">hi", 0, 2) + struct.pack(">hhh", 18, 0, 3)
                   + struct.pack(">hhh", 3, lo, hi))
            try:
                _, version, corr = recv(c)
            except (OSError, struct.error):
                return
            asked.append(version)
            answer(c, corr, struct.pack(">ii", 0, brokers))

    threading.Thread(target=serve, daemon=True).start()
    return srv.getsockname()[1], asked


@pytest.mark.parametrize(("metadata_range", "version"), [((0, 12), 4), ((4, 13), 4),
                                                         ((6, 13), 6)])
def test_probe_asks_metadata_at_a_version_the_broker_keeps(metadata_range: tuple[int, int],
                                                           version: int) -> None:
    port, asked = _fake_broker(metadata_range, brokers=1)
    assert metadata_brokers("127.0.0.1", port) == 1
    assert asked == [version]


def test_probe_gives_up_when_no_version_fits() -> None:
    port, asked = _fake_broker((9, 13), brokers=1)
    assert metadata_brokers("127.0.0.1", port) is None
    assert asked == []
