"""A partition with no committed offset is read again from its start when Faust seeks back.

Faust (0.15.3) discards a batch it fetched while its flow was stopped for a rebalance,
and "seeks back to committed offsets" (``Consumer.getmany`` calls ``perform_seek``).
It does the same when a rebalance ends (``Recovery._resume_streams``). Both go through
aiokafka's ``seek_to_committed``, which moves only partitions whose committed offset is
above 0 (aiokafka 0.14: ``if offset and offset > 0``). A partition with nothing committed
keeps its fetch position, past the discarded batch, and those records never reach a stream.

Seen in the SIGKILL and join/leave fault tests on Apache Kafka (docs/broker.md):
- the first 17 to 20 s of frames of a stream lost in the aligner;
- the first sound of a stream lost, partly before the feature records were made.

A run with each batch and each record the aligner took logged showed the scene:
- The group rebalanced 0.5 s after its first assignment, and the worker kept its
  partitions, on which nothing was committed yet.
- A fetch that began before the rebalance returned the new assignment's first records,
  offsets 0 to 43, before the flow resumed.
- Faust discarded them and sought back, which did not move a partition with no commit.
- The aligner's first record after the rebalance was offset 44. The records 0 to 43 it
  had held in open windows were dropped on the revoke, and later commits went past them.

:func:`install` makes that seek move such partitions to their log start too, as
``auto_offset_reset=earliest`` would for a fresh assignment. It runs in the consumer's
thread, right after aiokafka's own seek.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

from aiokafka import TopicPartition
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

__all__ = ["install", "seek_to_committed_or_start"]

log = logging.getLogger(__name__)

_MARK = "_mmsync_fetch_guard"


async def seek_to_committed_or_start(consumer: Any) -> Mapping[TopicPartition, Any]:
    """aiokafka's ``seek_to_committed`` on ``consumer``, and every partition still assigned
    with no committed offset above 0 sought to its log start; the committed offsets as
    aiokafka returns them."""
    committed = await consumer.seek_to_committed()
    assigned = consumer._subscription.assigned_partitions()
    fresh = [tp for tp, off in committed.items() if (off is None or off <= 0) and tp in assigned]
    if fresh:
        log.debug("no committed offset: %s read from the log start", sorted(fresh))
        await consumer.seek_to_beginning(*fresh)
    return committed


def install() -> None:
    """Patch Faust's aiokafka consumer thread of this process (idempotent)."""
    orig = AIOKafkaConsumerThread.seek_to_committed
    if getattr(orig, _MARK, False):
        return

    @functools.wraps(orig)
    async def seek(self: Any) -> Any:
        return await self.call_thread(seek_to_committed_or_start, self._ensure_consumer())

    setattr(seek, _MARK, True)
    AIOKafkaConsumerThread.seek_to_committed = seek  # type: ignore[method-assign]
