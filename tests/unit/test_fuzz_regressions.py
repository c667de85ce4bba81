"""What the integration fuzz (tests/integration/test_fuzz.py) found, pinned as unit tests."""

from __future__ import annotations

from app.align.aligner import Aligner, AlignerConfig
from schemas.features import FeatureRecord

CFG = AlignerConfig(window_us=1_000_000, lateness_us=200_000, idle_s=2.0, rate_hz=20.0,
                    correct_skew=False)


def _rec(modality: str, ts: int, seq: int) -> FeatureRecord:
    return FeatureRecord(stream_id="s", modality=modality, ts=ts, dur=0, seq=seq,
                         trace_id=f"{modality}-{seq}", kafka_ts_ms=0, src_partition=0,
                         src_offset=seq, feats={})


def test_first_record_of_a_modality_late_does_not_crash_the_watermark() -> None:
    """Text silent past idle_s, windows close without it, then its first record is late.

    It used to leave the modality "heard" with no newest timestamp, and the next
    watermark raised KeyError, which crashed the aligner agent and the worker.
    """
    a = Aligner(CFG)
    for i in range(5):
        a.add(_rec("image", i * 1_000_000, i), now=0.0)
        a.add(_rec("audio", i * 1_000_000, i), now=0.0)
    a.add(_rec("image", 4_500_000, 5), now=2.4)
    a.add(_rec("audio", 4_500_000, 5), now=2.4)
    # text never heard for idle_s: it no longer holds the watermark (4.5 s - 0.2 s)
    assert [s for _, s, _ in a.poll(now=2.4)] == [0, 1_000_000, 2_000_000, 3_000_000]
    res = a.add(_rec("text", 100_000, 0), now=2.6)
    assert res.outcome == "late"
    a.add(_rec("image", 6_000_000, 6), now=2.7)
    a.add(_rec("audio", 6_000_000, 6), now=2.7)
    assert [s for _, s, _ in a.poll(now=2.7)] == [4_000_000]
