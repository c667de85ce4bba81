"""The naive baseline: what a first version without mmsync's design would do.

One aiokafka consumer over the three input topics and a plain loop: each
record is decoded and run through the same extractors (``app/features``)
one at a time, synchronously, on the event loop (no thread, no batching, no
near-duplicate reuse, no feature cache), then put into a per-stream tumbling
window by its raw ``ts`` (no skew correction). A window is sent when every
modality heard in the last ``idle_ms`` has passed its end plus the lateness
(or when the stream goes quiet), as a small record on ``PREFIX.naive`` with
the merged ``counts`` and ``trace_ids``, and the output's Kafka timestamp
minus each input's is its end-to-end latency, measured the same way as for
``mm.aligned``. A record for a window already sent goes out as ``late``.

Only for ``scripts/bench.py``: ``python -m scripts.benchlib.naive`` reads ``MMSYNC_*``
like a worker and runs until SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from app.features.pipeline import FeaturePipeline
from app.kafka.clients import make_consumer, make_producer
from app.settings import MODALITIES, Settings
from schemas.codec import encode
from schemas.events import Limits, decode_event

__all__ = ["NaiveWindows", "run_naive"]

log = logging.getLogger(__name__)

NAIVE_TOPIC = "naive"


@dataclass
class _Stream:
    windows: dict[int, dict[str, Any]] = field(default_factory=dict)
    newest: dict[str, int] = field(default_factory=dict)
    heard: dict[str, float] = field(default_factory=dict)
    closed_until: int = -1


class NaiveWindows:
    """Tumbling windows per stream on raw ``ts``; returns the records to send."""

    def __init__(self, window_us: int, lateness_us: int, idle_s: float) -> None:
        self.window_us, self.lateness_us, self.idle_s = window_us, lateness_us, idle_s
        self.streams: dict[str, _Stream] = {}

    def add(self, sid: str, modality: str, ts: int, dur: int, trace_id: str | None,
            feats: dict[str, Any], now: float) -> dict[str, Any] | None:
        """Put a record in its window; a late record comes back to be sent at once."""
        st = self.streams.setdefault(sid, _Stream())
        start = ts // self.window_us * self.window_us
        st.heard[modality] = now
        if start + self.window_us <= st.closed_until:
            return {"kind": "late", "stream_id": sid, "modality": modality, "trace_id": trace_id}
        st.newest[modality] = max(st.newest.get(modality, -1), ts + dur)
        w = st.windows.setdefault(start, {"counts": {}, "trace_ids": [], "nsfw": 0.0})
        w["counts"][modality] = w["counts"].get(modality, 0) + 1
        if trace_id:
            w["trace_ids"].append(trace_id)
        if "nsfw" in feats:
            w["nsfw"] = max(w["nsfw"], float(feats["nsfw"]))
        return None

    def due(self, now: float) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        for sid, st in self.streams.items():
            marks = [st.newest[m] - self.lateness_us for m in st.newest
                     if now - st.heard.get(m, 0.0) < self.idle_s]
            wm = min(marks) if marks else float("inf")
            for start in sorted(st.windows):
                if start + self.window_us > wm:
                    break
                w = st.windows.pop(start)
                st.closed_until = max(st.closed_until, start + self.window_us)
                out.append((sid, {"kind": "window", "stream_id": sid, "window_start": start,
                                  "window_end": start + self.window_us, **w}))
        return out


def _extract(pipeline: FeaturePipeline, modality: str, ev: Any) -> dict[str, Any]:
    """The same extractor as mmsync, one item, on the calling (event loop) thread."""
    ex = pipeline.extractor(modality)
    res = ex.run([ev])[0]
    memo = getattr(ex, "_memo", None)
    if memo is not None:
        memo.clear()  # the text extractor's embedding memo is a cache: not in the baseline
    if isinstance(res, Exception):
        raise res
    return dict(res)


async def run_naive(s: Settings, stop: asyncio.Event) -> None:
    # No near-duplicate reuse and no cache: every item pays its models.
    pipeline = FeaturePipeline(s.model_copy(update={"image_dedup": False, "cache": False}), None)
    for m in MODALITIES:
        pipeline.warm(m)
    limits = Limits()
    wins = NaiveWindows(s.window_ms * 1000, s.lateness_ms * 1000, s.idle_ms / 1000)
    consumer = make_consumer(s, *(s.topic(m) for m in MODALITIES), group_id="mmsync-naive",
                             enable_auto_commit=True)
    producer = make_producer(s)
    topic = s.topic(NAIVE_TOPIC)
    await consumer.start()
    await producer.start()
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=100)
            for tp, msgs in batch.items():
                modality = tp.topic.rsplit(".", 1)[-1]
                for m in msgs:
                    try:
                        ev = decode_event(modality, m.key, m.value, limits)
                        feats = _extract(pipeline, modality, ev)
                    except Exception as exc:  # noqa: BLE001 - a bad record is a late-like drop
                        await producer.send_and_wait(topic, key=m.key, value=encode(
                            {"kind": "dlq", "error": type(exc).__name__}))
                        continue
                    late = wins.add(ev.stream_id, modality, ev.ts, ev.duration_us, ev.trace_id,
                                    feats, time.time())
                    if late is not None:
                        await producer.send_and_wait(topic, key=m.key, value=encode(late))
                    for sid, rec in wins.due(time.time()):
                        await producer.send_and_wait(topic, key=sid.encode(), value=encode(rec))
            for sid, rec in wins.due(time.time()):
                await producer.send_and_wait(topic, key=sid.encode(), value=encode(rec))
    finally:
        await producer.stop()
        await consumer.stop()


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    s = Settings()

    async def _run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await run_naive(s, stop)

    asyncio.run(_run())


if __name__ == "__main__":
    main()
