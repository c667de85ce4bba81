"""Per-caption alignment (issue 25): crafted sequences, one corpus case, the window record.

The crafted cases put speech segments at known times and captions after them with
their own delays (0.3 to 2.5 s), one dropped, one merged, one split; each caption
must land on the start of its own speech. The corpus case's bounds are loose
(about three times what ``scripts/bench_align.py --corpus`` measures on it).
"""

from __future__ import annotations

import numpy as np

from app.align.captions import (
    Cap,
    CaptionPlacer,
    Segment,
    align_captions,
    one_shift,
    speech_segments,
)
from schemas.aligned import AlignedWindow
from schemas.codec import decode_map
from scripts.benchlib.corpus.cases import select
from scripts.benchlib.corpus.run import run_case

S = 1_000_000  # us
#: (start s, duration s) of each utterance; gaps and lengths irregular
_SPEECH = [(0.5, 1.2), (2.4, 0.6), (3.6, 2.0), (6.5, 0.8), (8.0, 1.6), (10.3, 0.7),
           (11.9, 2.2), (15.0, 1.0), (16.8, 0.5), (18.0, 1.9)]
_DELAYS = [1.9, 0.4, 2.3, 0.7, 1.2, 2.5, 0.3, 1.6, 0.9, 2.0]


def _segs() -> list[Segment]:
    return [Segment(a * S, (a + d) * S) for a, d in _SPEECH]


def _caps(pick: list[int]) -> list[Cap]:
    caps, last = [], -1
    for j in pick:
        a, d = _SPEECH[j]
        ts = max(int((a + _DELAYS[j]) * S), last + 100_000)  # in order, as ASR publishes
        caps.append(Cap(ts, int((d + 0.1) * S)))
        last = ts
    return caps


def _align(caps: list[Cap]) -> list[float]:
    got = align_captions(caps, _segs(), delay_us=1.25 * S, lo_us=-1 * S, hi_us=2.5 * S)
    assert all(p is not None for p in got)
    return [p.speech_us / S for p in got if p is not None]


def test_varying_delays_each_caption_on_its_own_speech():
    got = _align(_caps(list(range(10))))
    assert np.allclose(got, [a for a, _ in _SPEECH])


def test_a_dropped_caption_leaves_the_others_in_place():
    pick = [0, 1, 2, 3, 5, 6, 7, 8, 9]  # the caption of utterance 4 never came
    assert np.allclose(_align(_caps(pick)), [_SPEECH[j][0] for j in pick])


def test_a_merged_caption_starts_with_its_first_utterance():
    caps = _caps(list(range(10)))
    a4, _ = _SPEECH[4]
    a5, d5 = _SPEECH[5]
    merged = Cap(caps[4].ts_us, int((a5 + d5 - a4 + 0.1) * S))  # utterances 4 and 5 as one
    got = _align([*caps[:4], merged, *caps[6:]])
    assert np.allclose(got, [_SPEECH[j][0] for j in (0, 1, 2, 3, 4, 6, 7, 8, 9)])


def test_a_split_caption_second_part_starts_inside_the_utterance():
    caps = _caps(list(range(10)))
    a, d = _SPEECH[6]  # 2.2 s, split at 1.0 s
    first = Cap(caps[6].ts_us, int(1.1 * S))
    second = Cap(caps[6].ts_us + 700_000, int((d - 1.0 + 0.1) * S))
    got = align_captions([*caps[:6], first, second, *caps[7:]], _segs(), delay_us=1.25 * S,
                         lo_us=-1 * S, hi_us=2.5 * S)
    assert got[6] is not None and got[7] is not None
    assert got[6].speech_us == a * S
    assert abs(got[7].speech_us - (a + 1.0) * S) <= 50_000 and got[7].conf <= 0.5


def test_confidence_falls_where_two_segments_tie():
    # two identical utterances, one caption that could follow either
    segs = [Segment(1 * S, 2 * S), Segment(2.5 * S, 3.5 * S)]
    (p,) = align_captions([Cap(int(3.0 * S), int(1.1 * S))], segs, delay_us=1.25 * S,
                          lo_us=-1 * S, hi_us=2.5 * S)
    assert p is not None and p.conf < 0.5
    (q,) = align_captions([Cap(int(2.2 * S), int(1.1 * S))], segs[:1], delay_us=1.25 * S,
                          lo_us=-1 * S, hi_us=2.5 * S)
    assert q is not None and q.conf == 1.0


def test_one_shift_finds_subtitles_and_not_asr():
    subs = [Cap(int((a - 0.3) * S), int(2.0 * S)) for a, _ in _SPEECH]  # 300 ms early
    got = one_shift(subs, _segs(), lo_us=-1 * S, hi_us=2.5 * S)
    assert got.delay_us == -300_000 and got.share == 1.0 and got.fits == got.heard == 10
    got = one_shift(_caps(list(range(10))), _segs(), lo_us=-1 * S, hi_us=2.5 * S)
    assert got.share < 0.75


def _placer(caps: list[Cap], audio_conf: float = 1.0, text_conf: float = 0.0
            ) -> CaptionPlacer:
    """A placer given ``caps`` (seq = index) and one round against ``_segs()``."""
    cp = CaptionPlacer()
    for k, c in enumerate(caps):
        cp.add(c.ts_us, c.dur_us, k)
    cp.place(_segs(), lo_us=-1 * S, hi_us=2.5 * S, audio_offset_us=0.0, audio_conf=audio_conf,
             text_conf=text_conf)
    return cp


def test_placer_places_asr_captions_and_leaves_subtitles_to_the_offset():
    asr = _caps(list(range(5, 10)))  # five: within 10 s of the newest
    cp = _placer(asr)
    assert not cp.steady
    assert sorted(t / S for t, _ in cp.placed.values()) == [a for a, _ in _SPEECH[5:]]
    subs = _placer([Cap(int((a + 0.2) * S), int(2.0 * S)) for a, _ in _SPEECH[5:]])
    assert subs.steady and not subs.placed
    assert _placer(asr[:3]).steady  # too few to tell: the offset places them


def test_a_caption_after_a_merged_segment_splits_it_instead_of_falling_back():
    # utterances at 0.5 and 1.6 s less than a bridged dip apart: one segment 0.5-2.8 s;
    # the second caption trails its words by 2.35 s, 3.45 s after the segment's start and
    # before the next one: outside every band. Placed where the first caption's words end
    segs = [Segment(0.5 * S, 2.8 * S), Segment(4.0 * S, 5.0 * S)]
    caps = [Cap(int(1.2 * S), int(1.25 * S)), Cap(int(3.95 * S), int(1.3 * S)),
            Cap(int(5.2 * S), int(1.1 * S))]
    got = align_captions(caps, segs, delay_us=1.25 * S, lo_us=0.0, hi_us=2.5 * S)
    assert got[0] is not None and got[0].speech_us == 0.5 * S
    # (the cut: where the first caption's words end, 1.6 s, and where the second's begin
    # counted back from the segment's end, 1.65 s, averaged)
    assert got[1] is not None and abs(got[1].speech_us - 1.6 * S) <= 50_000
    assert got[1].conf < 0.5
    assert got[2] is not None and got[2].speech_us == 4.0 * S


def test_a_split_utterances_second_part_is_not_put_on_the_next_utterance():
    # tune asr-02 at 20 s: an utterance 6.58-8.2 s split in two captions (its words 0.84 s,
    # then 1.06 s), the next utterance at 8.61 s. Segment by segment the second part went to
    # the next utterance (confidence 0.97, 1.3 s off) and pushed the caption after it off
    # its own; cut where the first part's words end, each is on its own speech
    segs = [Segment(0.78 * S, 2.43 * S), Segment(3.99 * S, 5.93 * S), Segment(6.58 * S, 8.2 * S),
            Segment(8.61 * S, 10.07 * S)]
    caps = [Cap(int(2.67 * S), int(1.98 * S)), Cap(int(5.4 * S), int(2.21 * S)),
            Cap(int(7.69 * S), int(0.99 * S)), Cap(int(9.53 * S), int(1.21 * S)),
            Cap(int(10.42 * S), int(1.84 * S))]
    got = align_captions(caps, segs, delay_us=1.25 * S, lo_us=0.0, hi_us=2.5 * S)
    assert all(p is not None for p in got)
    at = [p.speech_us / S for p in got if p is not None]
    assert at[:3] == [0.78, 3.99, 6.58] and at[4] == 8.61
    assert abs(at[3] - 7.3) <= 0.1  # its words start 7.30 s (truth of the corpus case)
    assert got[3] is not None and got[3].conf < 0.5  # a cut: an estimate, not heard


def test_a_segment_still_heard_counts_as_long_as_the_newest_captions_words():
    # the newest words began at 2.0 s and 0.3 s of them are heard: measured as heard the
    # segment is as short as the one before, and its caption went there at confidence 1
    segs = [Segment(0.2 * S, 0.5 * S), Segment(2.0 * S, 2.3 * S)]
    cap = [Cap(int(2.25 * S), int(2.0 * S))]
    (early,) = align_captions(cap, segs, delay_us=1.25 * S, lo_us=0.0, hi_us=2.5 * S)
    assert early is not None and early.speech_us == 0.2 * S  # without the open end
    (p,) = align_captions(cap, segs, delay_us=1.25 * S, lo_us=0.0, hi_us=2.5 * S,
                          heard_us=2.3 * S)
    assert p is not None and p.speech_us == 2.0 * S


def test_the_verdict_needs_captions_in_a_row_to_change():
    cp = _placer(_caps(list(range(10))))
    assert not cp.steady  # ASR
    # then subtitles 30 s on, 200 ms after their speech, with the speech they follow
    segs = [*_segs(), *(Segment(s.start_us + 30 * S, s.end_us + 30 * S) for s in _segs())]
    steady = []
    for k, (a, _) in enumerate(_SPEECH):
        cp.add(int((a + 30.2) * S), int(2.0 * S), 100 + k)
        cp.place(segs, lo_us=-1 * S, hi_us=2.5 * S, audio_offset_us=0.0, audio_conf=1.0)
        steady.append(cp.steady)
    first = steady.index(True)
    assert first >= 3 and all(steady[first:])  # not on the first that fit; then it holds


def test_a_sure_caption_offset_or_an_unknown_sound_offset_leaves_captions_to_the_offset():
    asr = _caps(list(range(5, 10)))
    cp = _placer(asr, text_conf=0.9)
    assert cp.steady and not cp.placed  # the lag tracker is sure of one caption offset
    cp = _placer(asr, audio_conf=0.05)
    assert not cp.placed  # where the speech lies on the picture's clock is not known


def test_a_fairly_sure_caption_offset_votes_but_is_never_the_first_verdict():
    # ASR captions whose offset the lag tracker holds at 0.6 early on (tune asr-19: 0.53 at
    # its fourth caption): the test of one shift decides, and they are placed one by one
    asr = _caps(list(range(5, 10)))
    cp = _placer(asr, text_conf=0.6)
    assert cp.decided and not cp.steady and len(cp.placed) == 5
    # decided, the same confidence is one vote per new caption: it takes more than one
    cp.add(asr[-1].ts_us + 3 * S, int(0.8 * S), 99)
    cp.place(_segs(), lo_us=-1 * S, hi_us=2.5 * S, audio_offset_us=0.0, audio_conf=1.0,
             text_conf=0.6)
    assert not cp.steady


def test_one_shift_is_not_the_first_verdict_on_three_captions_of_four():
    # three ASR captions 1.2 s behind their speech and one 0.4 s: three of four fit one
    # shift (tune asr-13: 1.18 to 1.25 s), too few to call them subtitles yet
    speech = [0.5, 2.4, 3.6, 6.5]
    caps = [Cap(int((a + d) * S), int(0.7 * S)) for a, d in zip(speech, (1.2, 0.4, 1.2, 1.2),
                                                                   strict=True)]
    cp = _placer(caps)
    assert not cp.decided and cp.steady and not cp.placed


def test_an_undecided_placer_keeps_its_first_captions_past_the_span():
    caps = [Cap(int(t * S), int(0.5 * S)) for t in (1.0, 6.0, 12.0, 18.0, 24.0)]
    cp = CaptionPlacer(keep=8, span_us=10 * S)
    for k, c in enumerate(caps):
        cp.add(c.ts_us, c.dur_us, k)
    span = cp.window(hi_us=int(2.5 * S), lo_us=-1 * S)
    assert span is not None and span[0] < 1 * S  # all five, though 23 s apart
    cp._decided = True  # told: only those within the span (and never fewer than four)
    cp.add(int(30 * S), int(0.5 * S), 9)
    span = cp.window(hi_us=int(2.5 * S), lo_us=-1 * S)
    assert span is not None and span[0] > 6 * S


def test_speech_segments_from_a_level_series():
    env = np.full(1000, -60.0)  # 10 s of hiss at -60 dB
    for a, b in ((50, 170), (240, 300), (600, 820)):
        env[a:b] = -20.0
        env[a + 30:a + 40] = -50.0  # a dip between syllables: bridged
    env[400:405] = -20.0  # a click: too short to be speech
    segs = speech_segments(env, first_bin=100)
    assert [(s.start_us, s.end_us) for s in segs] == [
        (1_500_000, 2_700_000), (3_400_000, 4_000_000), (7_000_000, 9_200_000)]
    assert speech_segments(np.full(500, -60.0), 0) == []  # nothing louder than the floor
    # the sound before the first bin was there but is not given: the run from the first bin
    # has no known start
    cut = speech_segments(env[60:], first_bin=160, open_start=True)
    assert [(s.start_us, s.end_us) for s in cut] == [(3_400_000, 4_000_000),
                                                     (7_000_000, 9_200_000)]


def test_corpus_asr_case_captions_on_their_speech():
    (case,) = select("all", None, ["asr-01"])
    caps = run_case(case, with_oracle=False).captions
    err = np.array([c.err for c in caps])
    today = np.array([c.today for c in caps])
    assert len(caps) >= 10
    assert np.median(err) <= 100 and np.median(err) < np.median(today) / 3


def _errors_by_seq(name: str) -> dict[int, float]:
    """|aligned_ts - truth| ms of each caption of a one-stream corpus case, by seq."""
    (case,) = select("all", None, [name])
    res = run_case(case, with_oracle=False)
    (tr,) = res.replay.truths.values()
    truth = tr.offsets["text"].captions
    return {seq: abs(aligned - (tr.start_us + truth[seq].speech_s * S)) / 1000
            for w in res.replay.windows for seq, _ts, aligned, _c, _t in w.captions
            if seq is not None}


def test_captions_whose_speech_was_not_all_there_yet_are_placed_on_it():
    # asr-05: the fourth caption comes 15 s after the first, whose speech the sound no
    # longer holds; the round that places captions 1-3 used to be skipped for it (1.9 to
    # 3 s off). asr-07: the last caption came 0.4 s after its words began, too soon to
    # find them; its window closed at once (1.3 s off) instead of waiting for them
    err5 = _errors_by_seq("asr-05")
    assert max(err5[k] for k in (1, 2, 3)) <= 150, err5
    err7 = _errors_by_seq("asr-07")
    assert err7[max(err7)] <= 150, err7


def test_a_streams_first_captions_and_split_utterances_on_their_speech():
    # tune cases (issue 25, 2026-12-06): asr-05's first caption, whose speech had left the
    # placement's horizon by its fourth (1.9 s off); asr-13's first two, left to the offset
    # on a verdict of three captions of four (0.2 to 0.9 s off); asr-02's split utterance,
    # whose second part went to the next one (1.3 s off at confidence 0.97)
    assert _errors_by_seq("asr-05")[0] <= 150
    err13 = _errors_by_seq("asr-13")
    assert max(err13[0], err13[1]) <= 150, err13
    err2 = _errors_by_seq("asr-02")
    assert max(err2[11], err2[12]) <= 150, err2


def test_windows_of_asr_captions_do_not_report_their_one_offset_as_sure():
    # one offset per window does not place captions each with its own delay: once the
    # stream's captions are found to be so, the window's text confidence stays under 0.5
    (case,) = select("all", None, ["asr-19"])  # its caption offset rose to 0.53 early on
    res = run_case(case, with_oracle=False)
    late = [w.confidence["text"] for w in res.replay.windows if w.start_us - min(
        x.start_us for x in res.replay.windows) >= 15 * S]
    assert late and max(late) < 0.5


def _window(**kw):
    return AlignedWindow(stream_id="s", window_start=0, window_end=10, rate_hz=20.0,
                         offsets_ms={"text": 1.0}, confidence={"text": 0.2}, counts={"text": 1},
                         grid={}, moderation={}, trace_ids=["t1"], emitted_at=1, **kw)


def test_window_captions_round_trip():
    caps = [{"trace_id": "t1", "ts": 2_300_000, "aligned_ts": 400_000, "conf": 0.87}]
    got = AlignedWindow.decode(_window(captions=caps).encode())
    assert got["captions"] == caps


def test_a_reader_of_the_earlier_fields_sees_the_same_record():
    with_caps = decode_map(_window(captions=[{"trace_id": "t1", "ts": 5, "aligned_ts": 3,
                                              "conf": 0.5}]).encode())
    before = decode_map(_window().encode())
    with_caps.pop("captions")
    before.pop("captions")
    assert with_caps == before
