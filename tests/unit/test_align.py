import numpy as np
import pytest

from app.align.aligner import Aligner, AlignerConfig
from schemas.codec import pack_array, unpack_array
from schemas.features import FeatureRecord

# Watermark and windowing semantics without skew correction (offsets 0, no margin);
# skew correction has its own tests below and in test_skew.py.
CFG = AlignerConfig(window_us=1_000_000, lateness_us=200_000, idle_s=2.0, rate_hz=20.0,
                    correct_skew=False)
SKEW_CFG = AlignerConfig(window_us=1_000_000, lateness_us=200_000, idle_s=2.0, rate_hz=20.0)


def rec(modality, ts, seq=None, sid="s", dur=0, **feats):
    return FeatureRecord(stream_id=sid, modality=modality, ts=ts, dur=dur, seq=seq,
                         trace_id=f"{modality}-{seq}", kafka_ts_ms=0, src_partition=0,
                         src_offset=seq or 0, feats=feats)


def test_window_assignment_and_watermark_close():
    a = Aligner(CFG)
    for m in ("image", "audio", "text"):
        assert a.add(rec(m, 100_000, 0), now=0.0).outcome == "merged"
    assert a.poll(now=0.1) == []  # nothing has passed 1 s + lateness yet
    for m in ("image", "audio", "text"):
        a.add(rec(m, 1_300_000, 1), now=0.2)
    closed = a.poll(now=0.2)
    assert [(sid, start, len(rs)) for sid, start, rs in closed] == [("s", 0, 3)]


def test_slowest_modality_holds_the_watermark():
    a = Aligner(CFG)
    a.add(rec("image", 5_000_000, 0), now=0.0)
    a.add(rec("audio", 100_000, 0), now=0.0)
    a.add(rec("text", 5_000_000, 0), now=0.0)
    assert a.poll(now=0.1) == []  # audio is at 0.1 s: window 0 stays open
    a.add(rec("audio", 2_500_000, 1), now=0.2)
    assert [start for _, start, _ in a.poll(now=0.2)] == [0]  # window 2 s ends past 2.3 s


def test_unseen_modality_waits_idle_then_stops_holding():
    a = Aligner(CFG)
    a.add(rec("image", 100_000, 0), now=0.0)
    a.add(rec("image", 3_000_000, 1), now=0.0)
    assert a.poll(now=1.0) == []  # audio and text may still be starting
    # after idle_s with only image heard, image alone drives the watermark
    a.add(rec("image", 3_100_000, 2), now=2.5)
    assert [start for _, start, _ in a.poll(now=2.5)] == [0]


def test_idle_modality_stops_holding_and_all_idle_flushes():
    a = Aligner(CFG)
    for m in ("image", "audio", "text"):
        a.add(rec(m, 100_000, 0), now=0.0)
    a.add(rec("image", 4_000_000, 1), now=1.0)
    a.add(rec("audio", 4_000_000, 1), now=1.0)
    assert a.poll(now=1.5) == []  # text (at 0.1 s) still active
    assert [s for _, s, _ in a.poll(now=2.1)] == [0]  # text idle now
    assert [s for _, s, _ in a.poll(now=3.5)] == [4_000_000]  # everything idle: flush


def test_late_and_duplicate():
    a = Aligner(CFG)
    a.add(rec("image", 100_000, 0), now=0.0)
    assert a.add(rec("image", 100_000, 0), now=0.0).outcome == "duplicate"
    a.poll(now=10.0)  # all idle: window 0 closes
    res = a.add(rec("audio", 500_000, 0), now=10.1)
    assert res.outcome == "late"
    assert res.late is not None and res.late.window_start == 0 and res.late.window_end == 1_000_000
    # a record for a new window after the flush is merged
    assert a.add(rec("audio", 1_500_000, 1), now=10.2).outcome == "merged"


def test_empty_gap_windows_are_closed_too():
    a = Aligner(CFG)
    a.add(rec("image", 100_000, 0), now=0.0)
    a.poll(now=5.0)
    a.add(rec("image", 9_000_000, 1), now=5.0)
    a.poll(now=10.0)
    # an event for a window in the gap (never emitted, but passed) is late, not lost
    assert a.add(rec("image", 5_000_000, 2), now=10.0).outcome == "late"


def _know_audio_offset(a: Aligner, offset_us: int, confidence: float = 1.0) -> None:
    flt = a.streams["s"].skew.filters["audio"]
    flt.offset_us, flt.confidence = offset_us, confidence


def test_offsets_shift_windows_at_close_time():
    a = Aligner(SKEW_CFG)
    a.add(rec("image", 100_000, 0), now=0.0)
    a.add(rec("audio", 1_200_000, 0), now=0.0)
    # the estimate arrives while the record is still open: it moves to window 0
    _know_audio_offset(a, 300_000)
    a.add(rec("text", 5_000_000, 0), now=0.1)
    a.add(rec("image", 5_000_000, 1), now=0.1)
    a.add(rec("audio", 5_400_000, 1), now=0.1)
    closed = a.poll(now=0.1)
    assert [(start, sorted(r.modality for r in rs)) for _, start, rs in closed] == [
        (0, ["audio", "image"])]
    # (an update with nothing to estimate from lets the confidence decay a little)
    assert a.offset_us("s", "audio") == 300_000 and a.confidence("s", "audio") >= 0.8


def test_unsure_skew_holds_the_watermark_back():
    a = Aligner(SKEW_CFG)
    for m in ("image", "audio", "text"):
        a.add(rec(m, 100_000, 0), now=0.0)
        a.add(rec(m, 1_500_000, 1), now=0.0)
    # 1.5 s - 0.2 s lateness would close window 0, but audio and text may be
    # up to 1 s off while their skew is unknown: wait
    assert a.poll(now=0.1) == []
    _know_audio_offset(a, 0)
    a.streams["s"].skew.filters["text"].confidence = 1.0
    assert [start for _, start, _ in a.poll(now=0.1)] == [0]


def test_build_window_grid():
    a = Aligner(CFG)
    recs = [
        rec("image", 0, 0, luma=0.5, change=0.0),
        rec("image", 500_000, 1, luma=0.9, change=0.4),
        rec("audio", 0, 0, dur=100_000, rms=pack_array(np.array([0.1, 0.3], np.float32)),
            hop_us=50_000),
        rec("text", 600_000, 0, dur=200_000, tokens=["你好"], caption=1.0, terms=["x"]),
    ]
    for r in recs:
        a.add(r, now=0.0)
    w = a.window("s", 0, recs, emitted_at=1)
    assert w.counts == {"image": 2, "audio": 1, "text": 1}
    g = w.grid
    assert len(g["image"]["luma"]) == 20
    assert g["image"]["luma"][0] == 0.5 and g["image"]["luma"][9] == 0.5
    assert g["image"]["luma"][10] == 0.9 and g["image"]["luma"][19] == 0.9
    assert g["image"]["change"][10] == 0.4 and g["image"]["change"][11] == 0.0
    assert abs(g["audio"]["rms"][0] - 0.1) < 1e-6 and abs(g["audio"]["rms"][1] - 0.3) < 1e-6
    assert g["audio"]["rms"][2] is None
    assert g["text"]["caption"][11:17] == [0.0] + [1.0] * 4 + [0.0]  # 600..800 ms
    assert g["text"]["tokens"][12] == ["你好"]
    assert w.moderation["terms"] == ["x"]
    assert g["text"]["terms"][12] == ["x"]
    assert g["image"]["emb"] is None and g["audio"]["speech"] == [None] * 20


def test_build_window_carries_model_features():
    a = Aligner(CFG)
    e1, e2 = np.zeros(4, np.float16), np.zeros(4, np.float16)
    e1[0], e2[1] = 1, 1
    recs = [
        rec("image", 0, 0, luma=0.5, change=0.0, nsfw=0.1, emb=pack_array(e1)),
        rec("image", 500_000, 1, luma=0.5, change=0.1, nsfw=0.7, emb=pack_array(e2)),
        rec("audio", 0, 0, dur=100_000, rms=pack_array(np.array([0.1, 0.3], np.float32)),
            speech=pack_array(np.array([0.2, 0.9], np.float32)), hop_us=50_000),
    ]
    for r in recs:
        a.add(r, now=0.0)
    w = a.window("s", 0, recs, emitted_at=1)
    g = w.grid
    assert g["image"]["nsfw"][0] == pytest.approx(0.1)
    assert g["image"]["nsfw"][19] == pytest.approx(0.7)
    assert g["audio"]["speech"][:3] == [pytest.approx(0.2), pytest.approx(0.9), None]
    mean = unpack_array(g["image"]["emb"]).astype(np.float32)
    assert np.allclose(mean, [0.7071, 0.7071, 0, 0], atol=1e-3)
    assert w.moderation["nsfw_max"] == pytest.approx(0.7)
    assert sorted(w.trace_ids) == sorted(r.trace_id for r in recs)


def test_idle_streams_are_forgotten_open_ones_kept():
    from app.align.aligner import Aligner, AlignerConfig
    from schemas.features import FeatureRecord

    al = Aligner(AlignerConfig(stream_ttl_s=60.0, idle_s=1.0))

    def rec(sid: str, ts: int) -> FeatureRecord:
        return FeatureRecord(stream_id=sid, modality="image", ts=ts, dur=0, seq=None,
                             trace_id="t", kafka_ts_ms=0, src_partition=0, src_offset=0,
                             feats={"luma": 0.5, "change": 0.0})

    al.add(rec("done", 0), now=0.0)
    al.add(rec("open", 0), now=0.0)
    assert [sid for sid, _, _ in al.poll(5.0, ["done"])] == ["done"]  # all idle: emitted
    assert al.evict_idle(30.0) == []  # not idle long enough
    assert al.evict_idle(61.0) == ["done"]  # "open" still has a pending record
    assert set(al.streams) == {"open"}
    assert [sid for sid, _, _ in al.poll(62.0)] == ["open"]  # the open set drives a poll
    assert al.evict_idle(200.0) == ["open"] and not al.streams
