"""Onset signals on a 10 ms grid and a lag tracker over them (pure: numpy only).

What the skew estimate compares (``app.align.skew``):

- the picture's *cuts*: each frame's change from the previous one (the light
  feature ``change``) above its local baseline (a noisy or panning picture
  changes a little all the time; a cut or a card stands out of that), placed
  half-way between the two frames and spread over the frame interval (the
  cut happened somewhere in it);
- the sound's *changes*: how much its level in dB (the light feature ``env``,
  10 ms hops) differs between the 50 ms after and before each bin, above what
  is usual around it;
- a caption's start, and speech starts in the sound (an onset after 200 ms
  quieter by 10 dB), which is what a caption follows.

:class:`LagTracker` is a forward filter over the lag, on a 10 ms grid within
the band: each update multiplies in the likelihood of the lags from a
normalised cross-correlation of the newest stretch of the two signals, and
between updates the belief spreads a little (the lag drifts) and keeps a
floor (it can jump). So the memory of every stretch seen so far closes the
tail that one short context leaves (a context that matched the wrong cut
moves the belief little), the estimate is held when the content says nothing
(no update), and the belief's concentration around its peak is the basis of
the confidence.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

__all__ = ["BIN_US", "BinRing", "LagTracker", "audio_changes", "cut_strengths",
           "frame_cuts", "impulses", "match_likelihood", "peak_times",
           "speech_starts", "xcorr"]

#: The estimate's internal resolution: 10 ms (five times finer than the 20 Hz grid).
BIN_US = 10_000


class BinRing:
    """Values on absolute 10 ms bins for the last ``size`` bins; unknown bins are NaN."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._v = np.full(size, np.nan)
        self._k = np.full(size, -1, dtype=np.int64)

    def put(self, first: int, values: np.ndarray) -> None:
        idx = first + np.arange(len(values), dtype=np.int64)
        self._v[idx % self.size] = values
        self._k[idx % self.size] = idx

    def get(self, a: int, b: int) -> np.ndarray:
        """Bins ``a`` to ``b`` (exclusive), NaN where nothing was put (or it was overwritten)."""
        idx = np.arange(a, b, dtype=np.int64)
        slot = idx % self.size
        return np.where(self._k[slot] == idx, self._v[slot], np.nan)


def _blur(x: np.ndarray, sigma_bins: float) -> np.ndarray:
    if sigma_bins <= 0.3 or len(x) == 0:
        return x
    r = max(1, int(3 * sigma_bins))
    k = np.exp(-0.5 * (np.arange(-r, r + 1) / sigma_bins) ** 2)
    return np.convolve(x, k / k.sum(), mode="same")


def impulses(times_us: np.ndarray, weights: np.ndarray, a: int, b: int) -> np.ndarray:
    """Point events on bins ``a``..``b``, split linearly between the two nearest bins (keeps
    their timing finer than a bin)."""
    out = np.zeros(b - a)
    if len(times_us) == 0:
        return out
    pos = np.asarray(times_us, dtype=np.float64) / BIN_US - a
    k = np.floor(pos).astype(np.int64)
    frac = pos - k
    w = np.asarray(weights, dtype=np.float64)
    for idx, ww in ((k, w * (1 - frac)), (k + 1, w * frac)):
        ok = (idx >= 0) & (idx < len(out))
        np.add.at(out, idx[ok], ww[ok])
    return out


def cut_strengths(ts_us: np.ndarray, change: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(time, strength) of each frame's change from the one before: its ``change`` above the
    median of its neighbours within +-0.5 s (a noisy or panning picture changes a little
    all the time; a cut stands out of that), at the midpoint of the two frames. A frame
    after a dropout (a gap over 4 intervals) has no "one before"."""
    if len(ts_us) < 3:
        return np.zeros(0), np.zeros(0)
    gaps = np.diff(ts_us)
    interval = float(np.median(gaps))
    half = max(1, round(500_000 / max(interval, 1.0)))
    ch = np.asarray(change, dtype=np.float64)
    base = _rolling_median(ch, half)
    strength = np.maximum(ch - base, 0.0)[1:]
    ok = gaps <= 4 * interval
    return ((ts_us[1:] + ts_us[:-1]) / 2)[ok], strength[ok]


def frame_cuts(ts_us: np.ndarray, change: np.ndarray, a: int, b: int) -> np.ndarray:
    """The picture's cut strength on bins ``a``..``b`` from frames (ts, change), in order:
    :func:`cut_strengths` spread over twice the frame interval's standard deviation
    (interval / sqrt 12: where in it the change happened is unknown; twice, measured on
    the corpus, also absorbs timestamp jitter)."""
    mids, strength = cut_strengths(ts_us, change)
    if not len(mids):
        return np.zeros(b - a)
    interval = float(np.median(np.diff(ts_us)))
    return _blur(impulses(mids, strength, a, b), 2 * interval / math.sqrt(12) / BIN_US)


#: How much a fall of the level counts beside a rise (audio_changes).
_FALL_WEIGHT = 0.5


def _filled(env_db: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The level with short gaps (chunks that jitter apart, up to 100 ms) bridged linearly
    and everything under a floor 45 dB below the loudest raised to that floor (hiss
    coming out of digital silence is no event); and where it is known (False inside
    longer gaps: a dropped chunk is no event either)."""
    e = np.asarray(env_db, dtype=np.float64)
    known = np.isfinite(e)
    if not known.any():
        return np.zeros(len(e)), known
    idx = np.arange(len(e))
    filled = np.interp(idx, idx[known], e[known])
    # a gap is "long" when the nearest known bin is more than 5 bins (50 ms) away
    left = np.maximum.accumulate(np.where(known, idx, -10**9))
    right = np.minimum.accumulate(np.where(known, idx, 10**9)[::-1])[::-1]
    near = np.minimum(idx - left, right - idx) <= 5
    floor = float(e[known].max()) - 45.0
    return np.maximum(filled, floor), near


def _rolling_median(x: np.ndarray, half: int) -> np.ndarray:
    if len(x) == 0:
        return x
    padded = np.pad(x, half, mode="edge")
    return np.median(sliding_window_view(padded, 2 * half + 1), axis=1)


def audio_changes(env_db: np.ndarray) -> np.ndarray:
    """How much the sound's level changes at each bin, dB: the difference of its mean over
    the 50 ms after and the 50 ms before (a sound starting or stopping; syllables inside a
    phrase move it less), less the median over +-0.5 s (what is usual here).

    A fall counts half as much as a rise: a picture changes both when a speaker's card
    appears and when it goes, but a cut in music comes with the beat's attack, and a
    section's end then a cut at the next one's start (a break later) would pair a fall
    with the wrong cut (measured on the corpus's tune set: rises alone matched speech
    cards worse, falls at full weight locked music a beat off)."""
    e, known = _filled(env_db)
    w = 5
    m = np.convolve(e, np.ones(w) / w, mode="same")
    d = np.zeros(len(e))
    if len(e) > 2 * w:
        step = m[2 * w:] - m[:-2 * w]
        d[w:-w] = np.maximum(step, 0.0) + _FALL_WEIGHT * np.maximum(-step, 0.0)
    # no change measured across a dropped chunk
    gap = np.convolve(~known, np.ones(2 * w + 1), mode="same") > 0
    d[gap] = 0.0
    return np.maximum(d - _rolling_median(d, 50), 0.0)


def speech_starts(env_db: np.ndarray) -> np.ndarray:
    """Where sound starts after a pause: a level 10 dB over the loudest of the 200 ms
    before (the start of an utterance, which a caption follows), per bin."""
    e, _ = _filled(env_db)
    n = len(e)
    before = np.full(n, np.inf)
    w = 20  # 200 ms
    if n > w:
        before[w:] = sliding_window_view(e[:-1], w).max(axis=1)[: n - w]
    start = np.maximum(e - before - 10.0, 0.0)
    # one start per utterance: only where the excess first appears
    first = (start > 0) & ~np.concatenate(([False], start[:-1] > 0))
    return _blur(np.where(first, 1.0, 0.0), 3.0)


def peak_times(x: np.ndarray, first: int) -> np.ndarray:
    """Times (us) of the local maxima of ``x`` (bins from ``first``), at bin centres."""
    if len(x) < 3:
        return np.zeros(0)
    k = np.flatnonzero((x[1:-1] > 0) & (x[1:-1] >= x[:-2]) & (x[1:-1] > x[2:])) + 1
    return (first + k + 0.5) * BIN_US


def match_likelihood(event_us: float, candidates_us: np.ndarray, lags: np.ndarray,
                     sigma_bins: float, floor: float = 0.05) -> np.ndarray:
    """Log-likelihood of each lag (bins) that an event at ``event_us`` is one of
    ``candidates_us`` (on the other clock) moved by that lag: a mixture of one Gaussian
    per candidate, plus a floor for "none of them" (an event need not have a partner).

    Every candidate weighs the same: a caption does not prefer the nearer speech start.
    ASR captions trail by 0.5-2.5 s, often past the start of the next utterance, so the
    nearest start is often the wrong one; which start is right is what the tracker learns
    from many captions (a prior favouring the nearest, 0.8 per rank, took the held-out
    ASR clips from a median of 64 to 254 ms, docs/benchmarks.md). Two starts equally far
    from a lag's point of view tie exactly, and nothing downstream may depend on which of
    two tied lags a sort puts first (its order of ties differs by CPU)."""
    mix = np.full(len(lags), floor)
    for c in candidates_us:
        mix += np.exp(-0.5 * ((lags - (event_us - c) / BIN_US) / sigma_bins) ** 2)
    return np.log(mix)


def xcorr(ref: np.ndarray, sig: np.ndarray, band: int) -> np.ndarray:
    """Normalised cross-correlation of ``ref`` (n bins) with ``sig`` (n + 2 band bins, the
    same span widened by ``band`` on each side) at lags -band..band: r[k] compares
    ref(t) with sig(t + k - band). Both are standardised over their spans."""
    def z(x: np.ndarray) -> np.ndarray:
        sd = float(x.std())
        return (x - x.mean()) / sd if sd > 1e-12 else np.zeros_like(x)

    zr, zs = z(ref), z(sig)
    return np.correlate(zs, zr, mode="valid") / max(1, len(ref))


class LagTracker:
    """Belief over lags ``lo``..``hi`` bins: predict (spread, floor), update (likelihood)."""

    def __init__(self, lo: int, hi: int, *, spread_bins_per_s: float = 0.6, jump: float = 1e-6
                 ) -> None:
        self.lo, self.hi = lo, hi
        self.spread = spread_bins_per_s
        self.jump = jump
        n = hi - lo + 1
        self.log_p = np.full(n, -math.log(n))
        self.lags = np.arange(lo, hi + 1, dtype=np.float64)

    def predict(self, dt_s: float) -> None:
        """Let ``dt_s`` seconds of media pass: the lag may drift, rarely jump."""
        p = np.exp(self.log_p - self.log_p.max())
        p = _blur(p, self.spread * math.sqrt(max(dt_s, 0.0)))
        p /= p.sum()
        p = (1 - self.jump) * p + self.jump / len(p)
        self.log_p = np.log(p)

    def update(self, loglik: np.ndarray) -> None:
        lp = self.log_p + loglik
        m = lp.max()
        self.log_p = lp - (m + math.log(np.exp(lp - m).sum()))

    def seed(self, lag_bins: float, sigma_bins: float, weight: float) -> None:
        """Start from an earlier belief: a Gaussian at ``lag_bins`` holding ``weight`` of
        the mass (the rest flat)."""
        g = np.exp(-0.5 * ((self.lags - lag_bins) / max(sigma_bins, 0.5)) ** 2)
        weight = min(max(weight, 0.0), 1.0 - 1e-6)  # never rule a lag out entirely
        p = weight * g / g.sum() + (1 - weight) / len(g)
        self.log_p = np.log(p)

    def estimate(self, prefer: float | None = None, switch: float = 3.0) -> float:
        """The lag at the belief's peak, refined to a fraction of a bin by its mean there.

        With ``prefer`` (the estimate reported so far), the peak near it is kept unless the
        belief around the global peak holds ``switch`` times as much: periodic content
        (music's beats) leaves peaks a beat apart, and one stretch favouring the wrong one
        should not flip the estimate back and forth.
        """
        k = int(np.argmax(self.log_p))
        if prefer is not None:
            lo = max(0, round(prefer) - self.lo - 5)
            hi = min(len(self.log_p), round(prefer) - self.lo + 6)
            if lo < hi:
                kp = lo + int(np.argmax(self.log_p[lo:hi]))
                if self.mass_near(self.lags[k], 3) < switch * self.mass_near(self.lags[kp], 3):
                    k = kp
        lo, hi = max(0, k - 3), min(len(self.log_p), k + 4)
        p = np.exp(self.log_p[lo:hi] - self.log_p[k])
        return float((self.lags[lo:hi] * p).sum() / p.sum())

    def above(self, lag_bins: float, tail: float) -> float:
        """How far above ``lag_bins`` the lag may still lie, bins: the distance to the
        smallest lag with no more than ``tail`` of the belief beyond it (0 when the belief
        above ``lag_bins`` holds no more than that)."""
        p = np.exp(self.log_p)
        up = self.lags > lag_bins
        if not up.any():
            return 0.0
        q = p[up]
        beyond = np.cumsum(q[::-1])[::-1] - q  # mass strictly above each lag over lag_bins
        if q.sum() <= tail:
            return 0.0
        k = int(np.argmax(beyond <= tail))
        return float(self.lags[up][k] - lag_bins)

    def rival_margin(self, lag_bins: float, near_bins: int, far_bins: int) -> float:
        """How much likelier (natural log) the belief's best lag within ``near_bins`` of
        ``lag_bins`` is than its best lag more than ``far_bins`` away: small where the
        evidence fits a second lag almost as well (periodic content: music's beats leave
        peaks a beat apart). At most about ``log(n / jump)`` (the floor ``predict`` keeps);
        inf when no lag lies that far."""
        d = np.abs(self.lags - lag_bins)
        far = self.log_p[d > far_bins]
        if not len(far):
            return math.inf
        return float(self.log_p[d <= near_bins].max() - far.max())

    def mass_near(self, lag_bins: float, radius_bins: float) -> float:
        """Belief within ``radius_bins`` of ``lag_bins``."""
        p = np.exp(self.log_p)
        return float(p[np.abs(self.lags - lag_bins) <= radius_bins].sum())
