import msgpack
import numpy as np
import pytest

from app.errors import InvalidInputError
from schemas.aligned import AlignedWindow, window_id
from schemas.codec import decode_map, encode, pack_array, unpack_array
from schemas.dead_letter import DeadLetter
from schemas.events import (
    AudioChunk,
    FrameEvent,
    Limits,
    TextEvent,
    decode_event,
    encode_event,
    sniff_image,
)
from schemas.features import FeatureRecord
from tests.helpers import jpeg_bytes, png_bytes

NOW = 2_000_000_000_000_000


def _dec(modality, d, key=b"s1", limits=None):
    return decode_event(modality, key, msgpack.packb(d, use_bin_type=True), limits, now_us=NOW)


def test_round_trip_every_event():
    evs = [
        TextEvent(stream_id="s1", ts=5, seq=1, trace_id="t", text="你好 world", dur=10, lang="zh"),
        FrameEvent(stream_id="s1", ts=6, data=jpeg_bytes(), fmt="jpeg"),
        FrameEvent(stream_id="s1", ts=7, seq=3, data=png_bytes(), fmt="png"),
        AudioChunk(stream_id="s1", ts=8, seq=2, data=b"\x00\x01" * 160, sr=16000, ch=1),
    ]
    for ev in evs:
        assert decode_event(ev.modality, b"s1", encode_event(ev), now_us=NOW) == ev


def test_fmt_is_sniffed_when_absent():
    ev = _dec("image", {"v": 1, "stream_id": "s1", "ts": 1, "data": png_bytes()})
    assert ev.fmt == "png"
    assert sniff_image(b"GIF89a") is None


def test_audio_duration():
    ev = AudioChunk(stream_id="s", ts=0, data=b"\0" * (2 * 2 * 16000), sr=16000, ch=2)
    assert ev.duration_us == 1_000_000


GOOD_TEXT = {"v": 1, "stream_id": "s1", "ts": 10, "text": "hi"}
GOOD_AUDIO = {"v": 1, "stream_id": "s1", "ts": 10, "data": b"\0\0" * 8, "sr": 16000}


@pytest.mark.parametrize(
    ("modality", "record", "reason"),
    [
        ("text", {**GOOD_TEXT, "v": 2}, "bad_version"),
        ("text", {k: v for k, v in GOOD_TEXT.items() if k != "v"}, "bad_version"),
        ("text", {k: v for k, v in GOOD_TEXT.items() if k != "stream_id"}, "schema"),
        ("text", {k: v for k, v in GOOD_TEXT.items() if k != "ts"}, "schema"),
        ("text", {k: v for k, v in GOOD_TEXT.items() if k != "text"}, "schema"),
        ("text", {**GOOD_TEXT, "ts": "10"}, "schema"),
        ("text", {**GOOD_TEXT, "ts": True}, "schema"),
        ("text", {**GOOD_TEXT, "ts": -1}, "bad_ts"),
        ("text", {**GOOD_TEXT, "ts": NOW + 10**13}, "bad_ts"),
        ("text", {**GOOD_TEXT, "seq": -3}, "schema"),
        ("text", {**GOOD_TEXT, "dur": -3}, "schema"),
        ("text", {**GOOD_TEXT, "text": "x" * (64 * 1024 + 1)}, "too_large"),
        ("text", {**GOOD_TEXT, "trace_id": "t" * 200}, "too_large"),
        ("text", {**GOOD_TEXT, "lang": "x" * 40}, "schema"),
        ("text", {**GOOD_TEXT, "stream_id": ""}, "schema"),
        ("text", {**GOOD_TEXT, "stream_id": "x" * 257}, "schema"),
        ("text", {**GOOD_TEXT, "stream_id": "other"}, "key_mismatch"),
        ("image", {"v": 1, "stream_id": "s1", "ts": 1, "data": b"not an image"}, "bad_image"),
        ("image", {"v": 1, "stream_id": "s1", "ts": 1, "data": "str"}, "schema"),
        ("image", {"v": 1, "stream_id": "s1", "ts": 1, "data": b"\xff\xd8\xff", "fmt": "gif"},
         "schema"),
        ("image", {"v": 1, "stream_id": "s1", "ts": 1, "data": b"\xff\xd8\xff", "fmt": "png"},
         "bad_image"),
        ("audio", {**GOOD_AUDIO, "data": b"\0" * 3}, "bad_audio"),
        ("audio", {**GOOD_AUDIO, "data": b""}, "bad_audio"),
        ("audio", {**GOOD_AUDIO, "sr": 4000}, "bad_audio"),
        ("audio", {**GOOD_AUDIO, "sr": 96000}, "bad_audio"),
        ("audio", {**GOOD_AUDIO, "ch": 9}, "bad_audio"),
        ("audio", {**GOOD_AUDIO, "ch": 2, "data": b"\0" * 6}, "bad_audio"),
        ("audio", {k: v for k, v in GOOD_AUDIO.items() if k != "sr"}, "schema"),
    ],
)
def test_every_rejection_reason(modality, record, reason):
    with pytest.raises(InvalidInputError) as ei:
        _dec(modality, record)
    assert ei.value.reason == reason
    assert ei.value.detail


def test_oversized_limits():
    lim = Limits(max_image_bytes=1000, max_audio_bytes=10)
    with pytest.raises(InvalidInputError, match="too_large"):
        _dec("image", {"v": 1, "stream_id": "s1", "ts": 1, "data": b"\xff\xd8\xff" + b"0" * 2000},
             limits=lim)
    with pytest.raises(InvalidInputError, match="too_large"):
        _dec("audio", {**GOOD_AUDIO, "data": b"\0" * 12}, limits=lim)


@pytest.mark.parametrize("raw", [b"", b"\xc1", b"\x92\x01", b"\x81\x01\x02", b"\xa3ab",
                                 msgpack.packb({"a": 1}) + b"\x00", None])
def test_bad_msgpack_and_non_maps(raw):
    with pytest.raises(InvalidInputError) as ei:
        decode_event("text", b"s1", raw)
    assert ei.value.reason in ("bad_msgpack", "schema")


def test_key_not_utf8():
    with pytest.raises(InvalidInputError, match="key_mismatch"):
        _dec("text", GOOD_TEXT, key=b"\xff\xfe")


def test_no_key_is_refused():
    with pytest.raises(InvalidInputError) as e:
        _dec("text", GOOD_TEXT, key=None)
    assert e.value.reason == "key_mismatch" and "no key" in e.value.detail


def test_array_round_trip_and_rejection():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = unpack_array(decode_map(encode({"a": pack_array(a)}))["a"])
    assert b.dtype == np.float32 and b.shape == (3, 4) and np.array_equal(a, b)
    with pytest.raises(InvalidInputError):
        unpack_array({"dtype": "float32", "shape": [5], "data": b"\0" * 4})
    with pytest.raises(InvalidInputError):
        unpack_array({"dtype": "object", "shape": [1], "data": b"\0" * 8})
    with pytest.raises(InvalidInputError):
        unpack_array({"shape": [1]})


def test_feature_record_round_trip():
    r = FeatureRecord(stream_id="s", modality="audio", ts=1, dur=2, seq=3, trace_id="t",
                      kafka_ts_ms=4, src_partition=5, src_offset=6,
                      feats={"rms": pack_array(np.ones(2, np.float32))}, stages={"decode": 0.1})
    assert FeatureRecord.decode(r.encode()) == r
    with pytest.raises(InvalidInputError):
        FeatureRecord.decode(encode({"v": 1, "stream_id": "s"}))
    with pytest.raises(InvalidInputError):
        FeatureRecord.decode(encode({"v": 9}))


def test_dead_letter_keeps_original_bytes():
    dl = DeadLetter(source_topic="mm.image", partition=3, offset=7, key=b"k", value=b"\x00\xff",
                    error="bad_msgpack", detail="x" * 5000)
    back = DeadLetter.decode(dl.encode())
    assert back.value == b"\x00\xff" and back.key == b"k" and back.error == "bad_msgpack"
    assert len(back.detail) == 1024 and back.at > 0


def test_window_id_is_deterministic():
    w = AlignedWindow(stream_id="s", window_start=10, window_end=20, rate_hz=20.0,
                      offsets_ms={}, confidence={}, counts={}, grid={}, moderation={},
                      trace_ids=[], emitted_at=1)
    assert w.id == window_id("s", 10) == "s@10"
    assert AlignedWindow.decode(w.encode())["id"] == "s@10"
