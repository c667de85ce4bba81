"""Per-stream clock-skew estimation from activity onsets, by banded DTW (pure).

Each modality's feature records become *onsets* on that modality's own clock:

- image: the frame-to-frame ``change``, placed half-way between the frame and
  the one before it (a cut happened somewhere in between: the midpoint is the
  unbiased guess, and at 5 fps it removes a 100 ms bias);
- audio: the rise of RMS energy between consecutive 50 ms hops, placed at the
  hop boundary (linear RMS, so a rise that straddles two hops splits in
  proportion and its weighted mean lands on the true onset);
- text: a caption's start.

Over a sliding context (``context_us``, default 8 s) the onsets are splatted
onto the sync grid, and :func:`app.align.dtw.estimate_lag` compares each modality
with the reference (image) inside a Sakoe-Chiba band of ``max_skew_us``. The
raw estimates are smoothed per modality (``_Filter``: a confidence-weighted
median of the recent ones along a fitted drift line), so one context that
matched the wrong cut cannot yank the offset; the confidence decays while a
modality stops informing it.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from app.align.dtw import estimate_lag, normalise, splat
from schemas.codec import unpack_array
from schemas.features import FeatureRecord

__all__ = ["SkewConfig", "StreamSkew"]

#: Frames further apart than this are not a "previous frame" for the midpoint, us.
_MAX_FRAME_GAP_US = 500_000
#: How many recent estimates the offset's median spans (at 0.5 s apart: 4.5 s).
_RECENT = 9
#: How many estimates the drift's slope spans (at 0.5 s apart: 40 s).
_LONG = 80
#: Largest drift the filter believes in, us per us (1e-3: 60 ms per minute).
_MAX_DRIFT = 1e-3


@dataclass(frozen=True, slots=True)
class SkewConfig:
    tick_us: int = 50_000
    max_skew_us: int = 1_000_000
    context_us: int = 8_000_000
    #: re-estimate when the stream's media time advanced this much, us.
    every_us: int = 500_000
    reference: str = "image"
    #: salient reference onsets a context needs before it says anything.
    min_points: int = 3

    @property
    def band(self) -> int:
        return max(1, math.ceil(self.max_skew_us / self.tick_us))


@dataclass(slots=True)
class _Track:
    """One modality's recent onsets on its own clock."""

    times: deque[int] = field(default_factory=deque)
    weights: deque[float] = field(default_factory=deque)
    newest: int = -1
    last_frame_ts: int | None = None
    last_energy: float | None = None
    last_energy_end: int = -1

    def push(self, t: int, w: float) -> None:
        if w > 0:
            self.times.append(t)
            self.weights.append(w)

    def trim(self, before: int) -> None:
        while self.times and self.times[0] < before:
            self.times.popleft()
            self.weights.popleft()


@dataclass(slots=True)
class _Filter:
    """Recent raw estimates of one modality; the offset is their robust centre.

    The offset is the confidence-weighted median of the last ``_RECENT``
    estimates, each first carried to the present along the drift line: a
    median shrugs off a context that matched the wrong cut, where a running
    mean (or an alpha-beta filter started from a wrong first guess) stays
    wrong for many updates. Drift is a least-squares slope over the inliers
    of the last ``_LONG`` estimates (tens of seconds: ms per minute is
    invisible over a few).
    """

    recent: deque[tuple[int, float, float]] = field(
        default_factory=lambda: deque(maxlen=_RECENT))
    long: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=_LONG))
    offset_us: float = 0.0
    drift: float = 0.0  # us of offset per us of media time
    at_us: int = -1
    confidence: float = 0.0

    def add(self, at_us: int, z_us: float, conf: float, tick_us: int) -> None:
        if self.recent and at_us - self.recent[-1][0] <= 0:
            return  # the same context again (a sparse modality had nothing new)
        self.recent.append((at_us, z_us, conf))
        t = np.array([r[0] for r in self.recent], dtype=np.float64)
        z = np.array([r[1] for r in self.recent]) + self.drift * (at_us - t)
        w = np.array([r[2] for r in self.recent])
        med = _weighted_median(z, w)
        near = np.abs(z - med) <= 2 * tick_us
        # agreement: how much of the recent evidence sits within 2 ticks of the centre
        agree = float(w[near].sum() / w.sum()) if w.sum() > 0 else 0.0
        self.offset_us, self.at_us = med, at_us
        self.confidence = agree * float(np.mean(w)) * min(1.0, len(self.recent) / 3)
        if abs(z_us + 0.0 - med) <= 2 * tick_us:
            self.long.append((at_us, z_us))
        if len(self.long) >= 8:
            lt = np.array([p[0] for p in self.long], dtype=np.float64)
            lz = np.array([p[1] for p in self.long])
            if lt[-1] - lt[0] > 10_000_000:  # at least 10 s of media
                slope = float(np.polyfit(lt - lt[0], lz, 1)[0])
                self.drift = min(_MAX_DRIFT, max(-_MAX_DRIFT, slope))


def _weighted_median(x: np.ndarray, w: np.ndarray) -> float:
    order = np.argsort(x)
    cw = np.cumsum(w[order])
    return float(x[order][np.searchsorted(cw, cw[-1] / 2)])


class StreamSkew:
    """Skew of each modality of one stream behind the reference."""

    def __init__(self, cfg: SkewConfig, modalities: tuple[str, ...]) -> None:
        self.cfg = cfg
        self.modalities = modalities
        self.tracks = {m: _Track() for m in modalities}
        self.filters = {m: _Filter() for m in modalities if m != cfg.reference}
        self._last_update = -1

    # -- input -------------------------------------------------------------
    def observe(self, rec: FeatureRecord) -> None:
        tr = self.tracks.get(rec.modality)
        if tr is None:
            return
        f = rec.feats
        if rec.modality == "image":
            prev = tr.last_frame_ts
            if prev is not None and 0 < rec.ts - prev <= _MAX_FRAME_GAP_US:
                tr.push((prev + rec.ts) // 2, float(f.get("change", 0.0)))
            if prev is None or rec.ts > prev:
                tr.last_frame_ts = rec.ts
        elif rec.modality == "audio" and "rms" in f:
            # mean energy per hop (rms squared) is linear in how much of a hop a
            # sound covers, so split rises average to the true onset time.
            energy = unpack_array(f["rms"]).astype(np.float64) ** 2
            hop = int(f.get("hop_us", 50_000))
            if len(energy) > 1 and rec.dur - (len(energy) - 1) * hop < hop // 2:
                # a sliver of a last hop (2205 samples at 22.05 kHz make 2 hops
                # and 1 sample) has a meaningless energy: leave it out
                energy = energy[:-1]
            contiguous = abs(rec.ts - tr.last_energy_end) <= hop
            prev_e = tr.last_energy if contiguous else None
            seq = energy if prev_e is None else np.concatenate(([prev_e], energy))
            rises = np.maximum(np.diff(seq), 0.0)
            # the rise into hop k sits at hop k's start
            base = rec.ts if prev_e is not None else rec.ts + hop
            for k, w in enumerate(rises):
                tr.push(base + k * hop, float(w))
            if len(energy):
                tr.last_energy, tr.last_energy_end = float(energy[-1]), rec.ts + rec.dur
        elif rec.modality == "text":
            if float(f.get("caption", 1.0)) > 0:
                tr.push(rec.ts, 1.0)
        tr.newest = max(tr.newest, rec.ts + rec.dur)

    # -- estimation --------------------------------------------------------
    def maybe_update(self) -> bool:
        """Re-estimate if media time moved ``every_us`` since the last time."""
        ref = self.tracks[self.cfg.reference]
        if ref.newest < 0 or ref.newest - self._last_update < self.cfg.every_us:
            return False
        self._last_update = ref.newest
        self.update()
        return True

    def update(self) -> None:
        cfg = self.cfg
        ref = self.tracks[cfg.reference]
        keep_from = ref.newest - cfg.context_us - 2 * cfg.max_skew_us
        for tr in self.tracks.values():
            tr.trim(keep_from)
        for m, flt in self.filters.items():
            sig = self.tracks[m]
            t_hi = min(ref.newest, sig.newest)
            if t_hi < 0:
                continue
            n = cfg.context_us // cfg.tick_us
            t0 = t_hi - n * cfg.tick_us
            r = normalise(splat(np.fromiter(ref.times, np.int64), np.fromiter(ref.weights, float),
                                t0, n, cfg.tick_us))
            s = normalise(splat(np.fromiter(sig.times, np.int64), np.fromiter(sig.weights, float),
                                t0, n, cfg.tick_us))
            est = estimate_lag(r, s, cfg.band)
            if est is None or est.points < cfg.min_points:
                flt.confidence *= 0.9  # decays while a modality says nothing
                continue
            conf = min(1.0, est.points / (cfg.min_points + 2)) * math.exp(
                -((est.spread_ticks / 1.5) ** 2))
            flt.add(t_hi, est.lag_ticks * cfg.tick_us, conf, cfg.tick_us)

    def seed(self, modality: str, offset_us: int, confidence: float) -> None:
        """Start from an estimate made before (a takeover restores the last window's);
        the first estimates of this aligner replace it."""
        flt = self.filters.get(modality)
        if flt is not None and not flt.recent:
            flt.offset_us, flt.confidence = float(offset_us), max(0.0, min(1.0, confidence))

    # -- output ------------------------------------------------------------
    def offset_us(self, modality: str) -> int:
        flt = self.filters.get(modality)
        return 0 if flt is None else round(flt.offset_us)

    def confidence(self, modality: str) -> float:
        if modality == self.cfg.reference:
            return 1.0
        flt = self.filters.get(modality)
        return 0.0 if flt is None else round(min(1.0, flt.confidence), 3)
