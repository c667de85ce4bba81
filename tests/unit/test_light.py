import numpy as np
import pytest

from app.errors import InvalidInputError
from app.features.light import ImageSignals, audio_signals, decode_gray_thumb, tokenize
from schemas.codec import unpack_array
from schemas.events import AudioChunk, FrameEvent
from tests.helpers import jpeg_bytes, png_bytes


def test_luma_and_change():
    sig = ImageSignals()
    dark = sig(FrameEvent(stream_id="a", ts=0, data=jpeg_bytes(20), fmt="jpeg"))
    bright = sig(FrameEvent(stream_id="a", ts=1, data=jpeg_bytes(230), fmt="jpeg"))
    same = sig(FrameEvent(stream_id="a", ts=2, data=jpeg_bytes(230), fmt="jpeg"))
    assert dark["change"] == 0.0 and dark["luma"] < 0.15
    assert bright["luma"] > 0.85 and bright["change"] > 0.7
    assert same["change"] < 0.01
    # streams do not see each other's previous frame
    assert sig(FrameEvent(stream_id="b", ts=0, data=png_bytes(), fmt="png"))["change"] == 0.0


def test_corrupt_image_is_invalid_input():
    good = jpeg_bytes()
    with pytest.raises(InvalidInputError, match="bad_image"):
        decode_gray_thumb(good[: len(good) // 3], "jpeg")
    with pytest.raises(InvalidInputError, match="bad_image"):
        decode_gray_thumb(b"\x89PNG\r\n\x1a\n" + b"\0" * 40, "png")


def test_audio_rms_per_50ms():
    sr = 16000
    t = np.arange(sr // 10) / sr  # 100 ms
    x = np.where(t < 0.05, 0.0, 0.5 * np.sin(2 * np.pi * 440 * t))
    pcm = (x * 32767).astype("<i2")
    stereo = np.repeat(pcm, 2).tobytes()
    rms = unpack_array(audio_signals(AudioChunk(stream_id="a", ts=0, data=stereo, sr=sr,
                                                ch=2))["rms"])
    assert rms.shape == (2,)
    assert rms[0] < 1e-4 and abs(rms[1] - 0.5 / np.sqrt(2)) < 0.01


def test_tokenize_chinese_and_english():
    assert tokenize("今天我们看看新产品") == ["今天", "我们", "看看", "新", "产品"]
    assert tokenize("Hello, World!") == ["hello", "world"]


def test_parse_srt_and_wav_records(tmp_path):
    import wave

    from app.clients.produce import parse_srt, wav_records
    from schemas.events import decode_event

    cues = parse_srt("1\n00:00:01,500 --> 00:00:02,000\n你好\n世界\n\n2\n00:01:00,000 --> "
                     "00:01:01,250\nbye\n")
    assert cues == [(1_500_000, 2_000_000, "你好 世界"), (60_000_000, 61_250_000, "bye")]
    p = tmp_path / "a.wav"
    with wave.open(str(p), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"\0\0" * 2 * 1200)  # 150 ms
    recs = list(wav_records(p, "s", 0, chunk_ms=100))
    evs = [decode_event("audio", k, v) for _, k, v in recs]
    assert [e.ts for e in evs] == [0, 100_000] and evs[1].duration_us == 50_000
