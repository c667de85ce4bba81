"""The watermark's margin per modality (issue 26): a confident estimate waits for its own
uncertainty, an unsure one for max_skew scaled by the doubt."""

from __future__ import annotations

import numpy as np

from app.align.aligner import Aligner, AlignerConfig
from app.align.lag import LagTracker


def test_above_is_the_belief_s_extent_over_the_estimate():
    tr = LagTracker(-100, 100)
    tr.seed(20, sigma_bins=2.0, weight=1.0 - 1e-6)
    up = tr.above(20, 0.01)
    # a Gaussian of 2 bins: 1% of it lies beyond about 2.33 sigma
    assert 4 <= up <= 6
    assert tr.above(20, 0.6) == 0.0  # half the mass is above the peak: nothing beyond
    # a rival peak 40 bins above holding 5% of the belief is inside the 1% tail's reach
    p = np.exp(tr.log_p)
    p[np.searchsorted(tr.lags, 60)] += 0.05 / 0.95 * p.sum()
    tr.log_p = np.log(p / p.sum())
    assert tr.above(20, 0.01) >= 40


def _aligner_with(conf: float) -> tuple[Aligner, object]:
    al = Aligner(AlignerConfig())
    st = al._state("s", 0.0)
    st.skew.seed("audio", 300_000, conf)
    return al, st


def test_a_confident_offset_waits_for_its_uncertainty_not_max_skew():
    al, st = _aligner_with(0.99)
    assert st.skew.confidence("audio") >= 0.5
    margin = al.margin_us(st, "audio")
    assert margin == st.skew.uncertainty_us("audio")
    assert 0 < margin <= 20_000  # the seed's 1/3 bin spread, not max_skew x (1 - 0.99)
    # a belief whose flat part holds more than the tail above the estimate waits for it
    al, st = _aligner_with(0.9)  # 4% of the belief spread flat over +-1 s
    assert st.skew.confidence("audio") >= 0.5
    assert al.margin_us(st, "audio") == st.skew.uncertainty_us("audio") >= 150_000
    assert al.margin_us(st, "image") == 0  # the reference


def test_an_unsure_offset_keeps_the_doubt_scaled_margin():
    al, st = _aligner_with(0.3)
    conf = st.skew.confidence("audio")
    assert conf < 0.5
    assert al.margin_us(st, "audio") == round(1_000_000 * (1 - conf))
