"""Skew estimation on synthetic streams whose content co-occurs across modalities.

Records come from the light extractors (the signals the aligner really sees),
without the model extractors, so the test stays fast.
"""

import numpy as np
import pytest

from app.align.aligner import Aligner, AlignerConfig
from app.clients.synth import SynthSpec, synth_events
from app.features.light import ImageSignals, audio_signals, text_signals
from schemas.events import AudioChunk, FrameEvent, TextEvent
from schemas.features import FeatureRecord


def records(spec: SynthSpec) -> list[FeatureRecord]:
    image = ImageSignals()
    out = []
    for i, ev in enumerate(synth_events(spec)[0]):
        if isinstance(ev, FrameEvent):
            feats = image(ev)
        elif isinstance(ev, AudioChunk):
            feats = audio_signals(ev)
        else:
            assert isinstance(ev, TextEvent)
            feats = text_signals(ev)
        out.append(FeatureRecord(
            stream_id=ev.stream_id, modality=ev.modality, ts=ev.ts, dur=ev.duration_us,
            seq=ev.seq, trace_id=None, kafka_ts_ms=0, src_partition=0, src_offset=i,
            feats=feats))
    return out


def run(spec: SynthSpec, cfg: AlignerConfig) -> tuple[Aligner, list, dict[str, int]]:
    a = Aligner(cfg)
    windows, outcomes = [], {"merged": 0, "late": 0, "duplicate": 0}
    now = 0.0
    for rec in records(spec):
        now += 0.001
        outcomes[a.add(rec, now).outcome] += 1
        for sid, start, recs in a.poll(now, [rec.stream_id]):
            windows.append((start, len(recs), a.offset_us(sid, "audio"),
                            a.confidence(sid, "audio"), a.offset_us(sid, "text")))
    for sid, start, recs in a.poll(now + 100.0):  # everything idle: flush
        windows.append((start, len(recs), a.offset_us(sid, "audio"),
                        a.confidence(sid, "audio"), a.offset_us(sid, "text")))
    return a, windows, outcomes


@pytest.mark.parametrize(("audio_us", "text_us"), [(300_000, -200_000), (-450_000, 120_000)])
def test_known_skew_recovered_on_a_short_stream(audio_us, text_us):
    spec = SynthSpec(stream_id="s", seconds=20, fps=25, audio_skew_us=audio_us,
                     text_skew_us=text_us, jitter_us=20_000, dropout=0.02, seed=7)
    a, windows, outcomes = run(spec, AlignerConfig())
    n = len(records(spec))
    assert outcomes == {"merged": n, "late": 0, "duplicate": 0}
    assert sum(w[1] for w in windows) == n  # every record in exactly one window
    late_half = [w for w in windows if w[0] >= spec.start_us + 10_000_000]
    audio_err = [abs(w[2] - audio_us) for w in late_half]
    text_err = [abs(w[4] - text_us) for w in late_half]
    assert np.median(audio_err) <= 20_000 and max(audio_err) <= 50_000, audio_err
    assert np.median(text_err) <= 25_000 and max(text_err) <= 60_000, text_err
    # calibrated: where it says 0.5 or more it is right; scenes here are up to 3 s apart,
    # and the confidence falls in the longer gaps (it says when the content is silent)
    sure = [abs(w[2] - audio_us) for w in windows if w[3] >= 0.5]
    assert len(sure) >= len(windows) / 3 and max(sure) <= 50_000


def test_drift_is_followed():
    # 50 ms of drift per minute (2.5x the bench's), over 60 s
    spec = SynthSpec(stream_id="s", seconds=60, fps=25, audio_skew_us=100_000,
                     audio_drift_us_per_min=50_000, jitter_us=10_000, seed=3)
    _, windows, _ = run(spec, AlignerConfig())
    errs = []
    for start, _, off, _, _ in windows:
        t_min = (start - spec.start_us) / 60e6
        if t_min > 0.25:
            errs.append(abs(off - (100_000 + 50_000 * t_min)))
    assert np.median(errs) <= 20_000, errs
    late = [w[2] for w in windows if w[0] - spec.start_us > 45_000_000]
    assert np.mean(late) > 120_000  # it moved with the drift, not held at the start


def test_nothing_to_align_holds_the_offset_and_lowers_the_confidence():
    # 15 s of content, then 10 s of a still picture and silence
    spec = SynthSpec(stream_id="s", seconds=15, fps=25, audio_skew_us=250_000, seed=5)
    recs = records(spec)
    a = Aligner(AlignerConfig())
    now = 0.0
    for rec in recs:
        now += 0.001
        a.add(rec, now)
        a.poll(now, ["s"])
    before = a.offset_us("s", "audio")
    assert abs(before - 250_000) <= 30_000 and a.confidence("s", "audio") >= 0.5
    end = spec.start_us + 15_000_000
    quiet = np.zeros(1600, dtype="<i2")  # 100 ms of silence at 16 kHz
    for k in range(100):  # 10 s
        ts = end + k * 100_000
        frame = FrameEvent(stream_id="s", ts=ts, data=_STILL)
        chunk = AudioChunk(stream_id="s", ts=ts, data=quiet.tobytes())
        for ev, feats in ((frame, _IMG(frame)), (chunk, audio_signals(chunk))):
            now += 0.001
            a.add(FeatureRecord(stream_id="s", modality=ev.modality, ts=ev.ts,
                                dur=ev.duration_us, seq=None, trace_id=None, kafka_ts_ms=0,
                                src_partition=0, src_offset=100_000 + 2 * k, feats=feats), now)
            a.poll(now, ["s"])
    assert a.confidence("s", "audio") <= 0.2
    assert abs(a.offset_us("s", "audio") - before) <= 20_000


_STILL = FrameEvent(stream_id="s", ts=0, data=__import__("simplejpeg").encode_jpeg(
    np.full((48, 64, 3), 90, np.uint8))).data
_IMG = ImageSignals()


def test_without_correction_offsets_stay_zero():
    spec = SynthSpec(stream_id="s", seconds=6, fps=25, audio_skew_us=300_000, seed=2)
    a, windows, outcomes = run(spec, AlignerConfig(correct_skew=False))
    assert {w[2] for w in windows} == {0} and outcomes["late"] == 0
