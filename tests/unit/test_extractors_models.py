"""The real models on real small inputs made here (no broker). Models are loaded
once per module; the EfficientNet export is shared via MMSYNC_MODELS_DIR."""

from __future__ import annotations

import io

import numpy as np
import pytest
import simplejpeg
from PIL import Image, ImageDraw, ImageFont

from app.consumed import RawMsg
from app.features.audio import SR, resample
from app.features.image import EMB_DIM, average_hash, hamming
from app.features.onnx import CPU, CUDA, ModelSession
from app.features.pipeline import FeaturePipeline
from app.features.text import TermMatcher, _tokens, tokens
from app.settings import Settings
from schemas.codec import unpack_array
from schemas.dead_letter import DeadLetter
from schemas.events import AudioChunk, FrameEvent, TextEvent, encode_event
from schemas.features import FeatureRecord


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    p = FeaturePipeline(Settings(data_dir=tmp_path_factory.mktemp("data"), device="auto"))
    for m in ("image", "audio", "text"):
        p.warm(m)
    return p


def _jpeg(arr: np.ndarray) -> bytes:
    return simplejpeg.encode_jpeg(np.ascontiguousarray(arr), quality=90)


def _chart(seed: int = 0, text: str = "") -> np.ndarray:
    """A drawn bar chart (a safe, structured image), 640x360."""
    rng = np.random.default_rng(seed)
    img = Image.new("RGB", (640, 360), "white")
    d = ImageDraw.Draw(img)
    for i in range(8):
        h = int(rng.integers(40, 300))
        d.rectangle([40 + i * 70, 340 - h, 90 + i * 70, 340],
                    fill=tuple(int(c) for c in rng.integers(0, 255, 3)))
    if text:
        d.text((40, 20), text, fill="black", font=ImageFont.load_default(size=48))
    return np.asarray(img)


def _frame(arr: np.ndarray, stream: str = "s", ts: int = 0) -> FrameEvent:
    return FrameEvent(stream_id=stream, ts=ts, data=_jpeg(arr), fmt="jpeg")


def _emb(feats: dict) -> np.ndarray:
    return unpack_array(feats["emb"]).astype(np.float32)


def _raw(ev, offset: int = 0, value: bytes | None = None) -> RawMsg:
    return RawMsg(topic="t", partition=0, offset=offset, key=ev.stream_id.encode(),
                  value=encode_event(ev) if value is None else value, timestamp_ms=0)


# -- runtime -----------------------------------------------------------------

def test_sessions_run_on_the_cpu_here(pipe):
    im = pipe.extractor("image")
    for ms in (im.effnet, im.nsfw):
        assert ms.provider == CPU and ms.sess.get_providers()[0] == CPU and not ms.fp16


class _FakeSession:
    """Fails like CUDA does when a batch exceeds ``fits``; doubles its input."""

    def __init__(self, fits: int, message: str = "CUDA failure 2: out of memory") -> None:
        self.fits, self.message, self.calls = fits, message, []

    def get_providers(self):
        return [CUDA, CPU]

    def run(self, names, feeds):
        x = feeds["x"]
        self.calls.append(len(x))
        if len(x) > self.fits:
            raise RuntimeError(self.message)
        return [x * 2]


class _CpuSession(_FakeSession):
    def get_providers(self):
        return [CPU]


def test_oom_halves_the_batch_and_pads_on_gpu():
    fake = _FakeSession(fits=3)
    ms = ModelSession("fake", fake, "x", cpu_factory=lambda: _CpuSession(10**9))
    x = np.arange(5, dtype=np.float32)[:, None]
    assert np.array_equal(ms.run(x)[0], x * 2)
    assert fake.calls[0] == 8  # padded to a multiple of 8 on the GPU
    assert ms.oom_splits >= 1 and ms.cpu_fallbacks == 0


def test_oom_on_one_item_falls_back_to_cpu_and_other_errors_propagate():
    ms = ModelSession("fake", _FakeSession(fits=0), "x", cpu_factory=lambda: _CpuSession(10**9))
    x = np.ones((3, 2), np.float32)
    assert np.array_equal(ms.run(x)[0], x * 2)
    assert ms.cpu_fallbacks == 3
    bad = ModelSession("bad", _FakeSession(fits=0, message="shape mismatch"), "x")
    with pytest.raises(RuntimeError, match="shape mismatch"):
        bad.run(x)


# -- image -------------------------------------------------------------------

def test_image_features_safe_distinct_deterministic(pipe):
    im = pipe.extractor("image")
    flat = np.full((360, 640, 3), (40, 120, 200), np.uint8)
    a, b, a2, f = im.run([_frame(_chart(0), "a"), _frame(_chart(1), "b"),
                          _frame(_chart(0), "c"), _frame(flat, "d")])
    for feats in (a, b, f):
        assert 0.0 <= feats["nsfw"] < 0.2
        e = _emb(feats)
        assert e.shape == (EMB_DIM,) and abs(np.linalg.norm(e) - 1) < 1e-2
        assert isinstance(feats["phash"], int) and {"luma", "change"} <= feats.keys()
    assert np.array_equal(_emb(a), _emb(a2))  # same image, other stream: same features
    assert float(_emb(a) @ _emb(b)) < 0.98 and float(_emb(a) @ _emb(f)) < 0.9


def test_near_duplicate_frame_reuses_features(pipe):
    im = pipe.extractor("image")
    base = _chart(3)
    noisy = np.clip(base.astype(int) + np.random.default_rng(0).integers(-3, 4, base.shape),
                    0, 255).astype(np.uint8)
    first, dup, other = im.run([_frame(base, "dup", 0), _frame(noisy, "dup", 1),
                                _frame(_chart(4), "dup", 2)])
    assert "reused" not in first and dup["reused"] is True and "reused" not in other
    assert dup["emb"] == first["emb"] and dup["nsfw"] == first["nsfw"]
    assert hamming(dup["phash"], first["phash"]) <= 3
    # two flat frames share a hash but not a colour: not duplicates
    red, blue = (np.full((360, 640, 3), c, np.uint8) for c in ((200, 0, 0), (0, 0, 200)))
    r, b = im.run([_frame(red, "flat", 0), _frame(blue, "flat", 1)])
    assert "reused" not in b


def test_batch_equals_singles(pipe):
    im = pipe.extractor("image")
    rgbs = [np.asarray(Image.fromarray(_chart(i)).resize((256, 256))) for i in range(4)]
    emb_b, nsfw_b = im.embed_nsfw(rgbs)
    for i, rgb in enumerate(rgbs):
        emb_1, nsfw_1 = im.embed_nsfw([rgb])
        assert np.allclose(emb_b[i], emb_1[0], atol=1e-4)
        assert abs(nsfw_b[i] - nsfw_1[0]) < 1e-4


def test_average_hash_bits():
    t = np.zeros((16, 16), np.float32)
    t[:, 8:] = 1.0
    h = average_hash(t)
    assert h.bit_count() == 32 and hamming(h, average_hash(1 - t)) == 64


def test_sampled_ocr_reads_text(tmp_path):
    p = FeaturePipeline(Settings(data_dir=tmp_path, ocr_every_n_frames=2))
    img = _chart(5, text="HELLO 2024")
    out = p.extractor("image").run([_frame(img, "o", i) for i in range(3)])
    assert "HELLO" in out[0]["ocr"]
    assert out[1].get("reused") is True and "HELLO" in out[1]["ocr"]  # a duplicate copies it


# -- audio -------------------------------------------------------------------

def _resonator(x: np.ndarray, f: float, bw: float, sr: int) -> np.ndarray:
    r = np.exp(-np.pi * bw / sr)
    a1, a2 = -2 * r * np.cos(2 * np.pi * f / sr), r * r
    y = np.zeros_like(x)
    y1 = y2 = 0.0
    for i, v in enumerate(x):
        y0 = v - a1 * y1 - a2 * y2
        y[i], y2, y1 = y0, y1, y0
    return y


def _speechlike(sr: int = SR, secs: float = 2.0) -> np.ndarray:
    """Voiced syllables at 4 Hz: a glottal pulse train with a wandering pitch
    through three formant resonators, vowel changing per syllable."""
    n = int(sr * secs)
    t = np.arange(n) / sr
    phase = np.cumsum((130 + 25 * np.sin(2 * np.pi * 0.7 * t)) / sr)
    src = (np.diff(np.floor(phase), prepend=0) > 0).astype(float)
    vowels = [(730, 1090, 2440), (270, 2290, 3010), (300, 870, 2240), (530, 1840, 2480)]
    syl = sr // 4
    out = np.zeros(n)
    for k in range(0, n, syl):
        seg = src[k:k + syl]
        y = sum(_resonator(seg, f, 80 + 40 * j, sr) / (j + 1)
                for j, f in enumerate(vowels[(k // syl) % 4]))
        out[k:k + syl] = y * np.sin(np.pi * np.arange(len(seg)) / syl) ** 0.7
    return (0.5 * out / np.abs(out).max()).astype(np.float32)


def _chunk(x: np.ndarray, sr: int, ch: int = 1, stream: str = "a", ts: int = 0) -> AudioChunk:
    pcm = (np.repeat(x[:, None], ch, axis=1) * 32767).astype("<i2")
    return AudioChunk(stream_id=stream, ts=ts, data=pcm.tobytes(), sr=sr, ch=ch)


@pytest.mark.parametrize("sr", [8000, 44100, 48000])
def test_resampling_keeps_duration(sr):
    x = np.sin(2 * np.pi * 440 * np.arange(sr) / sr).astype(np.float32)  # 1 s
    y = resample(x, sr)
    assert abs(len(y) - SR) <= 2 and abs(np.sqrt(np.mean(y[100:-100] ** 2)) - 0.707) < 0.02


def test_speech_scores_above_silence_and_noise(pipe):
    au = pipe.extractor("audio")
    speech = _speechlike()
    noise = (0.3 * np.random.default_rng(1).standard_normal(len(speech))).astype(np.float32)
    sp, si, no = (unpack_array(f["speech"]) for f in au.run(
        [_chunk(speech, SR, stream="sp"), _chunk(np.zeros_like(speech), SR, stream="si"),
         _chunk(noise, SR, stream="no")]))
    assert sp.mean() > 0.3 and sp.max() > 0.9
    assert si.max() < 0.1 and no.mean() < 0.1


def test_audio_keys_shapes_and_streaming_state(pipe):
    au = pipe.extractor("audio")
    sr = 48000
    speech = resample(_speechlike(), 16000)  # stays 16 kHz content
    up = np.repeat(speech, 3)  # crude 48 kHz
    chunks = [_chunk(up[i:i + sr // 10], sr, ch=2, stream="st", ts=i * 1_000_000 // sr)
              for i in range(0, len(up), sr // 10)]
    feats = au.run(chunks)
    for f in feats:
        rms, speech_p, mel = (unpack_array(f[k]) for k in ("rms", "speech", "mel"))
        assert f["hop_us"] == 50_000 and rms.shape == speech_p.shape == (2,)
        assert speech_p.dtype == np.float32 and mel.shape == (2, 64) and mel.dtype == np.float16
    probs = np.concatenate([unpack_array(f["speech"]) for f in feats])
    assert probs.mean() > 0.3  # the VAD state carries across 100 ms chunks


# -- text --------------------------------------------------------------------

def test_terms_tokens_and_embeddings(pipe):
    tx = pipe.extractor("text")
    zh1, zh2, zh3, en1, en2 = tx.run([
        TextEvent(stream_id="t", ts=0, text="警方破获一起电信诈骗案"),
        TextEvent(stream_id="t", ts=1, text="警察侦破了一个电话诈骗团伙"),
        TextEvent(stream_id="t", ts=2, text="今天天气很好，我们去公园散步"),
        TextEvent(stream_id="t", ts=3, text="This is a SCAM, do not send money"),
        TextEvent(stream_id="t", ts=4, text="A new method for cooking rice"),
    ])
    assert "诈骗" in zh1["terms"] and "电信诈骗" in zh1["terms"] and zh3["terms"] == []
    assert en1["terms"] == ["scam"] and en2["terms"] == []  # "meth" is not in "method"
    assert {"我们", "公园", "散步"} <= set(zh3["tokens"])
    assert en1["tokens"][:3] == ["this", "is", "a"]
    e = {k: _emb(v) for k, v in dict(zh1=zh1, zh2=zh2, zh3=zh3, en1=en1).items()}
    assert all(v.shape == (384,) for v in e.values())
    assert e["zh1"] @ e["zh2"] > e["zh1"] @ e["zh3"]


def test_segmentation_is_memoised():
    text = "我们明天再看看这个新产品吧"
    tokens(text)
    hits = _tokens.cache_info().hits
    assert tokens(text) == tokens(text) and _tokens.cache_info().hits == hits + 2


def test_extra_term_file(tmp_path):
    f = tmp_path / "extra.txt"
    f.write_text("# ours\nblue whale\n", "utf-8")
    m = TermMatcher.from_files([f])
    assert m("the Blue Whale game") == ["blue whale"] and "scam" in m.terms


# -- the pipeline ------------------------------------------------------------

def test_process_batch_keeps_order_and_dead_letters(pipe):
    good = _frame(_chart(7), "p")
    bad = FrameEvent(stream_id="p", ts=1, data=_jpeg(_chart(8))[:200], fmt="jpeg")
    out = pipe.process("image", [_raw(good, 0), _raw(bad, 1), _raw(good, 2, b"\xc1")])
    assert isinstance(out[0], FeatureRecord) and "emb" in out[0].feats
    assert isinstance(out[1], DeadLetter) and out[1].error == "bad_image"
    assert isinstance(out[2], DeadLetter) and out[2].offset == 2


def test_light_profile_has_no_models(tmp_path):
    p = FeaturePipeline(Settings(data_dir=tmp_path, models="light"))
    rec = p.process("text", [_raw(TextEvent(stream_id="l", ts=0, text="hello"))])[0]
    assert isinstance(rec, FeatureRecord) and rec.feats == {"tokens": ["hello"], "caption": 1.0}


def test_settings_reject_missing_terms_file(tmp_path):
    with pytest.raises(ValueError, match="terms_files"):
        Settings(data_dir=tmp_path, terms_files=str(tmp_path / "nope.txt"))


def test_png_frames(pipe):
    buf = io.BytesIO()
    Image.fromarray(_chart(9)).save(buf, format="PNG")
    f = pipe.extractor("image").run([FrameEvent(stream_id="png", ts=0, data=buf.getvalue(),
                                                fmt="png")])[0]
    assert _emb(f).shape == (EMB_DIM,)
