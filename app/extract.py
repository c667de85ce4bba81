"""Turn a batch of raw input records into feature records or dead letters (pure, blocking).

Runs in a worker thread (one per modality, so each stream's order holds).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from app.dlq import RawMsg, dead_letter
from app.errors import InvalidInputError
from app.extractors.light import ImageSignals, audio_signals, text_signals
from app.settings import Settings
from schemas.dead_letter import DeadLetter
from schemas.events import AudioChunk, Event, FrameEvent, Limits, TextEvent, decode_event
from schemas.features import FeatureRecord

__all__ = ["FeaturePipeline"]

log = logging.getLogger(__name__)


class FeaturePipeline:
    def __init__(self, s: Settings) -> None:
        self.limits = Limits(max_text_bytes=s.max_text_bytes, max_image_bytes=s.max_image_bytes,
                             max_audio_bytes=s.max_audio_bytes, max_future_s=s.max_future_s)
        self._image = ImageSignals()

    def features(self, ev: Event) -> dict[str, Any]:
        if isinstance(ev, FrameEvent):
            return self._image(ev)
        if isinstance(ev, AudioChunk):
            return audio_signals(ev)
        if isinstance(ev, TextEvent):
            return text_signals(ev)
        raise TypeError(type(ev))

    def process(self, modality: str, msgs: list[RawMsg]) -> list[FeatureRecord | DeadLetter]:
        """One output per input, in input order."""
        out: list[FeatureRecord | DeadLetter] = []
        for msg in msgs:
            t0 = time.perf_counter()
            try:
                ev = decode_event(modality, msg.key, msg.value, self.limits)
                t1 = time.perf_counter()
                feats = self.features(ev)
            except InvalidInputError as exc:
                out.append(dead_letter(msg, exc.reason, exc.detail))
                continue
            except Exception as exc:  # noqa: BLE001 - a worker never crashes on data
                log.exception("extractor failed on %s[%d]@%d", msg.topic, msg.partition,
                              msg.offset)
                out.append(dead_letter(msg, "extract_failed", f"{type(exc).__name__}: {exc}"))
                continue
            t2 = time.perf_counter()
            out.append(FeatureRecord(
                stream_id=ev.stream_id, modality=modality, ts=ev.ts, dur=ev.duration_us,
                seq=ev.seq, trace_id=ev.trace_id or f"{modality}-{msg.partition}-{msg.offset}",
                kafka_ts_ms=msg.timestamp_ms,
                src_partition=msg.partition, src_offset=msg.offset, feats=feats,
                stages={"decode": t1 - t0, "model": t2 - t1},
            ))
        return out
