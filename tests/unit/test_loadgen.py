"""The benchmark's load mix: deterministic, and shaped as asked (rates, Zipf repeats, bursts)."""

from __future__ import annotations

import collections

import numpy as np

from schemas.codec import decode_map
from schemas.events import decode_event
from scripts.benchlib.loadgen import CAPTIONS, MixSpec, mix, scaled, zipf_weights

SPEC = MixSpec(streams=3, seconds=20.0, seed=5)


def test_same_spec_same_records() -> None:
    a, b = mix(SPEC), mix(SPEC)
    assert [(i.t, i.modality, i.key, i.value, i.trace_id) for i in a] == \
           [(i.t, i.modality, i.key, i.value, i.trace_id) for i in b]
    assert [i.value for i in mix(MixSpec(streams=3, seconds=20.0, seed=6))] != [i.value for i in a]


def test_rates_order_and_valid_records() -> None:
    items = mix(SPEC)
    assert [i.t for i in items] == sorted(i.t for i in items)
    assert len({i.trace_id for i in items}) == len(items)
    per = collections.Counter((i.key, i.modality) for i in items)
    for k in range(SPEC.streams):
        key = f"load-{k}".encode()
        # 5 fps outside bursts, 15 fps in 2 s of every 10: 16*5 + 4*15 = 140 frames
        assert 135 <= per[(key, "image")] <= 145
        assert per[(key, "audio")] == 200  # continuous 100 ms chunks
        assert 8 <= per[(key, "text")] <= 20  # about one per 2 s, more in bursts
    for it in items[:50]:
        ev = decode_event(it.modality, it.key, it.value)
        assert ev.trace_id == it.trace_id
        if it.modality == "audio":
            assert ev.sr == 16_000 and len(ev.data) == 2 * 1600


def test_bursts_triple_the_frame_rate() -> None:
    ts = np.array([i.t for i in mix(SPEC) if i.modality == "image" and i.key == b"load-0"])
    burst = (ts % 10) >= 8
    assert abs(burst.sum() / 4 - 15) < 1.5 and abs((~burst).sum() / 16 - 5) < 0.5


def test_repeats_follow_a_zipf_skew() -> None:
    items = mix(MixSpec(streams=8, seconds=20.0, seed=1))
    vals = [decode_map(i.value) for i in items]
    frames = collections.Counter(v["data"] for v, i in zip(vals, items, strict=True)
                                 if i.modality == "image")
    caps = collections.Counter(v["text"] for v in vals if "text" in v)
    audio = collections.Counter(v["data"] for v, i in zip(vals, items, strict=True)
                                if i.modality == "audio")
    # repeated cards and jingles: many records share bytes, across streams too
    assert sum(c for c in frames.values() if c > 1) > 0.3 * sum(frames.values())
    assert sum(c for c in audio.values() if c > 1) > 0.1 * sum(audio.values())
    # captions: the most frequent of the pool is the Zipf head
    top = caps.most_common(1)[0]
    assert top[0] == CAPTIONS[0] and top[1] > 2 * caps.get(CAPTIONS[10], 0)
    assert sum(1 for c in caps if not c.isascii()) > len(caps) / 2  # mostly Chinese
    w = zipf_weights(10, 1.0)
    assert abs(w.sum() - 1) < 1e-9 and w[0] / w[1] == 2.0


def test_scaled_multiplies_streams() -> None:
    assert scaled(SPEC, 2.0, "x").streams == 6
    assert scaled(SPEC, 0.01, "x").streams == 1
    assert mix(scaled(SPEC, 1.0, "s1"))[0].trace_id.startswith("s1/")


def test_seq_base_and_prefix_carry_a_stream_on() -> None:
    a = mix(scaled(SPEC, 1.0, "a"))
    b = mix(scaled(SPEC, 1.0, "b", seq_base=1_000_000, start_us=SPEC.start_us + 30_000_000))
    assert {i.key for i in a} == {i.key for i in b}  # the same streams
    seqs = [decode_map(i.value)["seq"] for i in b]
    assert min(seqs) == 1_000_000
    assert min(decode_map(i.value)["ts"] for i in b) >= SPEC.start_us + 30_000_000


def test_a_term_share_of_the_captions_holds_the_bench_terms() -> None:
    from dataclasses import replace

    from scripts.benchlib.alerts import EXTRA_TERMS
    from scripts.benchlib.loadgen import TERM_CAPTIONS

    assert all(any(t in c for t in EXTRA_TERMS) for c in TERM_CAPTIONS)

    def texts(spec: MixSpec) -> list[str]:
        return [decode_map(i.value)["text"] for i in mix(spec) if i.modality == "text"]

    long = replace(SPEC, seconds=120.0)
    share = sum(t in TERM_CAPTIONS for t in texts(replace(long, term_share=0.4)))
    n = len(texts(long))
    assert 0.3 * n < share - sum(t in TERM_CAPTIONS for t in texts(long)) < 0.5 * n
    assert texts(replace(long, term_share=0.0)) == texts(long)  # the default draws as before
