"""app.clients.media on real files made here with PyAV: frame picks, JPEG, audio chunks, errors."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import av
import numpy as np
import pytest
import simplejpeg

from app.cli import main
from app.clients.media import MediaError, pick_frame, probe, video_records
from schemas.events import decode_event
from tests.helpers import make_video, write_srt


def _decoded_frame_times(path: Path) -> list[float]:
    with av.open(str(path)) as c:
        return [float(f.time) for f in c.decode(video=0)]


def _decoded_samples(path: Path) -> int:
    with av.open(str(path)) as c:
        return sum(f.samples for f in c.decode(audio=0))


def test_pick_frame_resamples_by_presentation_time():
    # 30 fps source to 10 fps: the first frame of each 100 ms slot
    picks, slot = [], None
    for i in range(30):
        got = pick_frame(i * 1_000_000 // 30, 10.0, slot)
        if got is not None:
            picks.append(i)
            slot = got
    assert picks == list(range(0, 30, 3))
    # a slower source keeps every frame (nothing duplicated), and so does fps None / 0
    slot = None
    for i in range(10):
        slot = pick_frame(i * 200_000, 10.0, slot)
        assert slot is not None
    assert pick_frame(5, None, 3) == 4 and pick_frame(5, 0, None) == 0


def test_video_records_frames_audio_captions(tmp_path):
    video = make_video(tmp_path / "clip")
    srt = write_srt(tmp_path / "clip.srt")
    start = 1_700_000_000_000_000
    info = probe(video)
    assert info.has_video and info.has_audio and info.video_fps == 15.0
    assert abs(info.duration_us - 3_000_000) < 100_000

    gen = video_records(video, "cam", start, fps=10, chunk_ms=100, max_side=64, srt=srt,
                        timed=True)
    assert iter(gen) is gen  # lazy: a generator, not a list
    recs = list(gen)
    ts = [t for t, _ in recs]
    assert ts == sorted(ts)  # interleaved in event-time order

    events = [decode_event(m, key, value) for _, (m, key, value) in recs]
    assert all(key == b"cam" for _, (_, key, _) in recs)
    by = Counter(e.modality for e in events)

    # frames: the first of each 100 ms slot of the source's presentation times
    times = _decoded_frame_times(video)
    slots = {int((t - times[0]) * 10 + 1e-9) for t in times}
    frames = [e for e in events if e.modality == "image"]
    assert by["image"] == len(slots) == 30
    assert [e.seq for e in frames] == list(range(len(frames)))
    assert frames[0].ts == start and frames[1].ts == start + 133_333
    for e in frames[:3]:
        assert e.fmt == "jpeg"
        assert simplejpeg.decode_jpeg(e.data).shape == (48, 64, 3)  # 160x120 scaled, aspect kept
        assert e.trace_id == f"cam:image:{e.seq}"

    # audio: s16 mono at the source rate in 100 ms chunks, contiguous, nothing lost
    chunks = [e for e in events if e.modality == "audio"]
    assert {(e.sr, e.ch) for e in chunks} == {(16000, 1)}
    assert all(len(e.data) == 3200 for e in chunks[:-1]) and 0 < len(chunks[-1].data) <= 3200
    assert sum(len(e.data) // 2 for e in chunks) == _decoded_samples(video)
    assert chunks[0].ts == start
    assert [e.ts for e in chunks] == [start + i * 100_000 for i in range(len(chunks))]
    assert [e.seq for e in chunks] == list(range(len(chunks)))
    pcm = np.frombuffer(b"".join(e.data for e in chunks[:10]), np.int16)
    assert np.abs(pcm).max() > 3000  # the tone made it through (not silence)

    # captions from the sidecar file, at start + cue time
    texts = [e for e in events if e.modality == "text"]
    assert [(e.ts - start, e.dur, e.text) for e in texts] == [
        (200_000, 700_000, "欢迎 hello"), (1_200_000, 600_000, "second cue"),
        (2_100_000, 600_000, "third cue")]
    assert texts[0].trace_id == "cam:text:0"

    # every frame without resampling
    all_frames = [r for r in video_records(video, "cam", start, fps=None) if r[0] == "image"]
    assert len(all_frames) == len(times) == 45


def test_audio_only_file_and_rate_clamp(tmp_path):
    path = tmp_path / "tone.wav"
    with av.open(str(path), "w") as out:
        st = out.add_stream("pcm_s16le", rate=96000)
        st.layout = "stereo"
        x = (np.sin(np.arange(96000) / 10) * 8000).astype(np.int16)
        frame = av.AudioFrame.from_ndarray(np.repeat(x, 2)[None, :], format="s16",
                                           layout="stereo")
        frame.sample_rate, frame.pts = 96000, 0
        for p in st.encode(frame):
            out.mux(p)
        for p in st.encode():
            out.mux(p)
    info = probe(path)
    assert info.has_audio and not info.has_video
    recs = list(video_records(path, "a", 0, chunk_ms=250))
    assert {m for m, _, _ in recs} == {"audio"}
    chunks = [decode_event("audio", k, v) for _, k, v in recs]
    assert {(c.sr, c.ch) for c in chunks} == {(48000, 2)}  # 96 kHz clamped to the contract's 48
    total = sum(len(c.data) for c in chunks) // 4
    assert abs(total - 48000) <= 64
    assert [c.ts for c in chunks[:4]] == [0, 250_000, 500_000, 750_000]


def test_video_only_file(tmp_path):
    path = make_video(tmp_path / "silent", seconds=1.0, fps=10, audio=False)
    recs = list(video_records(path, "v", 0, fps=5))
    assert Counter(m for m, _, _ in recs) == {"image": 5}


def test_not_a_media_file_is_a_clear_error(tmp_path, capsys):
    bogus = tmp_path / "notes.mp4"
    bogus.write_text("this is not a video\n" * 50)
    with pytest.raises(MediaError, match="not a readable media file"):
        probe(bogus)
    with pytest.raises(MediaError):
        list(video_records(bogus, "x", 0))
    with pytest.raises(MediaError, match="no such file"):
        probe(tmp_path / "missing.mkv")
    # the CLI: exit 1 and one line, no traceback, before it talks to any broker
    rc = main(["produce", "--broker", "kafka://127.0.0.1:9", "--video", str(bogus)])
    err = capsys.readouterr().err
    assert rc == 1
    assert "mmsync produce:" in err and "notes.mp4" in err and "Traceback" not in err


def test_embedded_subtitle_stream(tmp_path):
    src = make_video(tmp_path / "clip", seconds=3.0)
    srt = write_srt(tmp_path / "clip.srt")
    mkv = tmp_path / "with-subs.mkv"
    # remux the clip and the .srt (PyAV reads .srt as a subtitle stream) into one mkv
    with av.open(str(src)) as inp, av.open(str(srt)) as sub, av.open(str(mkv), "w") as out:
        streams = {s.index: out.add_stream_from_template(s) for s in inp.streams}
        sub_stream = out.add_stream_from_template(sub.streams[0])
        for c, mapping in ((inp, streams), (sub, {0: sub_stream})):
            for p in c.demux():
                if p.dts is not None:
                    p.stream = mapping[p.stream.index]
                    out.mux(p)
    assert probe(mkv).subtitle_streams == 1
    texts = [decode_event(m, k, v) for m, k, v in video_records(mkv, "m", 0) if m == "text"]
    assert [(e.text, e.dur) for e in texts] == [
        ("欢迎 hello", 700_000), ("second cue", 600_000), ("third cue", 600_000)]
    assert [b.ts - a.ts for a, b in zip(texts, texts[1:], strict=False)] == [1_000_000, 900_000]
    assert [e.seq for e in texts] == [0, 1, 2]
    # a sidecar .srt replaces the embedded stream; embedded_subs=False drops it
    other = tmp_path / "other.srt"
    other.write_text("1\n00:00:01,000 --> 00:00:02,000\nonly me\n", encoding="utf-8")
    got = [m for m, _, _ in video_records(mkv, "m", 0, srt=other) if m == "text"]
    assert len(got) == 1
    assert not [m for m, _, _ in video_records(mkv, "m", 0, embedded_subs=False) if m == "text"]


def test_audio_gap_reanchors_on_pts(tmp_path):
    path = tmp_path / "gap.mkv"
    sr = 16000
    with av.open(str(path), "w") as out:
        st = out.add_stream("pcm_s16le", rate=sr)
        st.layout = "mono"
        for start_s in (0.0, 1.5):  # 0.5 s of sound, 1 s of nothing in the file, 0.5 s more
            x = np.full(sr // 2, 1000, np.int16)
            frame = av.AudioFrame.from_ndarray(x[None, :], format="s16", layout="mono")
            frame.sample_rate, frame.pts = sr, int(start_s * sr)
            for p in st.encode(frame):
                out.mux(p)
        for p in st.encode():
            out.mux(p)
    chunks = [decode_event("audio", k, v) for _, k, v in video_records(path, "g", 0)]
    assert [c.ts for c in chunks] == [0, 100_000, 200_000, 300_000, 400_000,
                                      1_500_000, 1_600_000, 1_700_000, 1_800_000, 1_900_000]
    assert all(len(c.data) == 3200 for c in chunks)
