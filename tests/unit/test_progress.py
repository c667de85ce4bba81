"""Slow is not idle: progress marks, the board that reads them, and takeover restore."""

from __future__ import annotations

import itertools
from typing import Any

from app.align.aligner import AlignerConfig
from app.align.progress import IdleAfter, MarkBoard
from app.align.runner import AlignRunner
from app.features.progress import InputProgress
from schemas.aligned import AlignedWindow
from schemas.codec import encode
from schemas.features import FeatureRecord, ProgressMark, decode_features

CFG = AlignerConfig(window_us=1_000_000, lateness_us=200_000, idle_s=2.0, rate_hz=20.0,
                    correct_skew=False)


#: each mark made later than the one before, as an agent's are (``at``, us)
_MADE = itertools.count(1)


def mark(modality: str, part: int, nxt: int, end: int) -> ProgressMark:
    return ProgressMark(modality=modality, parts={part: (nxt, end)}, at=next(_MADE))


def feat(modality: str, ts: int, src_offset: int, sid: str = "s", part: int = 0, *,
         dur: int = 0, sent: bool = False) -> bytes:
    """A feature record; ``sent``: its input was sent at its own media time (a live
    stream: its Kafka timestamp is its ts), else it has none."""
    return FeatureRecord(stream_id=sid, modality=modality, ts=ts, dur=dur, seq=None,
                         trace_id=None, kafka_ts_ms=ts // 1000 if sent else 0,
                         src_partition=part, src_offset=src_offset,
                         feats={"luma": 0.5, "change": 0.1}).encode()


def test_mark_round_trip_and_drained():
    m = ProgressMark(modality="image", parts={0: (10, 10), 3: (4, 9), 5: (-1, -1)}, at=7)
    back = decode_features(m.encode())
    assert back == m
    assert m.drained(0) is True and m.drained(3) is False and m.drained(5) is False
    assert m.drained(1) is None
    timed = ProgressMark(modality="audio", parts={0: (3, 3)}, at=9, polled={0: 8})
    assert decode_features(timed.encode()) == timed


def test_a_mark_without_fetch_times_vouches_for_no_time():
    """Marks of a worker from before fetch times were sent decode with none; the board
    then bounds nothing by them, as before."""
    old = {"v": 1, "type": "progress", "modality": "image", "parts": [[0, 4, 4]], "at": 5}
    back = decode_features(encode(old))
    assert isinstance(back, ProgressMark) and back.polled == {}
    b = MarkBoard(ttl_s=2.0, max_hold_s=30.0)
    b.update(back, now=1.0, via=0)
    assert b.covered("image", 0, 1.0, via=0) is None
    b.update(ProgressMark(modality="image", parts={0: (4, 4)}, at=6, polled={0: 5_500_000}),
             now=1.1, via=0)
    assert b.covered("image", 0, 1.1, via=0) == 5.5
    assert b.covered("image", 0, 36.0, via=0) is None  # not fetched for max_hold_s
    assert b.covered("image", 0, 1.1, via=1) is None  # vouches for its own partition only
    assert IdleAfter(2.0).covered("image", 0, 1.1) is None


def test_board_trusts_only_fresh_drained_marks_and_gives_up_on_silence():
    b = MarkBoard(ttl_s=2.0, max_hold_s=30.0)
    assert not b.drained("image", 0, now=10.0, since=0.0)  # never heard of: hold ...
    assert b.drained("image", 0, now=31.0, since=0.0)  # ... but not for ever
    b.update(mark("image", 0, 5, 9), now=10.0)
    assert not b.drained("image", 0, now=10.5, since=0.0)  # behind: hold
    assert not b.drained("image", 0, now=39.0, since=0.0)  # the agent went silent ...
    assert b.drained("image", 0, now=40.5, since=0.0)  # ... for max_hold: give up
    b.update(mark("image", 0, 9, 9), now=41.0)
    assert b.drained("image", 0, now=42.0, since=0.0)  # drained and fresh
    assert not b.drained("image", 0, now=43.5, since=0.0)  # drained but stale: hold
    assert IdleAfter(2.0).drained("text", 0, now=3.0, since=1.5) is False


def test_board_holds_for_a_slow_agent_but_not_a_wedged_one():
    b = MarkBoard(ttl_s=2.0, max_hold_s=30.0)
    for k in range(80):  # 40 s of marks, behind all along, moving every 0.5 s
        b.update(mark("image", 0, k, 1000), now=k / 2)
    assert not b.drained("image", 0, now=40.0, since=0.0)
    for k in range(80, 150):  # stuck at the same offset for 35 s, still sending
        b.update(mark("image", 0, 80, 1000), now=k / 2)
        if k / 2 - 40.0 < 30.0:
            assert not b.drained("image", 0, now=k / 2, since=0.0)
    assert b.drained("image", 0, now=74.6, since=0.0)


def test_input_progress_reports_behind_until_it_knows_where_it_starts():
    p = InputProgress("audio")
    assert p.mark({}, 1) is None  # nothing assigned
    assert p.assigned([0, 1]) == [0, 1]
    assert p.mark({0: 10, 1: 0}, 1) == ProgressMark("audio", {0: (-1, -1), 1: (-1, -1)}, 1)
    p.started(0, 4)
    p.started(1, 0)
    p.processed(0, 4)
    mk = p.mark({0: 10, 1: 0}, 2)
    assert mk is not None and mk.parts == {0: (5, 10), 1: (0, 0)}
    assert mk.drained(1) and not mk.drained(0)
    p.processed(0, 9)
    assert p.assigned([0]) == []  # 1 revoked; 0 keeps its position
    assert p.mark({0: 10}, 3) == ProgressMark("audio", {0: (10, 10)}, 3)
    # the log now ends before what was processed: it was recreated, start again
    assert p.mark({0: 4}, 4) == ProgressMark("audio", {0: (-1, -1)}, 4)
    assert p.assigned([0]) == [0]


def test_a_slow_modality_holds_windows_until_its_input_is_drained():
    r = AlignRunner(CFG, "f", clock=lambda: 0.0, marks=MarkBoard(ttl_s=2.0, max_hold_s=30.0))
    # audio and text run ahead; the image agent is loading its models (its input waits)
    r.on_record(0, 0, None, mark("image", 0, 0, 25).encode(), 0.0)
    r.on_record(0, 1, None, mark("text", 0, 0, 0).encode(), 0.0)
    off = 2
    for k in range(6):
        r.on_record(0, off, b"s", feat("audio", k * 1_000_000, k), 0.0)
        off += 1
    # without marks, 2 s of image silence would close windows 0-4 with no frames
    assert r.on_tick(3.0).windows == []
    r.on_record(0, off, None, mark("image", 0, 0, 25).encode(), 3.0)
    assert r.on_tick(5.0).windows == []  # still behind: still held
    off += 1
    r.on_record(0, off, None, mark("text", 0, 0, 0).encode(), 5.0)  # marks keep coming
    got = []
    for k in range(5):  # the models are up: the frames come
        step = r.on_record(0, off + 1 + k, b"s", feat("image", k * 1_000_000 + 10, 100 + k), 5.1)
        assert step.late == []
        got += step.windows
    assert [w.window_start for w in got] == [0, 1_000_000, 2_000_000]  # 4 s - lateness
    assert all(w.counts["image"] == 1 and w.counts["audio"] == 1 for w in got)


def test_a_drained_modality_never_heard_holds_only_idle_s_from_the_streams_start():
    r = AlignRunner(CFG, "f", clock=lambda: 0.0, marks=MarkBoard(ttl_s=2.0, max_hold_s=30.0))
    for i, m in enumerate(("text", "audio")):
        r.on_record(0, i, None, mark(m, 0, 7, 7).encode(), 0.0)  # nothing in their inputs
    got = [w.window_start for k in range(3)
           for w in r.on_record(0, 2 + k, b"s", feat("image", k * 1_000_000, k), 0.0).windows]
    assert got == []  # their marks may predate this stream's first captions and sound
    for i, m in enumerate(("text", "audio")):  # marks keep coming: still nothing
        r.on_record(0, 5 + i, None, mark(m, 0, 7, 7).encode(), 1.9)
    assert r.on_tick(1.9).windows == []
    assert [w.window_start for w in r.on_tick(2.0).windows] == [0]  # idle_s: 2 s - 0.2 s


def test_a_fresh_drained_mark_does_not_close_a_new_streams_first_window():
    """Seen on the embedded broker (scripts/bench_align.py on a fresh worker, 7 to 12 of
    11,181 late): a stream's first caption was read while the image and audio agents'
    marks still said "drained" at end 0 (the end as last fetched, before the load); the
    caption's time closed window 0, and the first frame and sound, read 60 ms later,
    were late."""
    r = AlignRunner(CFG, "f", clock=lambda: 0.0, marks=MarkBoard(ttl_s=2.0, max_hold_s=30.0))
    for i, m in enumerate(("image", "audio", "text")):
        r.on_record(1, i, None, mark(m, 1, 0, 0).encode(), 0.0)
    step = r.on_record(1, 3, b"s", feat("text", 1_600_000, 0, part=1), 0.05)
    assert step.windows == [] and r.on_tick(0.1).windows == []
    late, off = [], 4
    for k in range(3):  # the first frames and sound, ts 0, 0.5 s and 1 s
        for m in ("audio", "image"):
            late += r.on_record(1, off, b"s", feat(m, k * 500_000, k, part=1), 0.11).late
            off += 1
    assert late == []


def test_a_stale_drained_mark_does_not_close_what_a_broker_outage_holds_back():
    """Kafka restarted under a worker (test_kafka.py), as seen: every agent's mark said
    "drained" at end 0 (its partition was empty); a load of 3 s was published and its
    first features read; then the broker stopped, and the marks that said "behind" and
    the rest of the features came only after it was back. 1.5 s into the outage no
    modality was active, the old marks were still within their 2 s, and windows 0-2
    closed without the rest: 21 inputs late."""
    cfg = AlignerConfig(window_us=1_000_000, lateness_us=200_000, idle_s=1.5, rate_hz=20.0,
                        correct_skew=False)
    r = AlignRunner(cfg, "f", clock=lambda: 0.0, marks=MarkBoard(ttl_s=2.0, max_hold_s=30.0))
    for i, m in enumerate(("image", "audio", "text")):
        r.on_record(3, i, None, mark(m, 3, 0, 0).encode(), 0.0)
    off = 3
    for k in range(8):  # frames 0-7 and sound 0-15 read before the stop
        r.on_record(3, off, b"s", feat("image", k * 200_000, k, part=3), 0.1)
        r.on_record(3, off + 1, b"s", feat("audio", k * 200_000, 2 * k, part=3), 0.1)
        r.on_record(3, off + 2, b"s", feat("audio", k * 200_000 + 100_000, 2 * k + 1,
                                            part=3), 0.1)
        off += 3
    r.on_record(3, off, b"s", feat("text", 300_000, 0, part=3), 0.1)
    off += 1
    for now in (1.7, 1.9, 5.0, 9.0):  # the outage: nothing read
        assert r.on_tick(now).windows == [], now
    # back: the agents' marks (behind), then the rest of the load
    for m, nxt, end in (("image", 8, 15), ("audio", 16, 30), ("text", 1, 4)):
        r.on_record(3, off, None, mark(m, 3, nxt, end).encode(), 9.1)
        off += 1
    late = []
    for k in range(8, 15):
        late += r.on_record(3, off, b"s", feat("image", k * 200_000, k, part=3), 9.2).late
        off += 1
    for k in range(16, 30):
        late += r.on_record(3, off, b"s", feat("audio", k * 100_000, k, part=3), 9.2).late
        off += 1
    assert late == []


def _window(sid: str, start: int, sources: list[tuple[str, int, int]],
            text_ms: float = 0.0, text_conf: float = 0.0) -> dict:
    w = AlignedWindow(stream_id=sid, window_start=start, window_end=start + 1_000_000,
                      rate_hz=20.0, offsets_ms={"image": 0.0, "audio": 120.0, "text": text_ms},
                      confidence={"image": 1.0, "audio": 0.9, "text": text_conf}, counts={},
                      grid={}, moderation={}, trace_ids=[], emitted_at=0,
                      sources=[list(s) for s in sources])
    return AlignedWindow.decode(w.encode())


def test_restore_from_outputs_never_emits_a_window_again():
    r = AlignRunner(CFG, "f", clock=lambda: 0.0)
    # the previous owner emitted s@0 with image offsets 0-1, and sent audio 9 late
    late = {"stream_id": "s", "modality": "audio", "src": [0, 9],
            "window": {"id": "s@0", "start": 0, "end": 1_000_000}}
    assert r.restore(0, [_window("s", 0, [("image", 0, 0), ("image", 0, 1)])], [late],
                     now=100.0) == 1
    assert r.aligner.offset_us("s", "audio") == 0  # correction is off in CFG
    # replayed records (made before the restore): the emitted ones are duplicates ...
    step = r.on_record(0, 0, b"s", feat("image", 100_000, 0), 100.1, timestamp_ms=99_000)
    assert step.outcomes == [("image", "duplicate")] and step.acks == {0: [0]}
    step = r.on_record(0, 1, b"s", feat("audio", 200_000, 9), 100.1, timestamp_ms=99_000)
    assert step.outcomes == [("audio", "duplicate")] and step.late == []
    # ... one the previous owner held open joins the oldest open window, not late
    step = r.on_record(0, 2, b"s", feat("image", 900_000, 2), 100.1, timestamp_ms=99_000)
    assert step.outcomes == [("image", "merged")] and step.late == []
    # a record made after the takeover for an emitted window is late, as always
    step = r.on_record(0, 3, b"s", feat("text", 500_000, 3), 100.2, timestamp_ms=100_200)
    assert step.outcomes == [("text", "late")]
    windows = r.on_tick(200.0).windows
    assert [w.id for w in windows] == ["s@1000000"]  # s@0 is never emitted again
    assert windows[0].sources == [["image", 0, 2]]


def test_restore_seeds_the_skew_estimate():
    r = AlignRunner(AlignerConfig(), "f", clock=lambda: 0.0)
    r.restore(2, [_window("s", 0, [("image", 2, 0)])], [], now=1.0)
    assert r.aligner.offset_us("s", "audio") == 120_000
    assert r.aligner.confidence("s", "audio") == 0.9


def test_restore_gives_back_the_windows_caption_offset_not_it_plus_the_sounds():
    # a window's text offset is against the picture: the caption's lag behind the sound
    # plus the sound's behind the picture; restoring must not add the sound's twice
    r = AlignRunner(AlignerConfig(), "f", clock=lambda: 0.0)
    r.restore(2, [_window("s", 0, [("image", 2, 0)], text_ms=450.0, text_conf=0.7)], [],
              now=1.0)
    assert r.aligner.offset_us("s", "audio") == 120_000
    assert r.aligner.offset_us("s", "text") == 450_000
    assert r.aligner.confidence("s", "text") == 0.7


def test_feature_agent_replays_are_duplicates_after_the_window_went_out():
    r = AlignRunner(CFG, "f", clock=lambda: 0.0)
    for k in range(3):
        r.on_record(0, k, b"s", feat("image", k * 400_000, k), 0.0)
    assert [w.id for w in r.on_tick(5.0).windows] == ["s@0"]  # all idle: flushed
    # the feature agent re-processed its input from offset 1 after a crash
    step = r.on_record(0, 3, b"s", feat("image", 400_000, 1), 5.1)
    assert step.outcomes == [("image", "duplicate")] and step.late == []


def test_behind_counts_what_is_fetched_and_not_processed():
    p = InputProgress("image")
    assert p.assigned([0, 1, 2]) == [0, 1, 2]
    p.started(0, 10)
    p.processed(1, 4)  # next 5
    # partition 2: start unknown, counts 0; an end below the next offset counts 0
    assert p.behind({0: 25, 1: 8, 2: 100}) == 15 + 3
    assert p.behind({0: 5, 1: 8}) == 3


def test_a_drained_mark_read_from_another_features_partition_does_not_close_windows():
    """A mark goes to every features partition after the records it covers, but only on
    one partition is it ordered after them: read from partition 3 it may say "drained"
    while the frames it covers still wait on partition 5, the stream's own (a backlog
    there after a takeover). It must not close the stream's windows without them."""
    r = AlignRunner(CFG, "f", clock=lambda: 0.0, marks=MarkBoard(ttl_s=2.0, max_hold_s=30.0))
    off = 0

    def read(part: int, value: bytes, now: float) -> list[int]:
        nonlocal off
        step = r.on_record(part, off, b"s" if part == 5 else None, value, now)
        off += 1
        assert step.late == []
        return [w.window_start for w in step.windows]

    got: list[int] = []
    for k in range(6):  # sound 0-5 s, frames 0-1 s, all on the stream's partition 5
        got += read(5, feat("audio", k * 1_000_000, k), 0.0)
    for k in range(2):
        got += read(5, feat("image", k * 1_000_000, k), 0.0)
    # 2.9 s: every agent's mark on partition 5; the image agent is behind (frames 2-5 still
    # to extract); audio and text are drained
    for m, nxt, end in (("image", 2, 6), ("audio", 6, 6), ("text", 0, 0)):
        got += read(5, mark(m, 0, nxt, end).encode(), 2.9)
    # 3.0 s: the image agent caught up; its "drained" mark is read from partition 3 first
    for m, nxt, end in (("image", 6, 6), ("audio", 6, 6), ("text", 0, 0)):
        got += read(3, mark(m, 0, nxt, end).encode(), 3.0)
    got += [w.window_start for w in r.on_tick(3.0).windows]
    assert got == []  # held: the frames' newest is 1 s, and frames 2-5 s are to come
    # the frames it covers, then the mark, read from partition 5
    for k in range(2, 6):
        got += read(5, feat("image", k * 1_000_000, k), 3.1)
    got += read(5, mark("image", 0, 6, 6).encode(), 3.1)
    got += [w.window_start for w in r.on_tick(3.2).windows]
    assert got == [k * 1_000_000 for k in range(4)]  # frames to 5 s, less the lateness


def test_describe_names_what_bounds_a_streams_watermark():
    r = AlignRunner(CFG, "f", clock=lambda: 0.0)
    for k in range(3):
        r.on_record(2, k, b"s", feat("audio", k * 1_000_000, k), 0.0)
    r.on_record(2, 3, b"s", feat("image", 0, 0), 0.0)
    assert r.aligner.describe("s", 0.5).endswith("bounds hold all")  # no caption yet
    r.on_record(2, 4, b"s", feat("text", 0, 0), 0.0)
    line = r.aligner.describe("s", 0.5)
    assert "closed until -1" in line and "home 2" in line
    assert "'image': -200000" in line and "'audio': 1800000" in line  # less the lateness
    assert r.aligner.describe("nobody", 0.5) == "nobody: not held here"


def test_a_mark_read_again_in_a_replay_is_not_news():
    b = MarkBoard(ttl_s=2.0, max_hold_s=30.0)
    last = ProgressMark("audio", {0: (9, 9)}, at=500)
    b.update(ProgressMark("audio", {0: (5, 9)}, at=400), now=10.0)
    b.update(last, now=10.4)
    assert b.drained("audio", 0, now=11.0, since=0.0)  # drained and fresh
    assert not b.drained("audio", 0, now=13.0, since=0.0)  # its agent went silent: hold
    # a rebalance: the features partition is read again from the committed offset
    b.update(ProgressMark("audio", {0: (5, 9)}, at=400), now=20.0)
    b.update(last, now=20.0)
    assert not b.drained("audio", 0, now=20.5, since=0.0)  # still the silent agent's mark
    assert b.drained("audio", 0, now=40.5, since=0.0)  # max_hold from when it was read
    b.update(ProgressMark("audio", {0: (12, 15)}, at=501), now=41.0)  # a newer one is news
    assert not b.drained("audio", 0, now=41.1, since=0.0)


def test_a_drained_mark_read_just_after_the_last_record_may_be_an_agents_last_word():
    b = MarkBoard(ttl_s=2.0, max_hold_s=30.0, after_s=0.5)
    b.heard("audio", 0, 8)
    b.update(mark("audio", 0, 9, 9), now=10.2)  # 0.2 s after the sound was last heard
    assert not b.drained("audio", 0, now=12.1, since=10.0)
    b.update(mark("audio", 0, 9, 9), now=10.7)  # the agent is alive an interval later
    assert b.drained("audio", 0, now=12.1, since=10.0)


def test_a_killed_agents_last_mark_closes_no_window_before_or_after_a_rebalance():
    """The CI of 503242c (`test_sigkill_of_one_worker_of_each_kind_in_a_split_group`, on
    Tansu): the text/audio worker was SIGKILLed, and the aligner closed 8 s of one
    stream's windows on the picture alone, its sound (80 inputs) late when the survivor
    took over 11.6 s later. The killed agent's last mark said "drained" with nothing after
    it. Read when it was sent, it would say so from when the sound went silent (idle_s)
    until it went stale (ttl_s); read again after a rebalance, as fresh, it said so while
    the picture had run 10 s ahead."""
    cfg = AlignerConfig(window_us=1_000_000, lateness_us=200_000, idle_s=1.5, rate_hz=20.0,
                        correct_skew=False)
    r = AlignRunner(cfg, "f", clock=lambda: 0.0,
                    marks=MarkBoard(ttl_s=2.0, max_hold_s=30.0, after_s=0.5))
    log: list[tuple[bytes | None, bytes, int]] = []  # the features partition
    got: list[AlignedWindow] = []
    late: list[object] = []

    def read(off: int, now: float) -> None:
        key, value, ts_ms = log[off]
        step = r.on_record(0, off, key, value, now, timestamp_ms=ts_ms)
        got.extend(step.windows)
        late.extend(step.late)

    def put(key: bytes | None, value: bytes, now: float) -> None:
        log.append((key, value, int(now * 1000) + 1))
        read(len(log) - 1, now)

    def media(k0: int, k1: int, *, audio: bool) -> None:  # 100 ms steps, read as made
        for k in range(k0, k1):
            now = k / 10
            if audio:
                put(b"s", feat("audio", k * 100_000, k), now)
            if k % 2 == 0:
                put(b"s", feat("image", k * 100_000, k // 2), now)
            if k % 5 == 4:
                if audio:
                    put(None, mark("audio", 0, k + 1, k + 1).encode(), now)
                put(None, mark("image", 0, k // 2 + 1, k // 2 + 1).encode(), now)
                put(None, mark("text", 0, 0, 0).encode(), now)  # no captions: drained
            got.extend(r.on_tick(now + 0.05).windows)

    media(0, 50, audio=True)  # 0-5 s; the audio agent's last word: "drained" at 50
    media(50, 150, audio=False)  # it was killed: its sound, 5-15 s, waits in its input
    assert [w.window_start for w in got] == [0, 1_000_000, 2_000_000, 3_000_000]
    # a rebalance: the aligner reads its features partition again, old marks and all
    r.revoke([0])
    r.restore(0, [AlignedWindow.decode(w.encode()) for w in got], [], now=15.0)
    for off in range(len(log)):
        read(off, 15.0)
    media(150, 200, audio=False)
    assert [w.window_start for w in got] == [0, 1_000_000, 2_000_000, 3_000_000]
    # the survivor takes the sound's input over at 20 s
    for nxt, end in ((-1, -1), (50, 200)):
        put(None, mark("audio", 0, nxt, end).encode(), 20.0)
    for k in range(50, 200):
        put(b"s", feat("audio", k * 100_000, k), 20.1)
    for m, end in (("audio", 200), ("image", 100), ("text", 0)):  # all drained: all close
        put(None, mark(m, 0, end, end).encode(), 21.7)
    got.extend(r.on_tick(21.8).windows)
    assert late == []
    assert sum(w.counts.get("audio", 0) for w in got) == 200
    assert sum(w.counts.get("image", 0) for w in got) == 100


def test_a_stream_back_from_silence_holds_for_its_slower_modalities_as_a_new_one():
    """bench.py, the step after an overloaded one (6 to 18 late of 4,251, on Kafka): every
    stream paused between the steps. When they came back, a stream's first caption was
    read within 60 ms of its making, its sound of the same moment (made 25 ms before it)
    just after it: the audio and image agents' batches queue behind a loaded worker; their
    agents' last marks, made before those came, said "drained". The caption's end (ts
    + 1.5 s) closed the window they belonged to, and they went late."""
    r = AlignRunner(CFG, "f", clock=lambda: 0.0, marks=MarkBoard(ttl_s=2.0, max_hold_s=30.0))
    off = itertools.count()
    got: list[AlignedWindow] = []
    late: list[object] = []

    def put(key: bytes | None, value: bytes, now: float) -> None:
        step = r.on_record(0, next(off), key, value, now)
        got.extend(step.windows)
        late.extend(step.late)

    def marks(now: float, n: int) -> None:  # every agent: its input processed to its end
        for m in ("audio", "image", "text"):
            put(None, mark(m, 0, n, n).encode(), now)

    def caption(ts: int, seq: int) -> bytes:
        return FeatureRecord(stream_id="s", modality="text", ts=ts, dur=1_500_000, seq=seq,
                             trace_id=None, kafka_ts_ms=0, src_partition=0, src_offset=seq,
                             feats={}).encode()

    for k in range(50):  # 0-5 s, every modality, read as made
        put(b"s", feat("audio", k * 100_000, k), k / 10)
        put(b"s", feat("image", k * 100_000, k), k / 10)
    put(b"s", caption(1_000_000, 0), 1.0)
    for t in range(5, 100, 5):  # then a pause: the agents keep saying "drained"
        marks(t / 10, 50)
        got.extend(r.on_tick(t / 10).windows)
    assert [w.window_start for w in got] == [k * 1_000_000 for k in range(5)]
    # back at 10 s: the caption first; the sound and frames 0.4 s behind it
    put(b"s", caption(10_000_000, 1), 10.0)
    got.extend(r.on_tick(10.1).windows)
    for k in range(100, 125):
        put(b"s", feat("audio", k * 100_000, k - 50), 10.4)
        put(b"s", feat("image", k * 100_000, k - 50), 10.4)
    got.extend(r.on_tick(10.5).windows)
    assert late == []
    back = [w for w in got if w.window_start == 10_000_000]
    assert [(w.counts.get("audio"), w.counts.get("image"), w.counts.get("text"))
            for w in back] == [(10, 10, 1)]


def _live(*, sound_off: bool) -> tuple[AlignRunner, list[AlignedWindow], list[object], Any]:
    """A live stream whose camera (and with ``sound_off`` its sound) was off from 5 to 10 s
    while the rest ran on; every agent's marks, fetched as made, said its input drained."""
    r = AlignRunner(CFG, "f", clock=lambda: 0.0, marks=MarkBoard(ttl_s=2.0, max_hold_s=30.0))
    off = itertools.count()
    got: list[AlignedWindow] = []
    late: list[object] = []
    done = {"audio": 0, "image": 0, "text": 0}

    def put(key: bytes | None, value: bytes, now: float) -> None:
        step = r.on_record(0, next(off), key, value, now)
        got.extend(step.windows)
        late.extend(step.late)

    def rec(m: str, ts: int, now: float, dur: int = 0) -> None:
        put(b"s", feat(m, ts, done[m], dur=dur, sent=True), now)
        done[m] += 1

    def marks(now: float) -> None:
        at = round(now * 1e6)
        for m, n in done.items():
            put(None, ProgressMark(modality=m, parts={0: (n, n)}, at=at, polled={0: at})
                .encode(), now)

    for k in range(100):  # 0-10 s, 100 ms steps; a caption (1.5 s) every second
        now = k / 10
        if k < 50 or not sound_off:
            rec("audio", k * 100_000, now)
        if k < 50:
            rec("image", k * 100_000, now)
        if k % 10 == 0:
            rec("text", k * 100_000, now, dur=1_500_000)
        marks(now + 0.05)
        got.extend(r.on_tick(now + 0.05).windows)
    return r, got, late, rec


def test_a_camera_back_on_while_captions_ran_holds_for_its_first_frames():
    """Camera and microphone off while captions ran on (chat lines), then back at 10 s: the
    caption of 10 s is read first, the frames and sound of 10.0-10.4 s 0.4 s later (the
    image agent lags). Their agents' last marks said "drained", fetched before those came,
    and the caption's end (ts + 1.5 s) closed the window they belong to: 10 late before
    this fix. A "drained" vouches only up to its fetch."""
    r, got, late, rec = _live(sound_off=True)
    rec("text", 10_000_000, 10.0, dur=1_500_000)
    got.extend(r.on_tick(10.05).windows)
    for k in range(100, 105):
        rec("audio", k * 100_000, 10.4)
        rec("image", k * 100_000, 10.4)
    got.extend(r.on_tick(10.45).windows)
    assert late == []


def test_a_camera_back_on_beside_running_sound_holds_for_its_first_frames():
    """Only the camera was off; the sound ran on. The first frame back (10.85 s, near its
    window's end) is read 0.4 s after it was sent, beside the sound of 11.25 s: the sound
    alone closed [10, 11) 0.2 s after its end before this fix."""
    r, got, late, rec = _live(sound_off=False)
    for k in range(100, 113):
        rec("audio", k * 100_000, k / 10)
        if k == 105:
            rec("text", k * 100_000, k / 10, dur=1_500_000)
        got.extend(r.on_tick(k / 10 + 0.01).windows)
    rec("image", 10_850_000, 11.25)
    got.extend(r.on_tick(11.3).windows)
    for k in range(113, 130):  # both run on, the frames 0.4 s behind
        rec("audio", k * 100_000, k / 10)
        rec("image", (k - 4) * 100_000, k / 10)
        got.extend(r.on_tick(k / 10 + 0.01).windows)
    assert late == []
    back = [w for w in got if w.window_start == 10_000_000]
    assert [(w.counts.get("audio"), w.counts.get("image")) for w in back] == [(10, 2)]
