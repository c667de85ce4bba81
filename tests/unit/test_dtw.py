"""DTW against a plain reference implementation, and lags from known shifts."""

import math

import numpy as np
import pytest
from dtaidistance import dtw

from app.align.dtw import banded_path, estimate_lag, normalise, splat


def reference_dtw(a: np.ndarray, b: np.ndarray, window: int) -> float:
    """Textbook DTW (squared differences, sqrt at the end) with a Sakoe-Chiba band.

    dtaidistance's ``window=w`` admits cells with ``|i - j| < w`` (for series of
    equal length), which is what this loop does.
    """
    n, m = len(a), len(b)
    cost = np.full((n + 1, m + 1), math.inf)
    cost[0, 0] = 0.0
    for i in range(1, n + 1):
        for j in range(max(1, i - window + 1), min(m, i + window - 1) + 1):
            d = (a[i - 1] - b[j - 1]) ** 2
            cost[i, j] = d + min(cost[i - 1, j], cost[i, j - 1], cost[i - 1, j - 1])
    return math.sqrt(cost[n, m])


def path_cost(a: np.ndarray, b: np.ndarray, path: np.ndarray) -> float:
    return math.sqrt(float(sum((a[i] - b[j]) ** 2 for i, j in path)))


@pytest.mark.parametrize("seed", range(8))
def test_banded_dtw_equals_reference_on_random_series(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 60))
    a, b = rng.normal(size=n), rng.normal(size=n)
    window = int(rng.integers(2, 12))
    ref = reference_dtw(a, b, window)
    assert dtw.distance(a, b, window=window, use_c=True) == pytest.approx(ref, rel=1e-9)
    path = banded_path(a, b, window, psi=0)
    # the path is a valid warping path inside the band whose cost is the optimum
    assert tuple(path[0]) == (0, 0) and tuple(path[-1]) == (n - 1, n - 1)
    assert np.all(np.abs(path[:, 0] - path[:, 1]) < window)
    steps = np.diff(path, axis=0)
    assert np.all((steps >= 0) & (steps <= 1)) and np.all(steps.sum(axis=1) >= 1)
    assert path_cost(a, b, path) == pytest.approx(ref, rel=1e-9)


def test_splat_keeps_sub_tick_timing():
    g = splat(np.array([1_030_000]), np.array([1.0]), 1_000_000, 4, 50_000)
    assert g.tolist() == pytest.approx([0.4, 0.6, 0.0, 0.0])
    # weighted mean position is the event's time
    assert float((np.arange(4) * g).sum() / g.sum()) * 50_000 + 1_000_000 == pytest.approx(
        1_030_000)


@pytest.mark.parametrize("lag_ticks", [-13.4, -6.0, -2.5, 0.0, 3.7, 9.2, 18.0])
def test_known_shift_recovered_with_sub_tick_precision(lag_ticks):
    rng = np.random.default_rng(int(lag_ticks * 10) + 1000)
    tick = 50_000
    onsets = np.cumsum(rng.uniform(15, 45, size=12)) * tick  # irregular cuts, us
    w = rng.uniform(0.5, 1.0, size=len(onsets))
    n = 400
    ref = normalise(splat(onsets, w, 0, n, tick))
    sig = normalise(splat(onsets + lag_ticks * tick, w, 0, n, tick))
    est = estimate_lag(ref, sig, band=20)
    assert est is not None
    assert est.lag_ticks == pytest.approx(lag_ticks, abs=0.25)  # 12.5 ms at 20 Hz
    assert est.points >= 8


def test_flat_signal_says_nothing():
    assert estimate_lag(np.zeros(100), np.ones(100), band=10) is None
