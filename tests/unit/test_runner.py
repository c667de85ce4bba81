"""AlignRunner: the aligner's per-worker state driven by (record, partition, offset)."""

from __future__ import annotations

from app.align.aligner import AlignerConfig
from app.align.runner import AlignRunner
from schemas.features import FeatureRecord

CFG = AlignerConfig(window_us=1_000_000, lateness_us=200_000, idle_s=2.0, rate_hz=20.0,
                    correct_skew=False)


def feat(sid: str, modality: str, ts: int, src_offset: int, kafka_ts_ms: int = 0) -> bytes:
    return FeatureRecord(stream_id=sid, modality=modality, ts=ts, dur=0, seq=None,
                         trace_id=f"{sid}-{modality}-{src_offset}", kafka_ts_ms=kafka_ts_ms,
                         src_partition=0, src_offset=src_offset,
                         feats={"luma": 0.5, "change": 0.1}).encode()


def runner(now: float = 100.0) -> AlignRunner:
    return AlignRunner(CFG, "it.features", clock=lambda: now)


def test_acks_follow_placement_in_offset_order_across_streams():
    r = runner()
    # partition 0: stream a's frame at offset 0, then stream b's three modalities twice
    assert r.on_record(0, 0, b"a", feat("a", "image", 100_000, 0), 0.0).acks == {}
    off = 1
    for ts in (100_000, 2_000_000):
        for m in ("image", "audio", "text"):
            step = r.on_record(0, off, b"b", feat("b", m, ts, off), 0.0)
            off += 1
    # b's watermark (2.0 s - lateness) closed b@0 (offsets 1-3), but a@0 (offset 0) is open
    assert [w.id for w in step.windows] == ["b@0"] and step.acks == {}
    assert r.waiting_acks() == 7
    # everything idle: a@0 and b@2000000 close; the whole prefix is released in order
    step = r.on_tick(3.0)
    assert sorted(w.id for w in step.windows) == ["a@0", "b@2000000"]
    assert step.acks == {0: [0, 1, 2, 3, 4, 5, 6]} and r.waiting_acks() == 0


def test_bad_record_dead_lettered_and_released_at_once():
    r = runner()
    step = r.on_record(3, 7, b"x", b"\xc1not msgpack", 0.0)
    assert [d.error for d in step.dead] == ["bad_msgpack"]
    assert step.dead[0].value == b"\xc1not msgpack" and step.dead[0].partition == 3
    assert step.outcomes == [("features", "dead_letter")] and step.acks == {3: [7]}


def test_same_input_twice_while_open_is_a_duplicate():
    r = runner()
    r.on_record(0, 0, b"a", feat("a", "image", 100_000, 5), 0.0)
    step = r.on_record(0, 1, b"a", feat("a", "image", 100_000, 5), 0.0)
    assert step.outcomes == [("image", "duplicate")] and step.acks == {}  # 0 still open
    step = r.on_tick(5.0)
    assert [w.counts["image"] for w in step.windows] == [1] and step.acks == {0: [0, 1]}


def test_late_record_goes_out_and_is_released():
    r = runner()
    r.on_record(1, 0, b"a", feat("a", "image", 100_000, 0), 0.0)
    assert r.on_tick(5.0).acks == {1: [0]}
    step = r.on_record(1, 1, b"a", feat("a", "audio", 500_000, 1), 5.1)
    assert [(x.modality, x.window_start) for x in step.late] == [("audio", 0)]
    assert step.outcomes == [("audio", "late")] and step.acks == {1: [1]}


def test_revoke_forgets_streams_and_their_offsets():
    r = runner()
    r.on_record(0, 0, b"a", feat("a", "image", 100_000, 0), 0.0)
    r.on_record(1, 0, b"b", feat("b", "image", 100_000, 1), 0.0)
    assert r.revoke([0]) == ["a"]
    step = r.on_tick(5.0)
    assert [w.id for w in step.windows] == ["b@0"] and step.acks == {1: [0]}
    assert r.waiting_acks() == 0 and r.open_records() == 0


def test_a_record_consumed_before_a_revoke_is_ignored_and_its_prefix_replayed_whole():
    """The agent takes a record, reads the outputs back for it, and a rebalance revokes
    and gives back its partition meanwhile (seen under joins and leaves: a stream's
    first 163 inputs lost). Placed, the stale record (input offset 40) made the replayed
    inputs 0-39 duplicates, never emitted; ignored, the replay merges them all."""
    r = runner()
    epoch = r.epoch(5)
    r.revoke([5])  # ... and assigned again, to be replayed from the committed offset
    stale = r.on_record(5, 40, b"a", feat("a", "audio", 4_000_000, 40), 0.0, epoch=epoch)
    assert stale.outcomes == [] and stale.acks == {} and r.waiting_acks() == 0
    for off in range(41):
        step = r.on_record(5, off, b"a", feat("a", "audio", off * 100_000, off), 0.0,
                           epoch=r.epoch(5))
        assert step.outcomes == [("audio", "merged")]
    step = r.on_tick(10.0)
    assert sum(w.counts["audio"] for w in step.windows) == 41
    assert step.acks == {5: list(range(41))}


def test_window_stages_carry_end_to_end_latency():
    r = runner(now=100.0)
    r.on_record(0, 0, b"a", feat("a", "image", 100_000, 0, kafka_ts_ms=99_000), 0.0)
    step = r.on_tick(5.0)
    (w,) = step.windows
    assert w.stages["e2e_max"] == 1.0 and step.e2e == [1.0]
    assert w.emitted_at == 100_000_000
