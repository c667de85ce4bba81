"""Sends whose delivery is confirmed before what they stand for is acked.

Faust's ``topic.send`` hands a record to the producer and returns a future of
its delivery; a failed delivery is only logged ("exception was never
retrieved") and the agent moves on, so a record whose window (or features)
never reached the broker would be acked and lost: seen on the embedded broker
restarting while a worker sent. Here every send of a step is awaited, failed
ones are sent again with a growing pause, and only then do the callers ack.
A send the producer refuses outright (a partition its metadata does not know,
no metadata for the topic in time, a record over the size limit) is a failed
delivery like any other, never an exception out of the agent (issue 23). Each
failed try is reported to ``on_failure`` (the worker counts it in
``mmsync_send_errors_total{topic,reason}``) and logged with the topic and
partition. A broker away longer than the retries raises
:class:`DeliveryError`: the agent holds what it had not finished (never
committed: ``app.kafka.commitguard.hold``) and Faust restarts it; that is
consumed again after the next rebalance or restart: at least once.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka.errors import (
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    RecordTooLargeError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)

from app.errors import MmsyncError

__all__ = ["DeliveryError", "OnFailure", "Record", "Send", "deliver", "send_error_reason",
           "where"]

log = logging.getLogger(__name__)

#: A send: starts one produce request and returns the future of its delivery.
Send = Callable[[], Awaitable[Awaitable[Any]]]
#: Told of every failed try of a send: the send and what it failed with.
OnFailure = Callable[[Send, BaseException], None]


@dataclass(frozen=True)
class Record:
    """One record for a Faust topic: a :data:`Send` that knows where it goes (for the
    log and the metrics when it fails)."""

    channel: Any  # a faust.TopicT
    key: bytes | None
    value: bytes
    partition: int | None = None
    headers: Mapping[str, bytes] | None = None

    @property
    def topic(self) -> str:
        return str(self.channel.get_topic_name())

    async def __call__(self) -> Awaitable[Any]:
        fut: Awaitable[Any] = await self.channel.send(
            key=self.key, value=self.value, partition=self.partition, headers=self.headers)
        return fut


def where(send: Send) -> str:
    """``topic partition N`` of a :class:`Record` (``partition of key K`` where the producer
    picks it from the key); ``?`` for other sends."""
    if not isinstance(send, Record):
        return "?"
    part = f"of key {send.key!r}" if send.partition is None else str(send.partition)
    return f"{send.topic} partition {part}"


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def send_error_reason(exc: BaseException) -> str:
    """The ``reason`` label of a failed send (``app.runtime.metrics.SEND_ERROR_REASONS``),
    looking through Faust's ``ProducerSendError`` to the Kafka error it wraps."""
    for e in _chain(exc):
        if isinstance(e, AssertionError) and "partition" in str(e).lower():
            return "unknown_partition"  # aiokafka's check of an explicit partition
        if isinstance(e, UnknownTopicOrPartitionError):
            return "unknown_topic"
        if isinstance(e, KafkaTimeoutError | RequestTimedOutError | TimeoutError):
            return "timeout"
        if isinstance(e, MessageSizeTooLargeError | RecordTooLargeError):
            return "too_large"
    if any(isinstance(e, KafkaError) for e in _chain(exc)):
        return "broker"
    return "other"


class DeliveryError(MmsyncError):
    """Records could not be delivered to the broker within the retries."""

    retriable = True


async def _start(send: Send) -> Awaitable[Any] | BaseException:
    try:
        return await send()
    except Exception as exc:  # noqa: BLE001 - refused before it was sent: a failed try
        return exc


async def deliver(sends: list[Send], *, attempts: int = 8, first_pause_s: float = 0.25,
                  max_pause_s: float = 4.0, on_failure: OnFailure | None = None) -> None:
    """Run every send and wait for the broker to confirm each one; resend the failed
    ones, pausing 0.25 s doubling to 4 s (about 20 s in all by default)."""
    pending = sends
    pause = first_pause_s
    for attempt in range(attempts):
        results: list[Any] = [await _start(send) for send in pending]
        waiting = {i: f for i, f in enumerate(results) if not isinstance(f, BaseException)}
        got = await asyncio.gather(*waiting.values(), return_exceptions=True)
        for i, r in zip(waiting, got, strict=True):
            results[i] = r
        failed = [(s, r) for s, r in zip(pending, results, strict=True)
                  if isinstance(r, BaseException)]
        if not failed:
            return
        if on_failure is not None:
            for s, r in failed:
                on_failure(s, r)
        by_topic = Counter(where(s).split(" partition")[0] for s, _ in failed)
        first_send, first_exc = failed[0]
        detail = (f"{', '.join(f'{t}: {n}' for t, n in sorted(by_topic.items()))}; first "
                  f"{where(first_send)}: {send_error_reason(first_exc)} {first_exc!r}")
        if attempt == attempts - 1:
            raise DeliveryError(f"{len(failed)} records not delivered after {attempts} tries "
                                f"({detail})")
        log.warning("%d of %d records not delivered (%s); sending them again in %.2f s",
                    len(failed), len(pending), detail, pause)
        pending = [s for s, _ in failed]
        await asyncio.sleep(pause)
        pause = min(pause * 2, max_pause_s)
