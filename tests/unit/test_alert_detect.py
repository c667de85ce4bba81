"""Alert detection over feature records, the skew board, and blind records from a really
degraded image extractor."""

from __future__ import annotations

import msgpack
import pytest

from app.alerts.detect import (
    LATE_KINDS,
    SCORE_KINDS,
    Detector,
    SkewView,
    Thresholds,
    window_start,
)
from app.features.degrade import LEVELS
from app.features.pipeline import FeaturePipeline
from app.features.text import TermMatcher
from app.runtime.skewboard import SkewBoard
from app.settings import Settings
from schemas.dead_letter import DeadLetter
from schemas.features import FeatureRecord
from schemas.skew import SkewState
from tests.helpers import chart, frame_event, raw_msg

TOPIC = "mm.{}".format


def _rec(modality: str, ts: int, feats: dict, *, sid: str = "s", offset: int = 0,
         trace: str | None = "tr") -> FeatureRecord:
    return FeatureRecord(stream_id=sid, modality=modality, ts=ts, dur=0, seq=None,
                         trace_id=trace, kafka_ts_ms=1_000, src_partition=2, src_offset=offset,
                         feats=feats)


def _det(**th) -> Detector:
    return Detector(Thresholds(**th), TOPIC, TermMatcher(["scam", "诈骗"]), clock_us=lambda: 42)


REF = SkewView(0, 1.0, 1_000_000)


def test_window_start_buckets_like_the_aligner():
    assert window_start(2_999_999, 1_000_000) == 2_000_000
    assert window_start(3_000_000, 1_000_000) == 3_000_000
    assert window_start(-5, 1_000_000) == 0
    assert window_start(1_250_000, 500_000) == 1_000_000


def test_nsfw_at_or_over_the_threshold_alerts_and_under_does_not():
    d = _det(nsfw=0.8)
    assert d.record(_rec("image", 5, {"nsfw": 0.7999}), REF) == []
    (a,) = d.record(_rec("image", 2_500_000, {"nsfw": 0.8}, offset=9), REF)
    assert (a.kind, a.modality, a.score, a.ts, a.window_id) == ("nsfw", "image", 0.8, 2_500_000,
                                                               "s@2000000")
    assert (a.source.topic, a.source.partition, a.source.offset) == ("mm.image", 2, 9)
    assert a.trace_id == "tr" and a.emitted_at == 42 and a.kafka_ts_ms == 1_000
    assert a.detail == {"threshold": 0.8} and a.skew_confidence == 1.0
    (a,) = d.record(_rec("image", 0, {"nsfw": 0.95, "reused": True}), REF)
    assert a.detail["reused"] is True and "precision" not in a.detail
    (a,) = d.record(_rec("image", 0, {"nsfw": 0.9, "nsfw_int8": True}), REF)
    assert a.detail == {"threshold": 0.8, "precision": "int8"}  # the FP32 worker's fallback
    # no score: no alert (with the models on, the batch reports it blind: below)
    assert d.record(_rec("image", 0, {"luma": 0.5}), REF) == []


def test_a_held_frame_never_alerts_on_its_stale_score():
    d = _det(nsfw=0.5)
    assert d.record(_rec("image", 0, {"nsfw": 0.99, "held": True, "ocr": "scam"}), REF) == []


def test_caption_terms_alert_with_the_skew_applied():
    d = _det()
    skew = SkewView(offset_us=-300_000, confidence=0.7, window_us=1_000_000)
    (a,) = d.record(_rec("text", 4_800_000, {"terms": ["诈骗"], "tokens": ["x"]}), skew)
    # text runs 300 ms early: on the reference clock it is at 5.1 s, window 5
    assert (a.kind, a.ts, a.event_ts, a.window_id) == ("term", 5_100_000, 4_800_000, "s@5000000")
    assert a.offset_ms == -300.0 and a.skew_confidence == 0.7 and a.score == 1.0
    assert a.detail == {"terms": ["诈骗"]}
    assert d.record(_rec("text", 0, {"terms": [], "tokens": ["hi"]}), skew) == []
    assert _det(terms=False).record(_rec("text", 0, {"terms": ["scam"]}), skew) == []
    # no trace id: the one the pipeline would assign
    (a,) = d.record(_rec("text", 0, {"terms": ["scam"]}, trace=None, offset=5), REF)
    assert a.trace_id == "text-2-5"


def test_ocr_terms_alert_only_where_ocr_ran():
    d = _det()
    (a,) = d.record(_rec("image", 0, {"nsfw": 0.1, "ocr": "A SCAM offer"}), REF)
    assert a.kind == "ocr_term" and a.detail["terms"] == ["scam"]
    assert d.record(_rec("image", 0, {"nsfw": 0.1, "ocr": "fine print"}), REF) == []
    assert d.record(_rec("image", 0, {"nsfw": 0.1}), REF) == []
    assert _det(ocr_terms=False).record(_rec("image", 0, {"ocr": "scam"}), REF) == []
    both = _det(nsfw=0.5).record(_rec("image", 0, {"nsfw": 0.9, "ocr": "诈骗"}), REF)
    assert [a.kind for a in both] == ["nsfw", "ocr_term"]


def test_batch_skips_dead_letters_and_reports_blind_frames_per_stream():
    d = _det(nsfw=0.5)
    dl = DeadLetter("mm.image", 0, 1, b"s", b"x", "bad_image", "no")
    outs = [
        _rec("image", 1_000_000, {"nsfw": 0.9}, offset=1),
        dl,
        _rec("image", 1_200_000, {"nsfw": 0.9, "held": True}, offset=2),
        _rec("image", 1_400_000, {"nsfw": 0.1}, offset=3),
        _rec("image", 1_600_000, {"nsfw": 0.9, "held": True}, offset=4),
        _rec("image", 1_100_000, {"held": True}, sid="other", offset=5),
        _rec("text", 1_000_000, {"terms": ["scam"]}, offset=6),
    ]
    res = d.batch(outs, lambda sid, m: REF, level=1)
    assert [(a.stream_id, a.kind) for a in res.alerts] == [
        ("s", "nsfw"), ("s", "term"), ("s", "blind"), ("other", "blind")]
    blind = res.alerts[2]
    assert blind.score == 0.5 and blind.ts == 1_200_000 and blind.source.offset == 2
    assert blind.detail == {"skipped": 2, "frames": 4, "level": 1, "reason": "sampled",
                            "ts_from": 1_200_000, "ts_to": 1_600_000,
                            "offsets": [[2, 2], [2, 4]], "trace_ids": ["tr", "tr"]}
    assert res.alerts[3].detail["reason"] == "off"  # held without any score: models off
    assert res.skipped == {"sampled": 2, "off": 1}
    assert d.batch([dl], lambda sid, m: REF).alerts == []


def test_a_frame_without_a_score_is_blind_unless_the_models_are_off_by_profile():
    """A near-duplicate of a frame held at level 3 reuses its empty features: nobody
    looked at that picture, whatever the level is now."""
    recs = [_rec("image", 0, {"luma": 0.5, "reused": True}, offset=1),
            _rec("image", 1, {"luma": 0.5, "nsfw": 0.01}, offset=2)]
    res = _det(nsfw=0.5).batch(recs, lambda sid, m: REF, level=0)
    (b,) = res.alerts
    assert b.kind == "blind" and b.detail["reason"] == "off" and b.detail["offsets"] == [[2, 1]]
    light = Detector(Thresholds(nsfw=0.5), TOPIC, models=False)
    assert light.batch(recs, lambda sid, m: REF).alerts == []


def test_skew_board_keeps_the_newest_state_per_stream():
    b = SkewBoard(window_us=1_000_000, max_streams=2)
    assert b.view("s", "text") == SkewView(0, 0.0, 1_000_000)  # unknown: offset 0, said so
    assert b.view("s", "image") == SkewView(0, 1.0, 1_000_000)  # the reference
    new = SkewState("s", {"image": 0.0, "text": -250.4}, {"text": 0.6}, 500_000, at=200)
    assert b.update(new)
    assert not b.update(SkewState("s", {"text": 900.0}, {"text": 1.0}, 500_000, at=100))
    assert b.view("s", "text") == SkewView(-250_400, 0.6, 500_000)
    assert b.view("s", "audio") == SkewView(0, 0.0, 500_000)  # no estimate for it
    b.on_value(b"\x93")  # not a map: counted, skipped
    b.on_value(msgpack.packb({"v": 1, "stream_id": "x"}))
    assert b.bad == 2
    b.on_value(SkewState("a", at=1).encode())
    b.on_value(SkewState("b", at=1).encode())
    assert len(b) == 2 and b.get("s") is None  # bounded: the oldest stream went


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    p = FeaturePipeline(Settings(data_dir=tmp_path_factory.mktemp("al"), device="cpu",
                                 cache=False))
    p.warm("image")
    return p


def test_a_really_degraded_batch_gives_a_blind_record(pipe):
    """The image extractor at level 1 holds every 2nd new frame: the detector says so."""
    im = pipe.extractor("image")
    im.set_level(LEVELS[1])
    try:
        out = im.run([frame_event(chart(80 + i), "deg", i * 200_000) for i in range(6)])
    finally:
        im.set_level(LEVELS[0])
    recs = [_rec("image", i * 200_000, f, sid="deg", offset=i) for i, f in enumerate(out)]
    res = _det(nsfw=0.0).batch(recs, lambda sid, m: REF, level=1)
    kinds = [a.kind for a in res.alerts]
    # threshold 0: every scored frame alerts, every held one is in the blind record instead
    assert kinds == ["nsfw", "nsfw", "nsfw", "blind"]
    blind = res.alerts[-1]
    assert blind.detail["offsets"] == [[2, 1], [2, 3], [2, 5]] and res.skipped == {"sampled": 3}


def test_pipeline_outputs_feed_the_detector(pipe):
    msgs = [raw_msg(frame_event(chart(90 + i), "p", i), i) for i in range(2)]
    outs = pipe.process("image", [*msgs, raw_msg(frame_event(chart(1), "p"), 9, b"\x00")])
    assert isinstance(outs[-1], DeadLetter)
    res = _det(nsfw=0.0).batch(outs, lambda sid, m: REF)
    assert [(a.kind, a.source.offset) for a in res.alerts] == [("nsfw", 0), ("nsfw", 1)]
    assert not res.skipped


def test_score_kinds_come_first_and_ocr_terms_after():
    """A frame's nsfw and blind alerts are decided from its score alone (sent before its
    OCR text exists); its ocr_term from the whole record later: together, all of them."""
    d = _det(nsfw=0.5)
    recs = [_rec("image", 0, {"nsfw": 0.9, "ocr": "a scam here"}, offset=0),
            _rec("image", 1, {"nsfw": 0.9, "held": True}, offset=1)]
    early = d.batch(recs, lambda sid, m: REF, kinds=SCORE_KINDS)
    late = d.batch(recs, lambda sid, m: REF, kinds=LATE_KINDS)
    assert [a.kind for a in early.alerts] == ["nsfw", "blind"]
    assert early.skipped == {"sampled": 1}
    assert [a.kind for a in late.alerts] == ["ocr_term"] and late.skipped == {}
    whole = d.batch(recs, lambda sid, m: REF)
    assert sorted(a.kind for a in whole.alerts) == sorted(
        a.kind for a in early.alerts + late.alerts)


def test_the_pipeline_hands_over_scores_before_the_embeddings(pipe, monkeypatch):
    """Issue 26: a frame batch's scores reach the alert path once Open-NSFW ran, before
    EfficientNet: the records handed over carry the final scores and no embedding yet."""
    im = pipe.extractor("image")
    order: list[str] = []
    real = im.effnet.run
    monkeypatch.setattr(im.effnet, "run", lambda *a: (order.append("effnet"), real(*a))[1])
    got: list[list[FeatureRecord]] = []

    def on_scored(recs):
        order.append("scored")
        got.append(recs)

    msgs = [raw_msg(frame_event(chart(100 + i), "early", i), i) for i in range(3)]
    outs = pipe.process("image", [*msgs, raw_msg(frame_event(chart(1), "early"), 9, b"\x00")],
                        on_scored)
    assert order[0] == "scored" and "effnet" in order and len(got) == 1
    (recs,) = got
    assert [r.src_offset for r in recs] == [0, 1, 2]  # the dead letter has no record
    for r, o in zip(recs, outs[:3], strict=True):
        assert isinstance(o, FeatureRecord)
        assert "emb" not in r.feats and "emb" in o.feats
        assert r.feats["nsfw"] == pytest.approx(o.feats["nsfw"])
        assert r.trace_id == o.trace_id and r.kafka_ts_ms == o.kafka_ts_ms
    # a batch with nothing for the models still hands over (cached, reused, held frames)
    got.clear()
    pipe.process("image", [raw_msg(frame_event(chart(102), "early", 5), 5)], on_scored)
    assert len(got) == 1 and got[0][0].feats.get("reused") and "nsfw" in got[0][0].feats


def test_a_batch_that_fails_before_its_scores_hands_nothing_over(pipe, monkeypatch):
    im = pipe.extractor("image")

    def broken(*a):
        raise RuntimeError("model down")

    got: list[list[FeatureRecord]] = []
    msgs = [raw_msg(frame_event(chart(120 + i), "fail", i), i) for i in range(2)]
    with monkeypatch.context() as mp:
        mp.setattr(im.nsfw, "run", broken)
        outs = pipe.process("image", msgs, got.append)
    assert got == [] and all(isinstance(o, DeadLetter) for o in outs)
