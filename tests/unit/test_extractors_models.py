"""The real models on real small inputs made here (no broker). Models are loaded
once per module; the EfficientNet export is shared via MMSYNC_MODELS_DIR."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from app.features.audio import SR, resample
from app.features.image import EMB_DIM, average_hash, hamming
from app.features.onnx import CPU, CUDA, ModelSession
from app.features.pipeline import FeaturePipeline
from app.features.text import TermMatcher, _tokens, tokens
from app.settings import Settings
from schemas.codec import unpack_array
from schemas.dead_letter import DeadLetter
from schemas.events import FrameEvent, TextEvent
from schemas.features import FeatureRecord
from tests.helpers import audio_chunk, chart, frame_event, jpeg_of, raw_msg, speechlike


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    p = FeaturePipeline(Settings(data_dir=tmp_path_factory.mktemp("data"), device="auto"))
    for m in ("image", "audio", "text"):
        p.warm(m)
    return p


def _emb(feats: dict) -> np.ndarray:
    return unpack_array(feats["emb"]).astype(np.float32)


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
    a, b, a2, f = im.run([frame_event(chart(0), "a"), frame_event(chart(1), "b"),
                          frame_event(chart(0), "c"), frame_event(flat, "d")])
    for feats in (a, b, f):
        assert 0.0 <= feats["nsfw"] < 0.2
        e = _emb(feats)
        assert e.shape == (EMB_DIM,) and abs(np.linalg.norm(e) - 1) < 1e-2
        assert isinstance(feats["phash"], int) and {"luma", "change"} <= feats.keys()
    assert np.array_equal(_emb(a), _emb(a2))  # same image, other stream: same features
    assert float(_emb(a) @ _emb(b)) < 0.98 and float(_emb(a) @ _emb(f)) < 0.9


def test_near_duplicate_frame_reuses_features(pipe):
    im = pipe.extractor("image")
    base = chart(3)
    noisy = np.clip(base.astype(int) + np.random.default_rng(0).integers(-3, 4, base.shape),
                    0, 255).astype(np.uint8)
    first, dup, other = im.run([frame_event(base, "dup", 0), frame_event(noisy, "dup", 1),
                                frame_event(chart(4), "dup", 2)])
    assert "reused" not in first and dup["reused"] is True and "reused" not in other
    assert dup["emb"] == first["emb"] and dup["nsfw"] == first["nsfw"]
    assert hamming(dup["phash"], first["phash"]) <= 3
    # two flat frames share a hash but not a colour: not duplicates
    red, blue = (np.full((360, 640, 3), c, np.uint8) for c in ((200, 0, 0), (0, 0, 200)))
    r, b = im.run([frame_event(red, "flat", 0), frame_event(blue, "flat", 1)])
    assert "reused" not in b


def test_batch_equals_singles(pipe):
    im = pipe.extractor("image")
    rgbs = [np.asarray(Image.fromarray(chart(i)).resize((256, 256))) for i in range(4)]
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
    img = chart(5, text="HELLO 2024")
    out = p.extractor("image").run([frame_event(img, "o", i) for i in range(3)])
    assert "HELLO" in out[0]["ocr"]
    assert out[1].get("reused") is True and "HELLO" in out[1]["ocr"]  # a duplicate copies it


# -- audio -------------------------------------------------------------------

@pytest.mark.parametrize("sr", [8000, 44100, 48000])
def test_resampling_keeps_duration(sr):
    x = np.sin(2 * np.pi * 440 * np.arange(sr) / sr).astype(np.float32)  # 1 s
    y = resample(x, sr)
    assert abs(len(y) - SR) <= 2 and abs(np.sqrt(np.mean(y[100:-100] ** 2)) - 0.707) < 0.02


def test_speech_scores_above_silence_and_noise(pipe):
    au = pipe.extractor("audio")
    speech = speechlike()
    noise = (0.3 * np.random.default_rng(1).standard_normal(len(speech))).astype(np.float32)
    sp, si, no = (unpack_array(f["speech"]) for f in au.run(
        [audio_chunk(speech, SR, stream="sp"), audio_chunk(np.zeros_like(speech), SR, stream="si"),
         audio_chunk(noise, SR, stream="no")]))
    assert sp.mean() > 0.3 and sp.max() > 0.9
    assert si.max() < 0.1 and no.mean() < 0.1


def test_audio_keys_shapes_and_streaming_state(pipe):
    au = pipe.extractor("audio")
    sr = 48000
    speech = resample(speechlike(), 16000)  # stays 16 kHz content
    up = np.repeat(speech, 3)  # crude 48 kHz
    chunks = [audio_chunk(up[i:i + sr // 10], sr, ch=2, stream="st", ts=i * 1_000_000 // sr)
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
    good = frame_event(chart(7), "p")
    bad = FrameEvent(stream_id="p", ts=1, data=jpeg_of(chart(8))[:200], fmt="jpeg")
    out = pipe.process("image", [raw_msg(good, 0), raw_msg(bad, 1), raw_msg(good, 2, b"\xc1")])
    assert isinstance(out[0], FeatureRecord) and "emb" in out[0].feats
    assert isinstance(out[1], DeadLetter) and out[1].error == "bad_image"
    assert isinstance(out[2], DeadLetter) and out[2].offset == 2


def test_light_profile_has_no_models(tmp_path):
    p = FeaturePipeline(Settings(data_dir=tmp_path, models="light"))
    rec = p.process("text", [raw_msg(TextEvent(stream_id="l", ts=0, text="hello"))])[0]
    assert isinstance(rec, FeatureRecord) and rec.feats == {"tokens": ["hello"], "caption": 1.0}


def test_settings_reject_missing_terms_file(tmp_path):
    with pytest.raises(ValueError, match="terms_files"):
        Settings(data_dir=tmp_path, terms_files=str(tmp_path / "nope.txt"))


def test_png_frames(pipe):
    buf = io.BytesIO()
    Image.fromarray(chart(9)).save(buf, format="PNG")
    f = pipe.extractor("image").run([FrameEvent(stream_id="png", ts=0, data=buf.getvalue(),
                                                fmt="png")])[0]
    assert _emb(f).shape == (EMB_DIM,)
