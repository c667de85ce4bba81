"""Consumer lag per assigned partition, Kafka's definition: end offset minus the group's
committed offset (0 committed before the first commit).

The committed offsets come from the broker through the public admin API
(OffsetFetch for the worker's group), not from Faust's private bookkeeping; the
end offsets are the high watermarks of the worker's own fetches (right on the
embedded broker too, unlike its ListOffsets answer: docs/broker.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from app.kafka.clients import auth_kwargs
from app.runtime.metrics import Metrics
from app.settings import Settings

__all__ = ["LagReporter"]

log = logging.getLogger(__name__)


class LagReporter:
    """Sets ``mmsync_consumer_lag{topic,partition}`` for a consumer group's partitions."""

    def __init__(self, s: Settings, group_id: str, metrics: Metrics) -> None:
        self._s, self._group, self._metrics = s, group_id, metrics
        self._admin: AIOKafkaAdminClient | None = None
        #: partitions with a series, so a revoked one's series is removed, not frozen
        self._shown: set[TopicPartition] = set()

    async def _client(self) -> AIOKafkaAdminClient:
        if self._admin is None:
            admin = AIOKafkaAdminClient(bootstrap_servers=self._s.bootstrap,
                                        **auth_kwargs(self._s))
            await admin.start()
            self._admin = admin
        return self._admin

    async def update(self, assigned: Iterable[Any], highwater: Any) -> None:
        """``assigned``: the worker's partitions (topic, partition); ``highwater(tp)`` their
        end offsets as last fetched (a partition not fetched yet is skipped)."""
        ends: dict[TopicPartition, int] = {}
        assigned = [TopicPartition(tp.topic, tp.partition) for tp in assigned]
        for gone in self._shown - set(assigned):
            self._metrics.consumer_lag.remove(gone.topic, str(gone.partition))
            self._shown.discard(gone)
        for tp in assigned:
            try:
                end = highwater(tp)
            except Exception:  # noqa: BLE001, S112 - not fetched yet, revoked, or restarting
                continue
            if end is not None:
                ends[TopicPartition(tp.topic, tp.partition)] = int(end)
        if not ends:
            return
        try:
            admin = await self._client()
            committed = await admin.list_consumer_group_offsets(self._group,
                                                                partitions=list(ends))
        except (KafkaError, OSError) as exc:
            log.debug("consumer lag: committed offsets unavailable: %s", exc)
            return
        for tp, end in ends.items():
            meta = committed.get(tp)
            done = meta.offset if meta is not None and meta.offset >= 0 else 0
            self._metrics.consumer_lag.labels(tp.topic, str(tp.partition)).set(max(0, end - done))
            self._shown.add(tp)

    async def close(self) -> None:
        if self._admin is not None:
            await self._admin.close()
            self._admin = None
