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
