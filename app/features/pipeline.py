"""Turn a batch of raw input records into feature records or dead letters (pure, blocking).

Runs in a worker thread (one per modality, so each stream's order holds). A
batch is decoded first, then each model runs once on all of it: batching is
where the models' throughput comes from (``scripts/bench_extract.py``).
With ``models="light"`` only the cheap aligner signals are computed.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from app.cache.features import FeatureMemo
from app.consumed import RawMsg, dead_letter
from app.errors import InvalidInputError
from app.features.audio import AudioExtractor
from app.features.degrade import LEVELS, Degrader
from app.features.image import ImageExtractor
from app.features.light import ImageSignals, audio_signals, text_signals
from app.features.onnx import ModelRuntime
from app.features.text import TermMatcher, TextExtractor
from app.settings import Settings
from schemas.dead_letter import DeadLetter
from schemas.events import AudioChunk, Event, FrameEvent, Limits, TextEvent, decode_event
from schemas.features import FeatureRecord

__all__ = ["FeaturePipeline"]

log = logging.getLogger(__name__)

_Result = dict[str, Any] | Exception


class _Light:
    """The light profile: per-event signals, no models."""

    def __init__(self) -> None:
        self._image = ImageSignals()
        self.load_s: dict[str, float] = {}

    def load(self) -> None:
        return None

    def run(self, events: list[Any]) -> list[_Result]:
        out: list[_Result] = []
        for ev in events:
            try:
                if isinstance(ev, FrameEvent):
                    out.append(self._image(ev))
                elif isinstance(ev, AudioChunk):
                    out.append(audio_signals(ev))
                elif isinstance(ev, TextEvent):
                    out.append(text_signals(ev))
                else:
                    raise TypeError(type(ev))
            except InvalidInputError as exc:
                out.append(exc)
        return out


class FeaturePipeline:
    """Per-modality extractors, built lazily in the thread that first uses them.

    ``cache`` (the worker's, shared by its modality threads) memoises the
    content-pure model features; the light profile never uses it.
    """

    def __init__(self, s: Settings, cache: FeatureMemo | None = None) -> None:
        self.settings = s
        self.cache = cache if s.models == "full" else None
        self.limits = Limits(max_text_bytes=s.max_text_bytes, max_image_bytes=s.max_image_bytes,
                             max_audio_bytes=s.max_audio_bytes, max_future_s=s.max_future_s)
        self.runtime = ModelRuntime.from_settings(s)
        self._extractors: dict[str, Any] = {}
        self.degrader = Degrader(lag_s=s.degrade_lag_ms / 1000, enabled=s.degrade)

    def extractor(self, modality: str) -> Any:
        ex = self._extractors.get(modality)
        if ex is None:
            s = self.settings
            if s.models == "light":
                ex = _Light()
            elif modality == "image":
                ex = ImageExtractor(self.runtime, s.ocr_every_n_frames, s.image_dedup,
                                    self.runtime.threads, self.cache)
            elif modality == "audio":
                ex = AudioExtractor(self.runtime, self.cache)
            elif modality == "text":
                ex = TextExtractor(TermMatcher.from_files(s.terms_paths), s.text_embedding,
                                   self.runtime.threads, self.cache)
            else:
                raise ValueError(f"unknown modality {modality!r}")
            self._extractors[modality] = ex
        return ex

    def warm(self, modality: str) -> dict[str, float]:
        """Load (and export, the first time) the modality's models; seconds per model."""
        ex = self.extractor(modality)
        ex.load()
        return dict(ex.load_s)

    def features(self, ev: Event) -> dict[str, Any]:
        """Features of one event (a batch of one); raises what the extractor raised."""
        modality = ("image" if isinstance(ev, FrameEvent) else
                    "audio" if isinstance(ev, AudioChunk) else "text")
        res = self.extractor(modality).run([ev])[0]
        if isinstance(res, Exception):
            raise res
        return dict(res)

    def _degrade(self, modality: str, msgs: list[RawMsg]) -> None:
        """Set the level from how long this batch's oldest record waited (app.features.degrade)."""
        sent = [m.timestamp_ms for m in msgs if m.timestamp_ms > 0]
        if not sent:
            return
        delay_s = max(0.0, time.time() - min(sent) / 1000.0)
        level = LEVELS[self.degrader.observe(delay_s, time.monotonic())]
        ex = self._extractors.get(modality)
        if ex is not None and hasattr(ex, "level"):
            ex.level = level
        if ex is not None and hasattr(ex, "embedding_allowed"):
            ex.embedding_allowed = level.text_embedding

    def process(self, modality: str, msgs: list[RawMsg]) -> list[FeatureRecord | DeadLetter]:
        """One output per input, in input order."""
        self.extractor(modality)
        self._degrade(modality, msgs)
        started = time.time()
        out: list[FeatureRecord | DeadLetter | None] = [None] * len(msgs)
        events: list[tuple[int, Event, float]] = []
        for i, msg in enumerate(msgs):
            t0 = time.perf_counter()
            try:
                events.append((i, decode_event(modality, msg.key, msg.value, self.limits),
                               time.perf_counter() - t0))
            except InvalidInputError as exc:
                out[i] = dead_letter(msg, exc.reason, exc.detail)
        if events:
            t1 = time.perf_counter()
            c1 = self.cache.seconds() if self.cache is not None else 0.0
            try:
                results = self.extractor(modality).run([ev for _, ev, _ in events])
            except Exception as exc:  # noqa: BLE001 - a worker never crashes on data
                log.exception("extractor failed on a %s batch of %d", modality, len(events))
                results = [exc] * len(events)
            # The batch ran as one: each item is charged its share.
            cache_s = ((self.cache.seconds() - c1) if self.cache is not None else 0.0)
            model_s = (time.perf_counter() - t1 - cache_s) / len(events)
            cache_s /= len(events)
            for (i, ev, decode_s), res in zip(events, results, strict=True):
                msg = msgs[i]
                if isinstance(res, InvalidInputError):
                    out[i] = dead_letter(msg, res.reason, res.detail)
                elif isinstance(res, Exception):
                    out[i] = dead_letter(msg, "extract_failed", f"{type(res).__name__}: {res}")
                else:
                    out[i] = FeatureRecord(
                        stream_id=ev.stream_id, modality=modality, ts=ev.ts, dur=ev.duration_us,
                        seq=ev.seq,
                        trace_id=ev.trace_id or f"{modality}-{msg.partition}-{msg.offset}",
                        kafka_ts_ms=msg.timestamp_ms, src_partition=msg.partition,
                        src_offset=msg.offset, feats=res,
                        stages={"queue": max(0.0, started - msg.timestamp_ms / 1000)
                                if msg.timestamp_ms > 0 else 0.0,
                                "decode": decode_s, "model": model_s, "cache": cache_s},
                    )
        return [o for o in out if o is not None]
