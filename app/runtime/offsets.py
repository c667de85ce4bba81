"""A consumer group's committed offsets, from the broker (public admin API), and the
consumer-lag metric built on them.

Faust keeps committed offsets privately; the admin API's OffsetFetch asks the
broker, which is what Kafka's own definition of lag uses. The end offsets are
the high watermarks of the worker's own fetches (right on the embedded broker
too, unlike its ListOffsets answer: docs/broker.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from app.kafka.clients import auth_kwargs
from app.runtime.metrics import Metrics
from app.settings import Settings

__all__ = ["GroupOffsets", "LagReporter", "highwaters", "last_poll_ms"]

log = logging.getLogger(__name__)


def highwaters(assigned: Iterable[Any], highwater: Callable[[Any], int | None]
               ) -> dict[TopicPartition, int]:
    """End offsets of the assigned partitions as last fetched; a partition not fetched
    yet (or just revoked) is left out."""
    ends: dict[TopicPartition, int] = {}
    for tp in assigned:
        try:
            end = highwater(tp)
        except Exception:  # noqa: BLE001, S112 - not fetched yet, revoked, or restarting
            continue
        if end is not None:
            ends[TopicPartition(tp.topic, tp.partition)] = int(end)
    return ends


def last_poll_ms(consumer: Any) -> Callable[[Any], int | None]:
    """For a Faust consumer: when its aiokafka consumer last fetched a partition (wall-clock
    ms; the time its highwater was last updated, ``AIOKafkaConsumer.last_poll_timestamp``),
    as a function of the partition for :func:`highwaters`. Faust reaches the aiokafka
    consumer through its consumer thread; where that is not there (another transport, not
    started), every answer is None."""

    def polled(tp: Any) -> int | None:
        thread = getattr(consumer, "_thread", None)
        inner = getattr(thread, "_consumer", None)  # set by the thread's start
        if inner is None:
            return None
        ms = inner.last_poll_timestamp(tp)
        return None if ms is None else int(ms)

    return polled


class GroupOffsets:
    """Committed offsets of one consumer group (an admin client, opened on first use)."""

    def __init__(self, s: Settings, group_id: str) -> None:
        self._s, self.group_id = s, group_id
        self._admin: AIOKafkaAdminClient | None = None

    async def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Committed offset per partition; -1 where the group has committed none. Raises
        KafkaError or OSError when the broker cannot answer."""
        tps = list(partitions)
        if not tps:
            return {}
        if self._admin is None:
            admin = AIOKafkaAdminClient(bootstrap_servers=self._s.bootstrap,
                                        **auth_kwargs(self._s))
            await admin.start()
            self._admin = admin
        got = await self._admin.list_consumer_group_offsets(self.group_id, partitions=tps)
        return {tp: (got[tp].offset if tp in got else -1) for tp in tps}

    async def starts(self, partitions: Iterable[TopicPartition], consumer: Any
                     ) -> dict[TopicPartition, int]:
        """Where consumption of each partition starts: the group's committed offset, or
        the log start where it has none (``auto_offset_reset=earliest``). Partitions the
        broker cannot answer for now are left out (their progress stays unknown)."""
        try:
            committed = await self.committed(partitions)
            fresh = [tp for tp, off in committed.items() if off < 0]
            earliest = await consumer.earliest_offsets(*fresh) if fresh else {}
        except (KafkaError, OSError):
            return {}
        out = {tp: off for tp, off in committed.items() if off >= 0}
        out.update({TopicPartition(tp.topic, tp.partition): int(off)
                    for tp, off in earliest.items()})
        return out

    async def close(self) -> None:
        if self._admin is not None:
            await self._admin.close()
            self._admin = None


class LagReporter:
    """Sets ``mmsync_consumer_lag{topic,partition}`` (end minus committed, 0 committed
    before the first commit) for a worker's assigned partitions."""

    def __init__(self, offsets: GroupOffsets, metrics: Metrics) -> None:
        self._offsets, self._metrics = offsets, metrics
        #: partitions with a series, so a revoked one's series is removed, not frozen
        self._shown: set[TopicPartition] = set()

    async def update(self, assigned: Iterable[Any], highwater: Callable[[Any], int | None]
                     ) -> None:
        mine = [TopicPartition(tp.topic, tp.partition) for tp in assigned]
        for gone in self._shown - set(mine):
            self._metrics.consumer_lag.remove(gone.topic, str(gone.partition))
            self._shown.discard(gone)
        ends = highwaters(mine, highwater)
        try:
            committed = await self._offsets.committed(ends)
        except (KafkaError, OSError) as exc:
            log.debug("consumer lag: committed offsets unavailable: %s", exc)
            return
        for tp, end in ends.items():
            done = max(0, committed.get(tp, -1))
            self._metrics.consumer_lag.labels(tp.topic, str(tp.partition)).set(max(0, end - done))
            self._shown.add(tp)
