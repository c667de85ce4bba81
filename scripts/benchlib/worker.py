"""One light worker on a fresh embedded broker, for the alignment benchmarks."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from app.kafka.clients import wait_for_broker
from app.kafka.embedded import EmbeddedBroker
from app.kafka.topics import ensure_topics
from app.runtime.process import spawn_worker, stop_process, worker_env
from app.settings import Settings

__all__ = ["light_worker"]


@contextlib.contextmanager
def light_worker(prefix: str, partitions: int = 4) -> Iterator[Settings]:
    """A fresh embedded broker with the topics made and one worker (light models) that
    had time to join its group; yields the settings to publish and collect with. The
    worker and the broker are stopped, and their files removed, on the way out."""
    with tempfile.TemporaryDirectory(prefix=f"mmsync-{prefix}-") as tmp, \
            EmbeddedBroker(log_path=Path(tmp) / "broker.log") as broker:
        s = Settings(broker=broker.url, broker_embedded=True, topic_prefix=prefix,
                     partitions=partitions, data_dir=Path(tmp) / "data", models="light")
        asyncio.run(wait_for_broker(s, timeout_s=20))
        asyncio.run(ensure_topics(s))
        proc = spawn_worker(worker_env(s), Path(tmp) / "worker.log")
        try:
            time.sleep(8)  # the worker joins its group (docs/broker.md: 7 to 10 s)
            yield s
        finally:
            stop_process(proc)
