"""The feature cache wired into the real extractors: content-pure features come from
the cache, stream state (image change, VAD) is still computed, metrics count it."""

from __future__ import annotations

import numpy as np
import pytest

from app.cache.features import FeatureMemo, open_worker_cache
from app.features.pipeline import FeaturePipeline
from app.runtime.faust_app import Runtime
from app.runtime.metrics import Metrics
from app.runtime.offsets import GroupOffsets
from app.settings import Settings
from schemas.codec import unpack_array
from schemas.events import TextEvent
from tests.helpers import audio_chunk, chart, frame_event, raw_msg, speechlike


def _requests(m: Metrics, modality: str, result: str) -> float:
    return m.cache_requests.labels(modality, result)._value.get()


@pytest.fixture
def cached(tmp_path):
    """A pipeline with its cache, and a second one without, on the same models."""
    s = Settings(data_dir=tmp_path / "data", device="cpu")
    m = Metrics()
    memo = FeatureMemo(open_worker_cache(s, m))
    p = FeaturePipeline(s, memo)
    yield p, m, memo
    memo.close()


def test_repeated_frame_skips_the_models_keeps_change(cached, monkeypatch):
    p, m, _ = cached
    im = p.extractor("image")
    a, b = chart(10), chart(11)
    first = im.run([frame_event(a, "s1", 0), frame_event(b, "s1", 1)])
    calls: list[int] = []
    real = im.embed_nsfw

    def spy(rgbs, *a):
        calls.append(len(rgbs))
        return real(rgbs, *a)

    monkeypatch.setattr(im, "embed_nsfw", spy)
    # The same two pictures on another stream: both from the cache, no model call.
    again = im.run([frame_event(a, "s2", 0), frame_event(b, "s2", 1)])
    assert calls == []
    assert _requests(m, "image", "hit") == 2 and _requests(m, "image", "miss") == 2
    for f0, f1 in zip(first, again, strict=True):
        assert f1["emb"] == f0["emb"] and f1["nsfw"] == f0["nsfw"]
        assert "reused" not in f1
    # change is stream state: 0 for each stream's first frame, the same jump for the second
    assert first[0]["change"] == again[0]["change"] == 0.0
    assert again[1]["change"] == pytest.approx(first[1]["change"]) and again[1]["change"] > 0
    # a new picture still runs the model, once
    im.run([frame_event(chart(12), "s2", 2)])
    assert calls == [1]


def test_same_picture_twice_in_a_batch_runs_the_models_once(cached, monkeypatch):
    p, _, _ = cached
    im = p.extractor("image")
    calls: list[int] = []
    real = im.embed_nsfw
    monkeypatch.setattr(im, "embed_nsfw",
                        lambda rgbs, *a: (calls.append(len(rgbs)), real(rgbs, *a))[1])
    a, b = im.run([frame_event(chart(13), "t1", 0), frame_event(chart(13), "t2", 0)])
    assert calls == [1] and a["emb"] == b["emb"] and a["nsfw"] == b["nsfw"]


def test_text_features_come_whole_from_the_cache(cached):
    p, m, memo = cached
    tx = p.extractor("text")
    evs = [TextEvent(stream_id="t", ts=i, text=t) for i, t in
           enumerate(["今天天气很好, buy drugs here", "hello world"])]
    first = tx.run(evs)
    again = tx.run(evs)
    assert again == first and any("drugs" in t for t in first[0]["terms"]) and "emb" in first[0]
    assert _requests(m, "text", "hit") == 2
    # another term list is another version: no stale matches
    assert tx.version != type(tx)(type(tx.matcher)(["other"]), True).version


def test_audio_mel_cached_speech_still_streams(cached):
    p, m, _ = cached
    au = p.extractor("audio")
    x = speechlike(secs=1.0)
    chunks = [audio_chunk(x[i:i + 1600], 16000, stream="a1", ts=i * 62)
              for i in range(0, 16000, 1600)]
    first = au.run(chunks)
    again = au.run([audio_chunk(x[i:i + 1600], 16000, stream="a2", ts=i * 62)
                    for i in range(0, 16000, 1600)])
    assert _requests(m, "audio", "hit") == len(chunks)
    for f0, f1 in zip(first, again, strict=True):
        assert f1["mel"] == f0["mel"]
        # VAD ran again on the new stream from a fresh state: same input, same output
        assert np.allclose(unpack_array(f1["speech"]), unpack_array(f0["speech"]))


def test_undecodable_payload_is_a_miss_and_recomputed(cached):
    p, m, memo = cached
    tx = p.extractor("text")
    ev = TextEvent(stream_id="t", ts=0, text="cached once")
    key = memo.key("text", ev.text.encode(), tx.version)
    memo.cache.put("text", key, b"\xc1 not msgpack")
    (f,) = tx.run([ev])
    assert f["caption"] == 1.0 and memo.get("text", key) == f


def test_cache_survives_a_restart_and_stages_count_it(tmp_path):
    s = Settings(data_dir=tmp_path / "data", device="cpu")
    ev = TextEvent(stream_id="t", ts=0, text="persisted caption")
    for run in range(2):
        m = Metrics()
        memo = FeatureMemo(open_worker_cache(s, m))
        p = FeaturePipeline(s, memo)
        (rec,) = p.process("text", [raw_msg(ev)])
        assert _requests(m, "text", "hit" if run else "miss") == 1
        assert rec.stages["cache"] >= 0 and set(rec.stages) == {"queue", "decode", "model", "cache"}
        memo.close()


def test_workers_sharing_a_data_dir_take_separate_slots(tmp_path):
    s = Settings(data_dir=tmp_path / "data")
    caches = [open_worker_cache(s) for _ in range(3)]
    try:
        assert len({str(c._db.path()) for c in caches}) == 3
    finally:
        for c in caches:
            c.close()
    again = open_worker_cache(s)  # all free again: the first slot
    assert again._db.path().endswith("cache")
    again.close()


def test_light_profile_and_switch_off_use_no_cache(tmp_path):
    s = Settings(data_dir=tmp_path / "d", models="light")
    memo = FeatureMemo(open_worker_cache(s))
    assert FeaturePipeline(s, memo).cache is None
    memo.close()
    for kw in ({"models": "light"}, {"cache": False}):
        se = Settings(data_dir=tmp_path / "e", **kw)
        rt = Runtime(settings=se, app=None, topics={}, metrics=Metrics(),
                     offsets=GroupOffsets(se, "g"))
        assert rt.feature_memo() is None
    se = Settings(data_dir=tmp_path / "e")
    rt = Runtime(settings=se, app=None, topics={}, metrics=Metrics(),
                 offsets=GroupOffsets(se, "g"))
    memo = rt.feature_memo()
    assert memo is not None and rt.feature_memo() is memo  # one per worker
    memo.close()
