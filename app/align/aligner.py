"""Event-time windowing, watermarks and resampling onto the sync grid (pure).

Per stream, every feature record falls into the tumbling window
``floor((ts - offset) / W) * W`` on the reference (image) clock, where
``offset`` is the modality's estimated lag behind the reference
(``app.align.skew``; 0 with correction off). Records wait unbucketed until their
window closes, so a better estimate still moves them. A window closes when
the stream's watermark passes its end:

    watermark = min(newest corrected ts - margin of each *active* modality) - lateness

where the margin is up to ``max_skew`` while a modality's skew is unsure.

A modality is active while it has been heard from within ``idle_s`` of wall
time; a modality never heard from holds the watermark for ``idle_s`` after the
stream's first record (so a slow-to-start agent does not make its first
records late); when every modality is idle, all open windows close. A record
for a window that already closed is *late*; a record whose ``seq`` was seen
is a *duplicate*. Every record ends in exactly one of: merged, late,
duplicate (contract, "Accounting").
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.align.skew import SkewConfig, StreamSkew
from app.settings import MODALITIES
from schemas.aligned import AlignedWindow, LateEvent
from schemas.codec import pack_array, unpack_array
from schemas.features import FeatureRecord

__all__ = ["AddResult", "Aligner", "AlignerConfig", "StreamState", "build_window"]

#: How many recent seqs per stream and modality are remembered for de-duplication.
_SEQ_MEMORY = 8192


@dataclass(frozen=True, slots=True)
class AlignerConfig:
    window_us: int = 1_000_000
    lateness_us: int = 200_000
    idle_s: float = 2.0
    rate_hz: float = 20.0
    reference: str = "image"
    modalities: tuple[str, ...] = MODALITIES
    #: estimate skew by DTW and correct for it (off: every offset is 0).
    correct_skew: bool = True
    max_skew_us: int = 1_000_000
    #: how much media the skew estimate looks at, us.
    skew_context_us: int = 8_000_000
    #: a stream with nothing open and no record for this long (wall clock, s) is
    #: forgotten, so a worker serving ever new streams holds bounded state.
    stream_ttl_s: float = 600.0

    @property
    def tick_us(self) -> int:
        return round(1_000_000 / self.rate_hz)

    @property
    def ticks(self) -> int:
        return max(1, round(self.window_us * self.rate_hz / 1_000_000))


@dataclass(slots=True)
class AddResult:
    """What became of one record: ``merged``, ``late`` (with its LateEvent) or ``duplicate``."""

    outcome: str
    late: LateEvent | None = None
    window_start: int | None = None


@dataclass(slots=True)
class StreamState:
    first_seen: float
    skew: StreamSkew
    #: records not yet emitted. They are bucketed into windows only when
    #: their window closes, with the skew estimate of that moment, so a
    #: better estimate moves records that are still open.
    pending: list[FeatureRecord] = field(default_factory=list)
    #: newest raw (uncorrected) end time per modality, us.
    newest: dict[str, int] = field(default_factory=dict)
    heard: dict[str, float] = field(default_factory=dict)
    #: every window ending at or before this has been emitted (or never had data).
    closed_until: int = -1
    seqs: dict[str, OrderedDict[int, None]] = field(default_factory=dict)
    #: the last image scalars, held across window boundaries (sample-and-hold).
    hold: dict[str, float] = field(default_factory=dict)


class Aligner:
    """Windows of many streams. Not thread-safe: one per aligner agent."""

    def __init__(self, cfg: AlignerConfig) -> None:
        self.cfg = cfg
        self.streams: dict[str, StreamState] = {}
        #: streams with pending records: the only ones a poll needs to look at.
        self._open: set[str] = set()
        self._skew_cfg = SkewConfig(tick_us=cfg.tick_us, max_skew_us=cfg.max_skew_us,
                                    context_us=cfg.skew_context_us, reference=cfg.reference)

    # -- skew --------------------------------------------------------------
    def offset_us(self, stream_id: str, modality: str) -> int:
        """Estimated lag of ``modality`` behind the reference in this stream, us."""
        st = self.streams.get(stream_id)
        return 0 if st is None else self.offset_us_of(st, modality)

    def confidence(self, stream_id: str, modality: str) -> float:
        st = self.streams.get(stream_id)
        if modality == self.cfg.reference:
            return 1.0
        if st is None or not self.cfg.correct_skew:
            return 0.0
        return st.skew.confidence(modality)

    def margin_us(self, st: StreamState, modality: str) -> int:
        """How far a modality's corrected time may still move, us.

        Until its skew is known with confidence, a modality's content for a
        window may arrive anywhere within ``max_skew`` of it: the watermark
        waits that much longer rather than turn correct records into late ones.
        """
        if modality == self.cfg.reference or not self.cfg.correct_skew:
            return 0
        return round(self.cfg.max_skew_us * (1.0 - st.skew.confidence(modality)))

    # -- input -------------------------------------------------------------
    def corrected_ts(self, rec: FeatureRecord) -> int:
        return rec.ts - self.offset_us(rec.stream_id, rec.modality)

    def _state(self, stream_id: str, now: float) -> StreamState:
        st = self.streams.get(stream_id)
        if st is None:
            st = self.streams[stream_id] = StreamState(
                first_seen=now, skew=StreamSkew(self._skew_cfg, self.cfg.modalities))
        return st

    def add(self, rec: FeatureRecord, now: float) -> AddResult:
        st = self._state(rec.stream_id, now)
        if rec.seq is not None:
            seen = st.seqs.setdefault(rec.modality, OrderedDict())
            if rec.seq in seen:
                return AddResult("duplicate")
            seen[rec.seq] = None
            if len(seen) > _SEQ_MEMORY:
                seen.popitem(last=False)
        W = self.cfg.window_us
        ts = max(0, self.corrected_ts(rec))
        start = ts // W * W
        st.heard[rec.modality] = now
        if start + W <= st.closed_until:
            late = LateEvent(
                stream_id=rec.stream_id, modality=rec.modality, ts=rec.ts, seq=rec.seq,
                trace_id=rec.trace_id, window_start=start, window_end=start + W,
                src_partition=rec.src_partition, src_offset=rec.src_offset,
                at=int(now * 1_000_000), feats=rec.feats,
            )
            return AddResult("late", late=late, window_start=start)
        st.newest[rec.modality] = max(st.newest.get(rec.modality, -1), rec.ts + rec.dur)
        st.pending.append(rec)
        self._open.add(rec.stream_id)
        st.skew.observe(rec)
        return AddResult("merged", window_start=start)

    # -- output ------------------------------------------------------------
    def watermark(self, st: StreamState, now: float) -> float:
        """Event time (us, reference clock) up to which the stream is complete."""
        idle = self.cfg.idle_s
        marks: list[float] = []
        for m in self.cfg.modalities:
            heard = st.heard.get(m)
            if heard is None:
                if now - st.first_seen < idle:
                    return -math.inf  # a modality may still be starting up
                continue
            newest = st.newest.get(m)
            # heard only through late records: nothing of it is pending, it holds nothing
            if newest is not None and now - heard < idle:
                corrected = newest - self.offset_us_of(st, m) - self.margin_us(st, m)
                marks.append(corrected - self.cfg.lateness_us)
        return min(marks) if marks else math.inf

    def offset_us_of(self, st: StreamState, modality: str) -> int:
        return st.skew.offset_us(modality) if self.cfg.correct_skew else 0

    def poll(self, now: float, streams: Iterable[str] | None = None) -> list[
        tuple[str, int, list[FeatureRecord]]
    ]:
        """Close every window the watermark has passed: (stream_id, start, records)."""
        out: list[tuple[str, int, list[FeatureRecord]]] = []
        W = self.cfg.window_us
        for sid in list(self._open if streams is None else streams):
            st = self.streams.get(sid)
            if st is None or not st.pending:
                self._open.discard(sid)
                continue
            if self.cfg.correct_skew:
                st.skew.maybe_update()
            wm = self.watermark(st, now)
            if wm == -math.inf:
                continue
            buckets: dict[int, list[FeatureRecord]] = {}
            keep: list[FeatureRecord] = []
            for rec in st.pending:
                start = max(0, rec.ts - self.offset_us_of(st, rec.modality)) // W * W
                # a record whose window closed since it came in (the skew
                # estimate moved it back) joins the oldest window still open
                start = max(start, st.closed_until)
                if start + W <= wm:
                    buckets.setdefault(start, []).append(rec)
                else:
                    keep.append(rec)
            st.pending = keep
            if not keep:
                self._open.discard(sid)
            for start in sorted(buckets):
                out.append((sid, start, buckets[start]))
                st.closed_until = max(st.closed_until, start + W)
            if math.isfinite(wm) and wm > 0:
                st.closed_until = max(st.closed_until, int(wm) // W * W)
        return out

    def forget(self, stream_ids: Iterable[str]) -> None:
        """Drop the state of streams this worker no longer owns (after a rebalance)."""
        for sid in stream_ids:
            self.streams.pop(sid, None)
            self._open.discard(sid)

    def evict_idle(self, now: float) -> list[str]:
        """Forget streams with nothing pending and no record for ``stream_ttl_s``.

        What a forgotten stream loses: its seqs (a very late duplicate is merged
        again), which windows were emitted (a very late record opens its window
        again, under the same id) and its skew estimate.
        """
        ttl = self.cfg.stream_ttl_s
        gone = [sid for sid, st in self.streams.items() if not st.pending
                and now - max(st.heard.values(), default=st.first_seen) > ttl]
        self.forget(gone)
        return gone

    def open_records(self) -> int:
        return sum(len(st.pending) for st in self.streams.values())


def _mean_embedding(recs: Iterable[FeatureRecord]) -> dict[str, Any] | None:
    """The window's mean embedding, unit length, float16 (one per window, not per
    tick: 1280 numbers x 20 ticks would dwarf the rest of the window)."""
    embs = [unpack_array(r.feats["emb"]).astype(np.float32) for r in recs if "emb" in r.feats]
    if not embs:
        return None
    m = np.mean(embs, axis=0)
    norm = float(np.linalg.norm(m))
    return pack_array((m / norm if norm > 0 else m).astype(np.float16))


def _tick_of(ts: int, start: int, tick_us: int, ticks: int) -> int:
    return min(ticks - 1, max(0, (ts - start) // tick_us))


def build_window(
    aligner: Aligner,
    stream_id: str,
    start: int,
    records: list[FeatureRecord],
    *,
    offsets_ms: dict[str, float],
    confidence: dict[str, float],
    emitted_at: int,
) -> AlignedWindow:
    """Resample the window's records onto the grid and assemble the AlignedWindow.

    image: scalars held from the last frame at or before each tick (frames
    persist on screen); audio: RMS hops averaged per tick (None where no
    audio); text: caption presence 1/0 per tick and the tokens at the tick
    where the caption starts.
    """
    cfg = aligner.cfg
    st = aligner.streams.get(stream_id)
    hold = st.hold if st is not None else {}
    T, tick = cfg.ticks, cfg.tick_us
    counts = dict.fromkeys(cfg.modalities, 0)
    grid: dict[str, dict[str, Any]] = {}
    by_mod: dict[str, list[tuple[int, FeatureRecord]]] = {m: [] for m in cfg.modalities}
    stages: dict[str, float] = {}
    trace_ids: list[str] = []
    sources: list[list[Any]] = []
    nsfw: list[float] = []
    terms: set[str] = set()
    for rec in records:
        counts[rec.modality] = counts.get(rec.modality, 0) + 1
        by_mod.setdefault(rec.modality, []).append((aligner.corrected_ts(rec), rec))
        if rec.trace_id:
            trace_ids.append(rec.trace_id)
        sources.append([rec.modality, rec.src_partition, rec.src_offset])
        for stage, secs in rec.stages.items():
            stages[stage] = stages.get(stage, 0.0) + float(secs)
        if "nsfw" in rec.feats:
            nsfw.append(float(rec.feats["nsfw"]))
        terms.update(rec.feats.get("terms", ()))

    # image: sample-and-hold
    frames = sorted(by_mod.get("image", []), key=lambda p: p[0])
    img: dict[str, list[Any]] = {"luma": [None] * T, "change": [None] * T, "nsfw": [None] * T}
    fi = 0
    for k in range(T):
        t_end = start + (k + 1) * tick
        while fi < len(frames) and frames[fi][0] < t_end:
            feats = frames[fi][1].feats
            for name in img:
                if name in feats:
                    hold[name] = float(feats[name])
            fi += 1
        for name in img:
            img[name][k] = hold.get(name)
    # "change" is an event at the frame's tick, not a level: do not hold it.
    img["change"] = [0.0] * T if frames else [None] * T
    for ts, rec in frames:
        k = _tick_of(ts, start, tick, T)
        img["change"][k] = max(img["change"][k], float(rec.feats.get("change", 0.0)))
    grid["image"] = img

    grid["image"]["emb"] = _mean_embedding(r for _, r in frames)

    # audio: per-hop series (RMS, speech probability) binned per tick
    audio: dict[str, Any] = {}
    for name in ("rms", "speech"):
        sums = np.zeros(T, dtype=np.float64)
        ns = np.zeros(T, dtype=np.int64)
        for ts, rec in by_mod.get("audio", []):
            if name not in rec.feats:
                continue
            vals = unpack_array(rec.feats[name]).astype(np.float64).reshape(-1)
            hop = int(rec.feats.get("hop_us", 50_000))
            t = ts + np.arange(len(vals), dtype=np.int64) * hop
            bins = np.clip((t - start) // tick, 0, T - 1)
            inside = (t >= start) & (t < start + cfg.window_us)
            np.add.at(sums, bins[inside], vals[inside])
            np.add.at(ns, bins[inside], 1)
        audio[name] = [float(s / n) if n else None for s, n in zip(sums, ns, strict=True)]
    grid["audio"] = audio

    # text: caption presence and tokens
    caption = [0.0] * T
    tokens: list[list[str]] = [[] for _ in range(T)]
    tick_terms: list[list[str]] = [[] for _ in range(T)]
    for ts, rec in by_mod.get("text", []):
        k0 = _tick_of(ts, start, tick, T)
        k1 = _tick_of(ts + max(rec.dur, tick) - 1, start, tick, T)
        for k in range(k0, k1 + 1):
            caption[k] = max(caption[k], float(rec.feats.get("caption", 1.0)))
        tokens[k0].extend(rec.feats.get("tokens", ()))
        tick_terms[k0].extend(rec.feats.get("terms", ()))
    grid["text"] = {"caption": caption, "tokens": tokens, "terms": tick_terms,
                    "emb": _mean_embedding(r for _, r in by_mod.get("text", []))}

    moderation = {
        "nsfw_max": max(nsfw) if nsfw else None,
        "terms": sorted(terms),
    }
    return AlignedWindow(
        stream_id=stream_id, window_start=start, window_end=start + cfg.window_us,
        rate_hz=cfg.rate_hz, offsets_ms=offsets_ms, confidence=confidence, counts=counts,
        grid=grid, moderation=moderation, trace_ids=trace_ids, emitted_at=emitted_at,
        stages=stages, sources=sources,
    )
