"""Turn a batch of raw input records into feature records or dead letters (pure, blocking).

Runs in a worker thread (one per modality, so each stream's order holds). A
batch is decoded first, then each model runs once on all of it: batching is
where the models' throughput comes from (``scripts/bench_extract.py``).
With ``models="light"`` only the cheap aligner signals are computed.

Failures. A record that fails validation or decoding is dead-lettered with
its reason (``InvalidInputError``). When an extractor raises anything else on
a batch, the batch is run again one record at a time, so one poison record
cannot take its neighbours with it: a record that raises
:class:`app.errors.TransientError` (retriable: a GPU out of memory with no CPU
fallback) is retried up to ``_RETRIES`` times with a growing pause and then
dead-lettered as ``retries_exhausted``; any other exception on a record alone
dead-letters it as ``extract_failed``. A worker never crashes on data.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol, cast

from app.cache.features import FeatureMemo
from app.consumed import RawMsg, dead_letter
from app.errors import InvalidInputError, MmsyncError
from app.features.audio import AudioExtractor
from app.features.degrade import LEVELS, Degrader, Level
from app.features.image import ImageExtractor
from app.features.light import ImageSignals, audio_signals, text_signals
from app.features.onnx import ModelRuntime
from app.features.text import TermMatcher, TextExtractor
from app.settings import Settings
from schemas.dead_letter import DeadLetter
from schemas.events import AudioChunk, Event, FrameEvent, Limits, TextEvent, decode_event
from schemas.features import FeatureRecord

__all__ = ["Extractor", "FeaturePipeline"]

log = logging.getLogger(__name__)

#: What an extractor gives per event: its features, or the error for that event.
Result = dict[str, Any] | Exception
#: Retries of a record that raised a TransientError alone, and the first pause, s
#: (doubling: 0.05, 0.1, 0.2 s; bounded so a modality thread stalls well under 1 s).
_RETRIES = 3
_RETRY_PAUSE_S = 0.05


class Extractor(Protocol):
    """One modality's feature extractor (``app/features/{image,audio,text}.py``)."""

    #: seconds each model took to load, by model name (for the ``load_*`` stage)
    load_s: dict[str, float]

    def load(self) -> None:
        """Load (and the first time export) the models; idempotent."""

    def run(self, events: list[Any]) -> list[Result]:
        """One result per event, in order; InvalidInputError for a bad event. May raise
        for the whole batch (a model failure)."""

    def set_level(self, level: Level) -> None:
        """Apply a degradation level (``app.features.degrade``): which models run."""


class _Light:
    """The light profile: per-event signals, no models (so no degradation either)."""

    def __init__(self) -> None:
        self._image = ImageSignals()
        self.load_s: dict[str, float] = {}

    def load(self) -> None:
        return None

    def set_level(self, level: Level) -> None:
        return None

    def run(self, events: list[Any]) -> list[Result]:
        out: list[Result] = []
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
    content-pure model features; the light profile never uses it. ``clock``
    (wall s: queueing delay against Kafka timestamps), ``monotonic`` (s: the
    degrader's periods) and ``sleep`` (retry pauses) are injectable for tests.
    """

    def __init__(self, s: Settings, cache: FeatureMemo | None = None, *,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.settings = s
        self.cache = cache if s.models == "full" else None
        self.limits = Limits(max_text_bytes=s.max_text_bytes, max_image_bytes=s.max_image_bytes,
                             max_audio_bytes=s.max_audio_bytes, max_future_s=s.max_future_s)
        self.runtime = ModelRuntime.from_settings(s)
        self._extractors: dict[str, Extractor] = {}
        self.degrader = Degrader(lag_s=s.degrade_lag_ms / 1000, enabled=s.degrade)
        self._clock, self._monotonic, self._sleep = clock, monotonic, sleep
        #: modality -> wall seconds a batch took per record (EWMA, 0.2 per batch): what a
        #: record waiting behind the batch costs (see _degrade)
        self._record_s: dict[str, float] = {}

    def extractor(self, modality: str) -> Extractor:
        ex = self._extractors.get(modality)
        if ex is None:
            ex = self._extractors[modality] = self._build(modality)
        return ex

    def _build(self, modality: str) -> Extractor:
        s = self.settings
        if s.models == "light":
            return _Light()
        if modality == "image":
            return ImageExtractor(self.runtime, s.ocr_every_n_frames, s.image_dedup,
                                  self.runtime.threads, self.cache,
                                  # used only by batches that skip the embedding
                                  int8_fallback=(s.degrade and s.degrade_int8
                                                 and s.degrade_embed_lag_ms > 0))
        if modality == "audio":
            return AudioExtractor(self.runtime, self.cache)
        if modality == "text":
            return TextExtractor(TermMatcher.from_files(s.terms_paths), s.text_embedding,
                                 self.runtime.threads, self.cache)
        raise ValueError(f"unknown modality {modality!r}")

    def warm(self, modality: str) -> dict[str, float]:
        """Load (and export, the first time) the modality's models; seconds per model."""
        ex = self.extractor(modality)
        ex.load()
        return dict(ex.load_s)

    def level_now(self) -> int:
        """The degradation level now (it decays between batches too)."""
        return self.degrader.at(self._monotonic())

    def _degrade(self, ex: Extractor, modality: str, msgs: list[RawMsg], behind: int) -> None:
        """Set the level from how long this batch's oldest record waited (app.features.degrade),
        or, when longer, how long the last of the ``behind`` records waiting after it will
        have waited when its own batch starts (records x the recent seconds per record): a
        burst is seen when it arrives, not once its records are a second old. And whether a
        frame batch runs EfficientNet at all.

        Issue 26: the level reacts to a backlog 1 s old (``MMSYNC_DEGRADE_LAG_MS``), but a
        frame alert should come within 300 ms, and a 3x burst outruns both image models at
        once for its 2 s. A frame batch whose alerts would come more than
        ``MMSYNC_DEGRADE_EMBED_LAG_MS`` after their records (the delay so far plus the
        batch's time to its scores, ``ImageExtractor.score_s``) runs Open-NSFW alone (the
        score an alert needs; EfficientNet is 30 to 40 % of a frame's model time): decided
        per batch, so the embeddings are back with the first batch
        that is not behind, and no frame goes unscored for it. At FP32 on a CPU with an
        INT8 instruction such a batch is scored by the INT8 Open-NSFW
        (``MMSYNC_DEGRADE_INT8``), 2.7x faster."""
        sent = [m.timestamp_ms for m in msgs if m.timestamp_ms > 0]
        delay_s = max(0.0, self._clock() - min(sent) / 1000.0) if sent else 0.0
        delay_s = max(delay_s, behind * self._record_s.get(modality, 0.0))
        if isinstance(ex, ImageExtractor):
            # The alert of the batch's last frame, were it run with the embedding: the
            # delay so far plus the batch's time to its scores at the recent seconds per
            # frame. Against the delay alone, a frame alert's p99 sat at the bound plus a
            # batch's Open-NSFW time (359 ms at FP32 on Kafka, docs/benchmarks.md).
            lag_s = self.settings.degrade_embed_lag_ms / 1000
            alert_s = delay_s + len(msgs) * ex.score_s
            ex.embed = not (self.degrader.enabled and lag_s > 0 and alert_s > lag_s)
        if not sent:
            return
        ex.set_level(LEVELS[self.degrader.observe(delay_s, self._monotonic())])

    def _run(self, ex: Extractor, modality: str, events: list[Event],
             scored: Callable[[list[Result]], None] | None = None) -> list[Result]:
        """The batch's results; if the batch raises, each record alone (see the module doc).
        ``scored``: the image extractor's early call (:meth:`ImageExtractor.run`); the
        records run alone make none (their alerts come with their features)."""
        try:
            if scored is not None and isinstance(ex, ImageExtractor):
                return ex.run(cast("list[FrameEvent]", events), scored)
            return ex.run(events)
        except Exception:  # noqa: BLE001 - a worker never crashes on data
            log.exception("extractor failed on a %s batch of %d: running them one by one",
                          modality, len(events))
        return [self._run_one(ex, ev) for ev in events]

    def _run_one(self, ex: Extractor, ev: Event) -> Result:
        pause = _RETRY_PAUSE_S
        for attempt in range(_RETRIES + 1):
            try:
                return ex.run([ev])[0]
            except MmsyncError as exc:
                if not exc.retriable:
                    return _Failed("extract_failed", exc)
                if attempt == _RETRIES:
                    return _Failed("retries_exhausted", exc)
                self._sleep(pause)
                pause *= 2
            except Exception as exc:  # noqa: BLE001 - see above
                return _Failed("extract_failed", exc)
        raise AssertionError("unreachable")  # pragma: no cover

    def alert_records(self, modality: str, msgs: list[RawMsg]) -> list[FeatureRecord]:
        """What a caption's alert needs, before any model runs: each caption decoded and
        matched against the term lists (msgpack and Aho-Corasick: tens of microseconds a
        caption, cheap enough for the event loop), as records with only ``terms``.

        Issue 26: a caption's alert waited for its batch's sentence embeddings (16-85 ms a
        caption on these cores, behind the image models for the CPU), though a term
        match needs none of it. Other modalities' alerts need the image models' scores:
        nothing for them here, nor for the light profile (it matches no terms). A record
        that does not decode is left to :meth:`process`, which dead-letters it."""
        if modality != "text" or self.settings.models != "full":
            return []
        ex = self.extractor("text")
        assert isinstance(ex, TextExtractor)
        out: list[FeatureRecord] = []
        for msg in msgs:
            try:
                ev = decode_event(modality, msg.key, msg.value, self.limits)
            except InvalidInputError:
                continue
            terms = ex.matcher(ev.text) if isinstance(ev, TextEvent) and ev.text.strip() else []
            out.append(_record(modality, msg, ev, {"terms": terms}, {}))
        return out

    def process(self, modality: str, msgs: list[RawMsg],
                on_scored: Callable[[list[FeatureRecord]], None] | None = None,
                behind: int = 0) -> list[FeatureRecord | DeadLetter]:
        """One output per input, in input order. ``behind``: records waiting after this
        batch in the agent's input partitions (the degradation signal, :meth:`_degrade`).

        ``on_scored`` (image, full models): called at most once, in this thread, with a
        record per decoded frame holding what its alert needs (its NSFW score, or
        ``held``), as soon as every score of the batch exists and before EfficientNet
        and OCR run (issue 26: a frame alert waited for them). Not called when the
        batch failed before its scores existed: its alerts then come with
        :meth:`process`'s records."""
        ex = self.extractor(modality)
        self._degrade(ex, modality, msgs, behind)
        started = self._clock()
        t_batch = time.perf_counter()
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
            scored = None
            if on_scored is not None:
                def scored(res: list[Result]) -> None:
                    on_scored([_record(modality, msgs[i], ev, r, {})
                               for (i, ev, _), r in zip(events, res, strict=True)
                               if isinstance(r, dict)])
            results = self._run(ex, modality, [ev for _, ev, _ in events], scored)
            # The batch ran as one: each item is charged its share.
            cache_s = ((self.cache.seconds() - c1) if self.cache is not None else 0.0)
            model_s = (time.perf_counter() - t1 - cache_s) / len(events)
            cache_s /= len(events)
            for (i, ev, decode_s), res in zip(events, results, strict=True):
                msg = msgs[i]
                if isinstance(res, InvalidInputError):
                    out[i] = dead_letter(msg, res.reason, res.detail)
                elif isinstance(res, _Failed):
                    out[i] = dead_letter(msg, res.reason, res.detail)
                elif isinstance(res, Exception):
                    out[i] = dead_letter(msg, "extract_failed", f"{type(res).__name__}: {res}")
                else:
                    out[i] = _record(modality, msg, ev, res, {
                        "queue": max(0.0, started - msg.timestamp_ms / 1000)
                        if msg.timestamp_ms > 0 else 0.0,
                        "decode": decode_s, "model": model_s, "cache": cache_s})
        if msgs:
            per = (time.perf_counter() - t_batch) / len(msgs)
            last = self._record_s.get(modality)
            self._record_s[modality] = per if last is None else 0.8 * last + 0.2 * per
        return [o for o in out if o is not None]


def _record(modality: str, msg: RawMsg, ev: Event, feats: dict[str, Any],
            stages: dict[str, float]) -> FeatureRecord:
    return FeatureRecord(
        stream_id=ev.stream_id, modality=modality, ts=ev.ts, dur=ev.duration_us, seq=ev.seq,
        trace_id=ev.trace_id or f"{modality}-{msg.partition}-{msg.offset}",
        kafka_ts_ms=msg.timestamp_ms, src_partition=msg.partition, src_offset=msg.offset,
        feats=feats, stages=stages)


class _Failed(Exception):
    """A record the extractor failed on alone: its dead-letter reason and detail."""

    def __init__(self, reason: str, exc: BaseException) -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = f"{type(exc).__name__}: {exc}"
