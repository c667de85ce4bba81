"""Banded dynamic time warping and the lag it implies (pure: numpy + dtaidistance).

The aligner compares activity signals of two modalities on the sync grid.
A warping path maps tick ``i`` of the reference to tick ``j`` of the other
signal; where both signals carry an event, ``j - i`` is how many ticks the
other modality's timestamps run behind the reference's for the same content
(the contract's sign: positive means later timestamps). Averaging that over
the salient part of the path, weighted by how much activity each point
carries, gives the lag; a parabola through the cross-correlation next to it
refines it to a fraction of a tick.

The DTW itself is dtaidistance's C implementation (Sakoe-Chiba band
``window``, psi relaxation so the ends of two shifted series need not match,
a penalty on non-diagonal steps so the path prefers a steady lag).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from dtaidistance import dtw

__all__ = ["LagEstimate", "banded_path", "estimate_lag", "normalise", "splat"]


def splat(times_us: np.ndarray, weights: np.ndarray, t0_us: int, n: int,
          tick_us: int) -> np.ndarray:
    """Place weighted point events on an ``n``-tick grid starting at ``t0_us``.

    Linear interpolation between the two nearest ticks keeps sub-tick timing
    (an event at 30% of a tick puts 70% of its weight on the earlier tick).
    """
    grid = np.zeros(n, dtype=np.float64)
    if len(times_us) == 0:
        return grid
    pos = (np.asarray(times_us, dtype=np.float64) - t0_us) / tick_us
    k = np.floor(pos).astype(np.int64)
    frac = pos - k
    w = np.asarray(weights, dtype=np.float64)
    for idx, ww in ((k, w * (1.0 - frac)), (k + 1, w * frac)):
        ok = (idx >= 0) & (idx < n)
        np.add.at(grid, idx[ok], ww[ok])
    return grid


def normalise(x: np.ndarray, sigma_ticks: float = 1.0) -> np.ndarray:
    """Smooth with a small Gaussian (gives DTW a slope to follow) and scale to max 1."""
    if sigma_ticks > 0:
        r = max(1, int(3 * sigma_ticks))
        k = np.exp(-0.5 * (np.arange(-r, r + 1) / sigma_ticks) ** 2)
        x = np.convolve(x, k / k.sum(), mode="same")
    m = float(x.max()) if len(x) else 0.0
    return x / m if m > 0 else x


def banded_path(ref: np.ndarray, sig: np.ndarray, band: int, *, psi: int | None = None,
                penalty: float = 0.0) -> np.ndarray:
    """The DTW warping path as an ``(k, 2)`` int array of (ref tick, sig tick)."""
    band = max(1, int(band))
    path = dtw.warping_path(
        np.ascontiguousarray(ref, dtype=np.double), np.ascontiguousarray(sig, dtype=np.double),
        window=band, psi=band if psi is None else psi, penalty=penalty, use_c=True,
    )
    return np.asarray(path, dtype=np.int64).reshape(-1, 2)


@dataclass(frozen=True, slots=True)
class LagEstimate:
    #: lag of ``sig`` behind ``ref``, ticks (fractional).
    lag_ticks: float
    #: weighted standard deviation of the per-point lags, ticks.
    spread_ticks: float
    #: activity weight the estimate rests on (sum of matched products).
    support: float
    #: number of distinct salient reference onsets matched (runs of ticks).
    points: int


def _xcorr(ref: np.ndarray, sig: np.ndarray, k: int) -> float:
    """Sum of ``ref[i] * sig[i + k]``: the two series' overlap at a whole-tick lag."""
    n = len(ref)
    if abs(k) >= n:
        return 0.0
    if k >= 0:
        return float(np.dot(ref[: n - k], sig[k:]))
    return float(np.dot(ref[-k:], sig[: n + k]))


def _refine(ref: np.ndarray, sig: np.ndarray, lag: float) -> float:
    """Sub-tick lag: a parabola through the cross-correlation around the DTW lag.

    DTW's path is made of whole ticks; when every event shares the same
    fractional offset, averaging the path cannot see it. Over a few seconds
    the skew is constant to well under a tick (drift is ms per minute), so
    the peak of the smoothed signals' correlation next to the DTW answer
    locates it between ticks.
    """
    k0 = round(lag)
    cm, c0, cp = (_xcorr(ref, sig, k) for k in (k0 - 1, k0, k0 + 1))
    denom = cm - 2 * c0 + cp
    if c0 <= 0 or denom >= 0 or c0 < max(cm, cp):
        return lag  # not a peak there: keep the path's own average
    return k0 + 0.5 * (cm - cp) / denom


def estimate_lag(ref: np.ndarray, sig: np.ndarray, band: int, *, penalty: float = 0.05,
                 salient: float = 0.2) -> LagEstimate | None:
    """Lag of ``sig`` behind ``ref`` from a banded DTW path; None when nothing matches.

    Only path points where both normalised signals exceed ``salient`` vote,
    each with weight ``ref[i] * sig[j]``: flat stretches, where DTW's path is
    arbitrary, carry no weight.
    """
    if len(ref) < 4 or len(sig) < 4 or ref.max() <= 0 or sig.max() <= 0:
        return None
    path = banded_path(ref, sig, band, penalty=penalty)
    i, j = path[:, 0], path[:, 1]
    w = ref[i] * sig[j]
    keep = (ref[i] > salient) & (sig[j] > salient)
    if not keep.any():
        return None
    w, lag = w[keep], (j - i)[keep].astype(np.float64)
    total = float(w.sum())
    mean = float((w * lag).sum() / total)
    spread = float(np.sqrt((w * (lag - mean) ** 2).sum() / total))
    mean = _refine(ref, sig, mean)
    ticks = np.unique(i[keep])
    # one onset smoothed over a few ticks is one piece of evidence, not several
    events = 1 + int(np.count_nonzero(np.diff(ticks) > 1))
    return LagEstimate(lag_ticks=mean, spread_ticks=spread, support=total, points=events)
