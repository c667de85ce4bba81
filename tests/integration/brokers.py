"""What the broker fixtures and the Kafka tests share: which Apache Kafka to run, and
whether a process group is gone."""

from __future__ import annotations

import os

from app.kafka.apache import DEFAULT_KAFKA_VERSION

__all__ = ["KAFKA_VERSION", "process_group_alive"]

#: The Apache Kafka version the Kafka fixtures run, from the jars ``make kafka`` fetched;
#: ``KAFKA_VERSION`` in the environment (the Makefile's variable) picks another:
#: ``KAFKA_VERSION=4.4.0 make integration`` fetches it and runs the suite on it.
KAFKA_VERSION = os.environ.get("KAFKA_VERSION") or DEFAULT_KAFKA_VERSION


def process_group_alive(pgid: int) -> bool:
    """Whether any process is left in the process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
