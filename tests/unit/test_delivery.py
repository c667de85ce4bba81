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
