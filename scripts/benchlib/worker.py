"""One light worker on a fresh broker of its own, for the alignment benchmarks."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from app.kafka.apache import DEFAULT_KAFKA_VERSION, KafkaNode
from app.kafka.clients import wait_for_broker
from app.kafka.embedded import EmbeddedBroker
from app.kafka.topics import ensure_topics
from app.runtime.process import spawn_worker, stop_process, worker_env
from app.settings import Settings

__all__ = ["BROKERS", "fresh_broker", "light_worker"]

#: ``--broker`` choices: the embedded Tansu (with its workarounds) or a local Apache Kafka
#: node as production configures it (auto-creation off; ``make kafka`` once,
#: ``KAFKA_VERSION`` picks the version).
BROKERS = ("tansu", "kafka")


def fresh_broker(kind: str, log_path: Path) -> EmbeddedBroker | KafkaNode:
    """A broker of kind ``kind`` (one of :data:`BROKERS`), not started: the embedded Tansu,
    or a local Apache Kafka node as production configures it (``KAFKA_VERSION`` picks the
    fetched version)."""
    if kind not in BROKERS:
        raise ValueError(f"broker must be one of {BROKERS}, not {kind!r}")
    if kind == "kafka":
        return KafkaNode(version=os.environ.get("KAFKA_VERSION") or DEFAULT_KAFKA_VERSION,
                         log_path=log_path)
    return EmbeddedBroker(log_path=log_path)


@contextlib.contextmanager
def light_worker(prefix: str, partitions: int = 4, broker: str = "tansu") -> Iterator[Settings]:
    """A fresh broker of kind ``broker`` with the topics made and one worker (light
    models) that had time to join its group; yields the settings to publish and collect
    with. The worker and the broker are stopped, and their files removed, on the way out."""
    with tempfile.TemporaryDirectory(prefix=f"mmsync-{prefix}-") as tmp:
        node = fresh_broker(broker, Path(tmp) / "broker.log")
        with node:
            s = Settings(broker=node.url, broker_embedded=isinstance(node, EmbeddedBroker),
                         topic_prefix=prefix, partitions=partitions,
                         data_dir=Path(tmp) / "data", models="light")
            asyncio.run(wait_for_broker(s, timeout_s=20))
            asyncio.run(ensure_topics(s))
            proc = spawn_worker(worker_env(s), Path(tmp) / "worker.log")
            try:
                time.sleep(8)  # the worker joins its group (docs/broker.md: 7 to 10 s)
                yield s
            finally:
                stop_process(proc)
