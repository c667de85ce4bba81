"""A running worker's check that its topics are still there, with their count.

``ensure_topics`` made or checked every topic before the worker started; this
runs the same look every :data:`TOPIC_CHECK_S` seconds while it runs. A topic
deleted under the worker is made again (with ``MMSYNC_PARTITIONS`` partitions
and its configs, unless ``MMSYNC_CREATE_TOPICS`` is false), rather than left to
a broker's auto-creation with its own count or, where auto-creation is off, to
sends that fail for as long as the producer's time-out (Faust's: 20 minutes).
A topic whose count changed cannot be put right from here: each check that
finds it says so. Both are counted in ``mmsync_topic_faults_total{topic,fault}``
and logged when what is wrong changes; nothing here stops the worker.

After any change ``on_change`` is told which topics were made again: the worker
refreshes its producer's metadata (the embedded broker takes records for a
deleted topic from a producer that still has it in its metadata, and they are
lost, where Apache Kafka refuses them and the producer refreshes by itself) and
reads the topics made again from their start (the embedded broker answers a
fetch past the end of a new log with nothing instead of an out-of-range error,
so the consumer would wait for the new log to reach its old position; Apache
Kafka's answer resets it to the start anyway).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from aiokafka.errors import KafkaError

from app.kafka.topics import TopicsCheck, check_topics, ensure_topics
from app.runtime.metrics import Metrics
from app.settings import Settings

__all__ = ["TOPIC_CHECK_S", "TopicWatch"]

log = logging.getLogger(__name__)

#: How often a worker looks at its topics, s (one metadata request for all topics).
TOPIC_CHECK_S = 10.0


class TopicWatch:
    """Call it every :data:`TOPIC_CHECK_S`; it logs, counts and makes missing topics."""

    def __init__(self, s: Settings, metrics: Metrics,
                 on_change: Callable[[Sequence[str]], Awaitable[None]] | None = None
                 ) -> None:
        self._s, self._m, self._on_change = s, metrics, on_change
        self._last = TopicsCheck()

    async def __call__(self) -> None:
        s = self._s
        try:
            check = await check_topics(s)
        except (KafkaError, OSError) as exc:  # the broker away: nothing to say about topics
            log.debug("topics not checked: %r", exc)
            return
        for name in check.missing:
            self._m.topic_faults.labels(name, "missing").inc()
        for name in check.wrong:
            self._m.topic_faults.labels(name, "partitions").inc()
        changed, self._last = check != self._last, check
        if changed:
            self._report(check)
        remade: tuple[str, ...] = ()
        if check.missing and s.create_topics:
            remade = (await ensure_topics(s, check.missing)).created
            log.warning("made topics %s again with %d partitions", ", ".join(remade),
                        s.partitions)
        if (changed or remade) and self._on_change is not None:
            await self._on_change(remade)

    def _report(self, check: TopicsCheck) -> None:
        s = self._s
        if check.missing:
            log.error("topics %s are gone (deleted under the running worker?); %s",
                      ", ".join(s.topic(n) for n in check.missing),
                      "making them again" if s.create_topics else
                      f"create them again with {s.partitions} partitions "
                      "(MMSYNC_CREATE_TOPICS is false)")
        for name, have in sorted(check.wrong.items()):
            log.error("topic %s has %d partitions now, MMSYNC_PARTITIONS is %d: stream_id keys "
                      "map to other partitions; stop the workers and create new topics "
                      "(another MMSYNC_TOPIC_PREFIX)", s.topic(name), have, s.partitions)
        if not check:
            log.warning("every topic is there again with %d partitions", s.partitions)
