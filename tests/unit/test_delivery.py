"""deliver: every send confirmed, failed ones sent again, a bound on the waiting."""

from __future__ import annotations

import asyncio

import pytest

from app.runtime.delivery import DeliveryError, deliver


class _Broker:
    """Fails the first ``failures`` deliveries of each record, then takes it."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.tries: dict[str, int] = {}
        self.kept: list[str] = []

    def send(self, name: str):
        async def start() -> asyncio.Future[str]:
            fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            n = self.tries[name] = self.tries.get(name, 0) + 1
            if n <= self.failures and name != "good":
                fut.set_exception(ConnectionError(f"{name} try {n}"))
            else:
                self.kept.append(name)
                fut.set_result(name)
            return fut
        return start


async def test_failed_deliveries_are_sent_again_until_confirmed():
    b = _Broker(failures=2)
    await deliver([b.send("good"), b.send("a"), b.send("b")], first_pause_s=0.001)
    assert sorted(b.kept) == ["a", "b", "good"] and b.tries == {"good": 1, "a": 3, "b": 3}


async def test_a_broker_away_too_long_raises_instead_of_acking():
    b = _Broker(failures=99)
    with pytest.raises(DeliveryError, match="1 records not delivered after 3 tries"):
        await deliver([b.send("good"), b.send("a")], attempts=3, first_pause_s=0.001)
    assert b.kept == ["good"] and b.tries["a"] == 3


def test_a_failed_sends_faust_future_is_not_a_traceback_but_other_errors_are():
    """Faust sets a failed send's exception on a FutureMessage nothing awaits; the
    worker's loop handler keeps that out of the log, not other unretrieved errors."""
    import gc

    from faust.types.tuples import FutureMessage, PendingMessage

    from app.runtime.faust_app import quiet_failed_sends

    seen: list[dict[str, object]] = []
    loop = asyncio.new_event_loop()
    loop.default_exception_handler = seen.append  # type: ignore[method-assign]
    loop.set_exception_handler(quiet_failed_sends)

    async def lose_both() -> None:
        fm = FutureMessage(PendingMessage(*([None] * len(PendingMessage._fields))))
        fm.set_exception(ConnectionError("broker away"))
        other = asyncio.get_running_loop().create_future()
        other.set_exception(ValueError("a real bug"))

    try:
        loop.run_until_complete(lose_both())
        gc.collect()
    finally:
        loop.close()
    assert [type(c.get("exception")) for c in seen] == [ValueError]


class _Topic:
    """A Faust topic's ``send`` as the producer answers it: refused outright (aiokafka
    asserts an explicit partition is in its metadata), or a delivery future."""

    def __init__(self, name: str, partitions: int, fail_first: int = 0) -> None:
        self.name, self.partitions, self.fail_first = name, partitions, fail_first
        self.kept: list[tuple[bytes | None, int | None]] = []

    def get_topic_name(self) -> str:
        return self.name

    async def send(self, *, key, value, partition=None, headers=None):
        assert partition is None or partition < self.partitions, "Unrecognized partition"
        fut = asyncio.get_running_loop().create_future()
        if self.fail_first > 0:
            from aiokafka.errors import UnknownTopicOrPartitionError

            self.fail_first -= 1
            fut.set_exception(UnknownTopicOrPartitionError())
        else:
            self.kept.append((key, partition))
            fut.set_result(None)
        return fut


async def test_a_send_the_producer_refuses_is_a_failed_try_not_an_exception():
    """Issue 23: aiokafka's AssertionError for a partition its metadata does not know
    escaped the send and stopped the worker; now it is a failed try like any other,
    told to ``on_failure``, and the message names the topic and the partition."""
    from app.runtime.delivery import Record, send_error_reason

    topic = _Topic("mm.features", partitions=4)
    failures: list[tuple[str, str]] = []
    sends = [Record(topic, None, b"m", partition=q) for q in range(6)]
    with pytest.raises(DeliveryError) as err:
        await deliver(sends, attempts=2, first_pause_s=0.001,
                      on_failure=lambda s, e: failures.append((s.topic, send_error_reason(e))))
    assert topic.kept == [(None, q) for q in range(4)]
    assert failures == [("mm.features", "unknown_partition")] * 4
    assert "2 records not delivered after 2 tries" in str(err.value)
    assert "mm.features partition 4: unknown_partition" in str(err.value)


async def test_a_topic_gone_for_a_while_is_sent_again():
    from app.runtime.delivery import Record, send_error_reason

    topic = _Topic("mm.aligned", partitions=8, fail_first=3)
    reasons: list[str] = []
    await deliver([Record(topic, b"k", b"w")], first_pause_s=0.001,
                  on_failure=lambda s, e: reasons.append(send_error_reason(e)))
    assert topic.kept == [(b"k", None)] and reasons == ["unknown_topic"] * 3


def test_send_error_reasons_look_through_fausts_wrapper():
    from aiokafka.errors import (
        KafkaConnectionError,
        KafkaTimeoutError,
        MessageSizeTooLargeError,
        UnknownTopicOrPartitionError,
    )
    from faust.exceptions import ProducerSendError

    from app.runtime.delivery import send_error_reason

    def wrapped(exc: BaseException) -> BaseException:
        try:
            raise ProducerSendError(f"Error while sending: {exc!r}") from exc
        except ProducerSendError as outer:
            return outer

    assert send_error_reason(AssertionError("Unrecognized partition")) == "unknown_partition"
    assert send_error_reason(wrapped(UnknownTopicOrPartitionError())) == "unknown_topic"
    assert send_error_reason(wrapped(KafkaTimeoutError())) == "timeout"
    assert send_error_reason(TimeoutError()) == "timeout"
    assert send_error_reason(wrapped(MessageSizeTooLargeError())) == "too_large"
    assert send_error_reason(wrapped(KafkaConnectionError())) == "broker"
    assert send_error_reason(ValueError("x")) == "other"


async def test_a_timer_that_raises_is_logged_and_the_worker_goes_on(caplog):
    """Faust stops the whole worker when a timer raises: every mmsync timer is guarded."""
    from app.runtime.delivery import DeliveryError as Given
    from app.runtime.faust_app import guarded

    async def bug() -> None:
        raise KeyError("boom")

    async def gave_up() -> None:
        raise Given("3 records not delivered after 8 tries (mm.aligned: 3)")

    async def cancelled() -> None:
        raise asyncio.CancelledError

    await guarded("t.bug", bug)()
    await guarded("t.gave_up", gave_up)()
    with pytest.raises(asyncio.CancelledError):
        await guarded("t.cancelled", cancelled)()
    text = caplog.text
    assert "t.bug failed" in text and "KeyError" in text
    assert "t.gave_up: 3 records not delivered" in text
