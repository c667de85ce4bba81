"""Every stream's newest skew estimate, read from ``PREFIX.skew`` by each worker.

The estimate lives in the aligner (``app.align.skew``), which may run in another
worker than the feature agent that sees an input first. The aligner publishes a
:class:`schemas.skew.SkewState` with every window it emits; each worker runs one
reader of that topic (all partitions, no consumer group, from the beginning: a
fresh worker learns every stream's estimate before its first batch arrives, as far
as the topic holds it) and keeps the newest state per stream here. The feature
agents look a stream up when they make an alert (``app.alerts.detect``).

How stale it can be: one window (the aligner publishes at each window close) plus
the topic's round trip (tens of ms). A stream the board does not know, or a
modality without an estimate, gets offset 0 and confidence 0, which the alert says.
"""

from __future__ import annotations

import asyncio
import logging

from app.alerts.detect import SkewView
from app.errors import InvalidInputError
from app.kafka.clients import consume
from app.lru import LRU
from app.settings import Settings
from schemas.skew import SkewState

__all__ = ["SkewBoard", "follow"]

log = logging.getLogger(__name__)

#: Streams remembered per worker (an LRU: a worker serving ever new streams stays bounded).
_MAX_STREAMS = 65_536
#: Pause before the reader reconnects after the broker dropped it, s.
_RETRY_S = 1.0


class SkewBoard:
    """The newest SkewState per stream (by its ``at``), and the view an alert uses."""

    def __init__(self, reference: str = "image", window_us: int = 1_000_000,
                 max_streams: int = _MAX_STREAMS) -> None:
        self.reference = reference
        self.window_us = window_us
        self._states: LRU[str, SkewState] = LRU(max_streams)
        #: records on the topic that did not decode (skipped)
        self.bad = 0

    def update(self, st: SkewState) -> bool:
        """Keep ``st`` unless an estimate at least as new is known; True if kept."""
        old = self._states.get(st.stream_id)
        if old is not None and old.at > st.at:
            return False
        self._states.put(st.stream_id, st)
        return True

    def on_value(self, raw: bytes | None) -> None:
        try:
            self.update(SkewState.decode(raw))
        except InvalidInputError as exc:
            self.bad += 1
            log.warning("skipping a skew state that does not decode: %s", exc)

    def get(self, stream_id: str) -> SkewState | None:
        return self._states.get(stream_id)

    def view(self, stream_id: str, modality: str) -> SkewView:
        """The offset to apply to ``modality``'s ts in ``stream_id`` (the reference: 0, and
        confidence 1), with the confidence and the window length it comes with."""
        st = self._states.get(stream_id)
        window_us = st.window_us if st is not None else self.window_us
        if modality == self.reference:
            return SkewView(0, 1.0, window_us)
        if st is None:
            return SkewView(0, 0.0, window_us)
        off = st.offsets_ms.get(modality, 0.0)
        return SkewView(round(off * 1000), min(1.0, max(0.0, st.confidence.get(modality, 0.0))),
                        window_us)

    def __len__(self) -> int:
        return len(self._states)


async def follow(s: Settings, board: SkewBoard) -> None:
    """Read ``PREFIX.skew`` into ``board`` for as long as the worker runs.

    The topic exists before the worker starts (``app.kafka.topics.ensure_topics``): a
    consumer without a group that subscribes to a missing topic would wait for its next
    metadata refresh (minutes) to see it. Broker trouble is logged and retried, never fatal.
    """
    while True:
        try:
            await consume(s, [s.topic("skew")], lambda m: board.on_value(m.value), poll_ms=500)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the alerts fall back to offset 0 meanwhile
            log.warning("skew reader stopped (%s); reconnecting in %.0f s", exc, _RETRY_S)
        await asyncio.sleep(_RETRY_S)
