"""Issue 25, part 3: content whose likelihood is periodic (music on beats) must not make the
skew estimate confident at a lag a beat off.

The streams are crafted feature records (the picture's ``change`` per frame, the sound's
``env`` per 10 ms), so what the estimate sees is exactly what the test says.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.align.lag import LagTracker
from app.align.skew import SkewConfig, StreamSkew
from schemas.codec import pack_array
from schemas.features import FeatureRecord

_FRAME_US = 40_000
_CHUNK_US = 100_000
_HOP_US = 10_000


def _rec(modality: str, ts: int, dur: int, feats: dict) -> FeatureRecord:
    return FeatureRecord(stream_id="s", modality=modality, ts=ts, dur=dur, seq=None,
                         trace_id=None, kafka_ts_ms=0, src_partition=0, src_offset=0,
                         feats=feats)


def _stream(beats_s: np.ndarray, cuts_s: np.ndarray, skew_us: int, seconds: float,
            seed: int, peaks_db: np.ndarray | None = None) -> list[FeatureRecord]:
    """Frames (25 fps) with a cut at each of ``cuts_s``, and sound with a drum hit on each of
    ``beats_s`` (an attack to ``peaks_db``, -30 dB by default, from a floor of -60, decaying
    over 150 ms) played ``skew_us`` late, in time order."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(int(seconds * 1e6) // _FRAME_US):
        ts = k * _FRAME_US
        cut = np.any((cuts_s * 1e6 > ts - _FRAME_US) & (cuts_s * 1e6 <= ts))
        change = (0.3 if cut else 0.0) + float(rng.uniform(0.005, 0.015))
        out.append(_rec("image", ts, 0, {"change": change}))
    t = (np.arange(int(seconds * 1e6) // _HOP_US) + 0.5) * _HOP_US  # sound's own clock
    level = np.full(len(t), -60.0) + rng.normal(0, 0.5, len(t))
    peaks = np.full(len(beats_s), -30.0) if peaks_db is None else peaks_db
    for b, top in zip(beats_s * 1e6 + skew_us, peaks, strict=True):
        after = (t >= b) & (t < b + 400_000)
        level[after] = np.maximum(level[after], top - (top + 60.0) * (t[after] - b) / 150_000)
    per = _CHUNK_US // _HOP_US
    for c in range(len(t) // per):
        env = level[c * per:(c + 1) * per].astype(np.float16)
        out.append(_rec("audio", c * _CHUNK_US, _CHUNK_US,
                        {"env": pack_array(env), "env_hop_us": _HOP_US}))
    return sorted(out, key=lambda r: (r.ts, r.modality))


def _run(recs: list[FeatureRecord]) -> list[tuple[float, float]]:
    """(audio offset ms, confidence) after every update."""
    sk = StreamSkew(SkewConfig(), ("image", "audio"))
    seen = []
    for r in recs:
        sk.observe(r)
        if sk.maybe_update():
            seen.append((sk.offset_us("audio") / 1000, sk.confidence("audio")))
    return seen


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_a_steady_beat_is_never_confidently_a_beat_off(seed):
    # 120 bpm for 30 s without a break, the odd beats 2 dB softer, a cut on most odd beats:
    # every lag a beat (500 ms) apart explains the stretches nearly as well as the true one
    # (before issue 25's part 3 seed 2 locked 500 ms off at confidence 0.5-0.7)
    rng = np.random.default_rng(seed)
    beats = 0.5 + 0.5 * np.arange(58)
    odd = np.arange(58) % 2 == 1
    cuts = beats[odd & (rng.random(58) < 0.6)]
    seen = _run(_stream(beats, cuts, skew_us=-300_000, seconds=30.0, seed=seed,
                        peaks_db=np.where(odd, -32.0, -30.0)))
    off = [(o, c) for o, c in seen if c >= 0.5 and abs(o + 300) > 50]
    assert not off, off


def test_music_sections_at_their_own_tempo_are_found_confidently():
    # sections at different tempos with breaks between (the corpus's music): one lag explains
    # them all, and the estimate may say so
    rng = np.random.default_rng(4)
    beats, cuts, t = [], [], 0.5
    while t < 28.0:
        beat = 60.0 / rng.uniform(84, 150)
        sec = t + beat * np.arange(int(rng.integers(8, 20)))
        sec = sec[sec < 29.5]
        beats += list(sec)
        cuts += [sec[0], *sec[1:][rng.random(len(sec) - 1) < 0.33]]
        t = sec[-1] + beat + rng.uniform(0.3, 0.9)
    seen = _run(_stream(np.array(beats), np.array(cuts), skew_us=250_000, seconds=30.0,
                        seed=4))
    late = seen[len(seen) // 2:]
    assert np.mean([c >= 0.5 for _, c in late]) >= 0.5, late
    assert all(abs(o - 250) <= 50 for o, c in late if c >= 0.5), late


def test_rival_margin_is_the_log_odds_of_the_best_lag_far_away():
    tr = LagTracker(-100, 100)
    lik = np.full(201, -20.0)
    lik[100 + 10] = 0.0  # lag +10: best
    lik[100 - 40] = -3.0  # lag -40 (400 ms away): e^3 less likely
    tr.update(lik)
    assert tr.rival_margin(10, 3, 15) == pytest.approx(3.0)
    assert tr.rival_margin(10, 3, 60) == pytest.approx(20.0)  # the rival is nearer than 60
    assert tr.rival_margin(0, 3, 500) == float("inf")  # no lag that far
