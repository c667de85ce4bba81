"""Sends whose delivery is confirmed before what they stand for is acked.

Faust's ``topic.send`` hands a record to the producer and returns a future of
its delivery; a failed delivery is only logged ("exception was never
retrieved") and the agent moves on, so a record whose window (or features)
never reached the broker would be acked and lost: seen on the embedded broker
restarting while a worker sent. Here every send of a step is awaited, failed
ones are sent again with a growing pause, and only then do the callers ack.
A broker away longer than the retries raises :class:`DeliveryError`: the
agent stops acking (Faust restarts it), and what it had not acked is
consumed again after the next rebalance or restart: at least once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from app.errors import MmsyncError

__all__ = ["DeliveryError", "deliver"]

log = logging.getLogger(__name__)

#: A send: starts one produce request and returns the future of its delivery.
Send = Callable[[], Awaitable[Awaitable[Any]]]


class DeliveryError(MmsyncError):
    """Records could not be delivered to the broker within the retries."""

    retriable = True


async def deliver(sends: list[Send], *, attempts: int = 8, first_pause_s: float = 0.25,
                  max_pause_s: float = 4.0) -> None:
    """Run every send and wait for the broker to confirm each one; resend the failed
    ones, pausing 0.25 s doubling to 4 s (about 20 s in all by default)."""
    pending = sends
    pause = first_pause_s
    for attempt in range(attempts):
        futures = [await send() for send in pending]
        results = await asyncio.gather(*futures, return_exceptions=True)
        failed = [(s, r) for s, r in zip(pending, results, strict=True)
                  if isinstance(r, Exception)]
        if not failed:
            return
        if attempt == attempts - 1:
            raise DeliveryError(f"{len(failed)} records not delivered after {attempts} tries: "
                                f"{failed[0][1]!r}")
        log.warning("%d of %d records not delivered (%r); sending them again in %.2f s",
                    len(failed), len(pending), failed[0][1], pause)
        pending = [s for s, _ in failed]
        await asyncio.sleep(pause)
        pause = min(pause * 2, max_pause_s)
