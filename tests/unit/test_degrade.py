"""Degradation levels: the controller's hysteresis and what each level skips."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from app.features.degrade import LEVELS, Degrader
from app.features.pipeline import FeaturePipeline
from app.settings import Settings
from schemas.events import TextEvent
from tests.helpers import chart, frame_event, raw_msg


def test_level_rises_one_step_per_hold_and_falls_one_per_calm_period():
    d = Degrader(lag_s=1.0, hold_s=2.0, calm_s=3.0)
    assert d.observe(0.05, 0.0) == 0
    assert d.observe(1.5, 1.0) == 1
    assert d.observe(1.5, 2.0) == 1  # held: at most one rise per 2 s
    assert d.observe(1.5, 3.0) == 2
    assert d.observe(1.5, 5.0) == 3
    assert d.observe(9.0, 9.0) == 3  # the top level
    assert d.observe(0.6, 11.9) == 3  # under the bound, but not 3 s since the last over
    assert d.observe(0.6, 12.0) == 2
    assert d.observe(0.1, 14.9) == 2 and d.observe(0.1, 15.0) == 1
    assert d.observe(2.0, 15.5) == 2  # load is back: up at once (the hold has passed)
    # no batches at all: the level still comes down, one step per calm period
    assert d.at(18.4) == 2 and d.at(18.5) == 1 and d.at(30.0) == 0
    assert Degrader(enabled=False).observe(100.0, 0.0) == 0


@pytest.mark.parametrize(("delay_s", "level"), [(1.5, 1), (2.5, 2), (4.0, 2), (4.5, 2),
                                                (30.0, 2)])
def test_a_backlog_several_times_the_bound_jumps_to_the_level_it_calls_for(delay_s, level):
    # the image models' share at levels 0..3 is 1, 1/2, 1/4, 0: a delay of k times the
    # bound calls for at most 1/k of the work at once, not one step per hold period; but
    # one batch never turns the models off (a burst after a cold start scored nothing,
    # and test_media's NSFW scores were gone): level 3 only by a further rise
    d = Degrader(lag_s=1.0, hold_s=2.0, calm_s=3.0)
    assert d.observe(delay_s, 1.0) == level
    assert d.observe(30.0, 2.0) == level  # still held for hold_s after that rise
    assert d.observe(30.0, 3.0) == level + 1  # still over once the hold has passed


class _Clock:
    """A monotonic clock the test moves by hand (s)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def clock():
    return _Clock()


@pytest.fixture(scope="module")
def pipe(tmp_path_factory, clock):
    p = FeaturePipeline(Settings(data_dir=tmp_path_factory.mktemp("deg"), device="cpu",
                                 cache=False), monotonic=clock)
    p.warm("image")
    p.warm("text")
    return p


def test_levels_sample_image_models_and_drop_text_embedding(pipe, monkeypatch):
    im, tx = pipe.extractor("image"), pipe.extractor("text")
    ran: list[int] = []
    real = im.embed_nsfw
    monkeypatch.setattr(im, "embed_nsfw",
                        lambda rgbs, *a: (ran.append(len(rgbs)), real(rgbs, *a))[1])
    frames = [frame_event(chart(20 + i), "lv", i) for i in range(8)]
    im.set_level(LEVELS[1])
    out = im.run(frames)
    assert ran == [4]  # every 2nd new frame
    assert [bool(f.get("held")) for f in out] == [False, True] * 4
    for a, b in zip(out[::2], out[1::2], strict=True):
        assert b["nsfw"] == a["nsfw"] and b["change"] > 0  # light signals stay per frame
    im.set_level(LEVELS[3])
    ran.clear()
    out = im.run([frame_event(chart(40 + i), "lv3", i) for i in range(3)])
    assert ran == [] and all(f["held"] and "nsfw" not in f and "luma" in f for f in out)
    im.set_level(LEVELS[0])
    tx.set_level(LEVELS[2])
    (f,) = tx.run([TextEvent(stream_id="t", ts=0, text="degraded caption")])
    assert "emb" not in f and f["tokens"]
    tx.set_level(LEVELS[0])
    (f,) = tx.run([TextEvent(stream_id="t", ts=0, text="degraded caption")])
    assert "emb" in f


def test_pipeline_degrades_on_old_records_and_recovers(pipe, clock):
    pipe.degrader = Degrader(lag_s=1.0, hold_s=0.0, calm_s=0.5)
    old = int(time.time() * 1000) - 1_500  # sent 1.5 s ago: one step per batch
    evs = [frame_event(chart(60 + i), "old", i) for i in range(3)]
    for _ in range(2):
        pipe.process("image", [replace(raw_msg(e, i), timestamp_ms=old) for i, e in enumerate(evs)])
    assert pipe.degrader.level == 2 and pipe.extractor("image").level == LEVELS[2]
    clock.t += 1.05  # two calm periods
    now = int(time.time() * 1000)
    for _ in range(2):
        pipe.process("image", [replace(raw_msg(e, i), timestamp_ms=now) for i, e in enumerate(evs)])
    assert pipe.degrader.level == 0 and pipe.extractor("image").level == LEVELS[0]


def test_a_near_duplicate_of_an_unscored_frame_is_scored_once_the_models_are_back(pipe):
    im = pipe.extractor("image")
    picture = chart(90)
    im.set_level(LEVELS[3])  # models off: the frame is held without scores
    (off,) = im.run([frame_event(picture, "back", 0)])
    assert off["held"] and "nsfw" not in off
    im.set_level(LEVELS[0])
    (on,) = im.run([frame_event(picture, "back", 40_000)])  # the same picture again
    assert "nsfw" in on and not on.get("reused")
    (again,) = im.run([frame_event(picture, "back", 80_000)])  # now it may reuse that one
    assert again.get("reused") and again["nsfw"] == on["nsfw"]


def test_a_frame_batch_behind_runs_nsfw_only_and_embeds_again_once_caught_up(pipe):
    """Issue 26: a frame batch more than MMSYNC_DEGRADE_EMBED_LAG_MS (200 ms) behind skips
    EfficientNet (every frame still scored: no blind frame), decided per batch."""
    pipe.degrader = Degrader(lag_s=10.0)  # the levels stay at 0: only the embedding rule
    sent = int(time.time() * 1000) - 400  # 400 ms ago
    behind = [replace(raw_msg(frame_event(chart(140 + i), "emb", i * 200_000), i),
                      timestamp_ms=sent) for i in range(3)]
    out = pipe.process("image", behind)
    assert all("nsfw" in r.feats and "emb" not in r.feats for r in out)
    assert pipe.degrader.level == 0
    # caught up: embeddings again, also for a near-duplicate of a frame scored without one
    now = int(time.time() * 1000)
    (dup,) = pipe.process("image", [replace(raw_msg(
        frame_event(chart(142), "emb", 3 * 200_000), 3), timestamp_ms=now)])
    assert "emb" in dup.feats and not dup.feats.get("reused")
    (r,) = pipe.process("image", [replace(raw_msg(
        frame_event(chart(150), "emb", 4 * 200_000), 4), timestamp_ms=now)])
    assert "emb" in r.feats


def test_the_embedding_rule_reads_when_the_batchs_alerts_would_come(pipe):
    """A frame batch whose records waited under MMSYNC_DEGRADE_EMBED_LAG_MS (200 ms) still
    skips EfficientNet when its time to its scores (ImageExtractor.score_s per frame, measured
    on batches that embedded) would bring its alerts past it."""
    pipe.degrader = Degrader(lag_s=10.0)  # the levels stay at 0: only the embedding rule
    im = pipe.extractor("image")
    im.score_s = 0.0
    lag_s = pipe.settings.degrade_embed_lag_ms / 1000

    def batch(first: int) -> list:
        sent = int((time.time() - lag_s / 2) * 1000)  # half the bound ago
        return [replace(raw_msg(frame_event(chart(first + i), "soon", (first + i) * 200_000),
                                first + i), timestamp_ms=sent) for i in range(2)]

    out = pipe.process("image", batch(300))  # no time to scores measured yet: the wait alone
    assert all("emb" in r.feats for r in out)
    assert im.score_s > 0  # measured on that batch
    im.score_s = 0.4 * lag_s  # 2 frames: their alerts at 1.3x the bound
    before = im.unembedded
    out = pipe.process("image", batch(310))
    assert all("nsfw" in r.feats and "emb" not in r.feats for r in out)
    assert im.unembedded == before + 2  # counted (mmsync_image_unembedded_total)
    assert im.score_s == 0.4 * lag_s  # a batch without the embedding is not measured
    im.score_s = 0.1 * lag_s  # 0.7x the bound
    out = pipe.process("image", batch(320))
    assert all("emb" in r.feats for r in out)


def test_a_backlog_behind_the_batch_degrades_before_its_records_are_old(pipe):
    """The records waiting after a batch, at the recent seconds per record, are the delay
    the batch after them will see: a burst is shed when it arrives, not 1 s later."""
    pipe.degrader = Degrader(lag_s=1.0, hold_s=0.0, calm_s=30.0)
    now = int(time.time() * 1000)
    frames = [replace(raw_msg(frame_event(chart(160 + i), "burst", i * 200_000), i),
                      timestamp_ms=now) for i in range(2)]
    out = pipe.process("image", frames)  # nothing behind: as before
    assert all("emb" in r.feats for r in out) and pipe.degrader.level == 0
    out = pipe.process("image", [replace(raw_msg(
        frame_event(chart(170), "burst", 400_000), 2), timestamp_ms=now)], behind=10_000)
    # 10,000 records at the measured seconds per record: far over the 1 s bound at once
    assert pipe.degrader.level >= 1
    # sampled out (held) or scored without EfficientNet (the batch is behind)
    assert all(r.feats.get("held") or ("nsfw" in r.feats and "emb" not in r.feats)
               for r in out)
    pipe.degrader = Degrader(lag_s=10.0)  # embeddings only: 0.4 s predicted, level 0 stays
    pipe._record_s["image"] = 0.01
    out = pipe.process("image", [replace(raw_msg(
        frame_event(chart(180), "burst", 600_000), 3), timestamp_ms=now)], behind=40)
    assert all("nsfw" in r.feats and "emb" not in r.feats for r in out)
