"""What the broker fixtures and the Kafka tests share: which Apache Kafka to run, the
broker parameters of the ``pipeline`` fixture, and whether a process group is gone."""

from __future__ import annotations

import os

import pytest

from app.kafka.apache import DEFAULT_KAFKA_VERSION

__all__ = ["KAFKA_VERSION", "ON_BOTH", "ON_EVERY", "process_group_alive"]

#: The Apache Kafka version the Kafka fixtures run, from the jars ``make kafka`` fetched;
#: ``KAFKA_VERSION`` in the environment (the Makefile's variable) picks another:
#: ``KAFKA_VERSION=4.4.0 make integration`` fetches it and runs the suite on it.
KAFKA_VERSION = os.environ.get("KAFKA_VERSION") or DEFAULT_KAFKA_VERSION

#: A test that takes ``pipeline`` runs on the embedded broker (``[tansu]``) and on Apache
#: Kafka as production configures it (``[kafka]``: auto-creation off, no embedded-broker
#: workaround). Applied where the broker matters and the test is short enough for the
#: suite's time budget (docs/broker.md, "The suite on both brokers").
ON_BOTH = pytest.mark.parametrize("pipeline", ["tansu", "kafka"], indirect=True)
#: As ``ON_BOTH``, and Kafka with its own defaults too (``[kafka_defaults]``: auto-creation
#: on, ``num.partitions=1``): where a topic the broker made by itself would show.
ON_EVERY = pytest.mark.parametrize("pipeline", ["tansu", "kafka", "kafka_defaults"],
                                   indirect=True)


def process_group_alive(pgid: int) -> bool:
    """Whether any process is left in the process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
