"""Fuzz: 10,000+ malformed records mixed into real multimodal streams, one worker.

Every bad record must come out on the dlq with its original key and value bytes
and a sensible reason; every good record must be merged into exactly one window;
the worker must neither crash nor restart.
"""

from __future__ import annotations

import random
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import msgpack
import pytest

from app.clients.collect import collect
from app.clients.synth import SynthSpec, synth_events
from app.kafka.clients import make_producer
from app.kafka.topics import ensure_topics
from app.runtime.process import peak_rss_bytes
from schemas.events import TextEvent, encode_event
from tests.integration.brokers import ON_BOTH

pytestmark = pytest.mark.integration

SEED = 20261203
N_BAD = 10_000
MIB = 1024 * 1024


def _pack(d: Any) -> bytes:
    return msgpack.packb(d, use_bin_type=True)


class _Fuzzer:
    """Bad records of every kind, from a seeded generator; kind -> allowed reasons."""

    def __init__(self, rng: random.Random, keys: list[str], good: dict[str, list[bytes]]) -> None:
        self.rng = rng
        self.keys = keys
        #: valid encoded events per modality, to corrupt
        self.good = good
        self.now_us = time.time_ns() // 1000

    def _bytes(self, n: int) -> bytes:
        return self.rng.randbytes(n)

    def _base(self, modality: str) -> tuple[str, dict[str, Any]]:
        raw = self.rng.choice(self.good[modality])
        d = msgpack.unpackb(raw, raw=False)
        return d["stream_id"], d

    def _mod(self) -> str:
        return self.rng.choice(("text", "image", "audio"))

    def _key(self) -> bytes:
        return self.rng.choice(self.keys).encode()

    # each returns (modality, key, value, allowed reasons)
    def random_bytes(self) -> tuple[str, bytes | None, bytes | None, set[str]]:
        return (self._mod(), self._key(), self._bytes(self.rng.randrange(0, 400)),
                {"bad_msgpack", "schema", "bad_version"})

    def truncated(self) -> tuple[str, bytes | None, bytes | None, set[str]]:
        m = self._mod()
        raw = self.rng.choice(self.good[m])
        sid = msgpack.unpackb(raw)["stream_id"]
        return m, sid.encode(), raw[: self.rng.randrange(1, len(raw))], {"bad_msgpack"}

    def wrong_type(self) -> tuple[str, bytes | None, bytes | None, set[str]]:
        m = self._mod()
        sid, d = self._base(m)
        fields = {"text": ["stream_id", "ts", "seq", "text", "dur", "lang", "trace_id"],
                  "image": ["stream_id", "ts", "seq", "data", "fmt"],
                  "audio": ["stream_id", "ts", "seq", "data", "sr", "ch"]}[m]
        f = self.rng.choice(fields)
        bad = self.rng.choice([1.5, "12", True, [1], {"a": 1}, b"\x00", 7, "s"])
        ok_types = {"stream_id": str, "text": str, "lang": str, "trace_id": str, "fmt": str,
                    "data": bytes}
        want = ok_types.get(f, int)
        if isinstance(bad, want) and not isinstance(bad, bool):
            bad = 2.5  # not the right type for any field
        d[f] = bad
        return m, sid.encode(), _pack(d), {"schema"}

    def missing_field(self) -> tuple[str, bytes | None, bytes | None, set[str]]:
        m = self._mod()
        sid, d = self._base(m)
        f = self.rng.choice({"text": ["stream_id", "ts", "text"], "image": ["stream_id", "ts",
                             "data"], "audio": ["stream_id", "ts", "data", "sr"]}[m])
        del d[f]
        return m, sid.encode(), _pack(d), {"schema"}

    def unknown_version(self) -> tuple[str, bytes | None, bytes | None, set[str]]:
        m = self._mod()
        sid, d = self._base(m)
        v = self.rng.choice([0, 2, 3, 99, -1, None, "1", 1.0, True])
        if v is None:
            del d["v"]
        else:
            d["v"] = v
        return m, sid.encode(), _pack(d), {"bad_version"}

    def big_text(self) -> tuple[str, bytes | None, bytes | None, set[str]]:
        sid, d = self._base("text")
        d["text"] = "字" * (64 * 1024 // 3 + 1 + self.rng.randrange(0, 2000))
        return "text", sid.encode(), _pack(d), {"too_large"}

    def big_image(self) -> tuple[str, bytes | None, bytes | None, set[str]]:
        sid, d = self._base("image")
        # just over 8 MiB of data (checked on the field) or far over (checked on the record)
        extra = self.rng.choice([1, 64 * 1024])
        d["data"] = d["data"] + b"\0" * (8 * MIB - len(d["data"]) + extra)
        return "image", sid.encode(), _pack(d), {"too_large"}

    def big_audio(self) -> tuple[str, bytes | None, bytes | None, set[str]]:
        sid, d = self._base("audio")
        d["data"] = b"\0\0" * (2 * MIB + 1)
        return "audio", sid.encode(), _pack(d), {"too_large"}

    def corrupt_image(self) -> tuple[str, bytes | None, bytes | None, set[str]]:
        sid, d = self._base("image")
        data = bytearray(d["data"])
        how = self.rng.randrange(4)
        if how == 0:  # truncated after the magic
            data = data[: self.rng.randrange(3, len(data) - 2)]
        elif how == 1:  # magic then garbage
            data = data[:3] + self._bytes(self.rng.randrange(10, 500))
        elif how == 2:  # a PNG signature and garbage
            data = bytearray(b"\x89PNG\r\n\x1a\n" + self._bytes(self.rng.randrange(10, 500)))
            d.pop("fmt", None)
        else:  # neither JPEG nor PNG (GIF, random)
            data = bytearray(b"GIF89a" + self._bytes(50))
        d["data"] = bytes(data)
        return "image", sid.encode(), _pack(d), {"bad_image"}

    def fmt_mismatch(self) -> tuple[str, bytes | None, bytes | None, set[str]]:
        sid, d = self._base("image")
        d["fmt"] = self.rng.choice(["png", "gif", "webp"])
        return "image", sid.encode(), _pack(d), {"bad_image" if d["fmt"] == "png" else "schema"}

    def bad_pcm(self) -> tuple[str, bytes | None, bytes | None, set[str]]:
        sid, d = self._base("audio")
        how = self.rng.randrange(5)
        if how == 0:
            d["data"] = d["data"][:-1]  # odd length
        elif how == 1:
            d["sr"] = self.rng.choice([0, 1, 7999, 48001, 10**9, -16000, 2**63])
        elif how == 2:
            d["ch"] = self.rng.choice([0, 9, 255, -1])
        elif how == 3:
            d["data"] = b""
        else:  # 3 bytes short of a whole stereo frame
            d["ch"], d["data"] = 2, b"\0" * 6
        return "audio", sid.encode(), _pack(d), {"bad_audio"}

    def bad_ts(self) -> tuple[str, bytes | None, bytes | None, set[str]]:
        m = self._mod()
        sid, d = self._base(m)
        d["ts"] = self.rng.choice([-1, -(2**63), self.now_us + 8 * 86400 * 10**6, 2**64 - 1])
        return m, sid.encode(), _pack(d), {"bad_ts"}

    def key_mismatch(self) -> tuple[str, bytes | None, bytes | None, set[str]]:
        m = self._mod()
        sid, d = self._base(m)
        key = self.rng.choice([sid + "x", sid.upper() + "!", "other", "\xff"]).encode()
        if self.rng.random() < 0.25:
            key = b"\xff\xfe" + sid.encode()  # not UTF-8
        return m, key, _pack(d), {"key_mismatch"}

    def nil_key_garbage(self) -> tuple[str, bytes | None, bytes | None, set[str]]:
        return self._mod(), None, self._bytes(self.rng.randrange(1, 100)), {
            "bad_msgpack", "schema", "bad_version"}

    def tombstone(self) -> tuple[str, bytes | None, bytes | None, set[str]]:
        return self._mod(), self._key(), None, {"bad_msgpack"}

    def msgpack_oddities(self) -> tuple[str, bytes | None, bytes | None, set[str]]:
        raw, reasons = self.rng.choice([
            (b"\xdf\xff\xff\xff\xff", {"bad_msgpack"}),       # map of 2**32-1 entries
            (b"\xdd\xff\xff\xff\xff", {"bad_msgpack"}),       # array of 2**32-1
            (b"\xc6\xff\xff\xff\xff", {"bad_msgpack"}),       # bin of 4 GiB
            (b"\x91" * 5000, {"bad_msgpack"}),                # deep nesting
            (_pack({1: 2}), {"bad_msgpack"}),                 # non-string map key
            (_pack([1, 2, 3]), {"schema"}),                   # not a map
            (_pack("hello"), {"schema"}),
            (_pack({"v": 1}) + b"\x00", {"bad_msgpack"}),     # trailing data
            (b"\xc1", {"bad_msgpack"}),                       # reserved byte
            (b"\xa3\xff\xfe\xfd", {"bad_msgpack"}),           # str that is not UTF-8
        ])
        return self._mod(), self._key(), raw, reasons

    def bad_strings(self) -> tuple[str, bytes | None, bytes | None, set[str]]:
        m = self._mod()
        sid, d = self._base(m)
        how = self.rng.randrange(3)
        if how == 0:
            sid = d["stream_id"] = "s" * self.rng.choice([257, 1000])
            return m, sid.encode(), _pack(d), {"schema"}
        if how == 1:
            d["stream_id"] = ""
            return m, b"", _pack(d), {"schema"}
        d["trace_id"] = "t" * 129
        return m, sid.encode(), _pack(d), {"too_large"}

    def kinds(self) -> list[tuple[str, Callable[[], Any], float]]:
        return [(name, getattr(self, name), w) for name, w in (
            ("random_bytes", 3.0), ("truncated", 2.0), ("wrong_type", 2.0),
            ("missing_field", 1.0), ("unknown_version", 1.0), ("corrupt_image", 1.5),
            ("fmt_mismatch", 0.5), ("bad_pcm", 1.5), ("bad_ts", 1.0), ("key_mismatch", 1.0),
            ("nil_key_garbage", 0.5), ("tombstone", 0.3), ("msgpack_oddities", 1.0),
            ("bad_strings", 0.5))]


@ON_BOTH
async def test_fuzz_every_bad_record_dead_lettered_every_good_one_merged(pipeline):
    s = pipeline.settings
    await ensure_topics(s)
    # The bad records slow each modality's agent by a different amount: a longer idle
    # time keeps a lagging modality holding the watermark, so its good records are
    # merged rather than late (late is also accounted, but not what is tested here).
    worker = pipeline.start_worker(MMSYNC_MODELS="light", MMSYNC_IDLE_MS="8000")
    rng = random.Random(SEED)

    specs = [SynthSpec(stream_id="fz-a", seconds=6, seed=31, audio_skew_us=100_000),
             SynthSpec(stream_id="fz-b", seconds=6, seed=32, sr=22050, ch=2, jitter_us=5_000)]
    per_stream = {sp.stream_id: synth_events(sp)[0] for sp in specs}
    good: list[tuple[str, bytes | None, bytes]] = []
    for sid, evs in per_stream.items():
        good.extend((e.modality, sid.encode(), encode_event(e)) for e in evs)
    # valid text sent with no key: refused (unkeyed records would land on any partition)
    nokey = [("nil_key", "text", None, encode_event(TextEvent(
        stream_id="fz-nokey", ts=2_000_000_000 + i * 400_000, seq=i, text=f"no key {i}",
        dur=200_000)), {"key_mismatch"}) for i in range(6)]
    by_mod: dict[str, list[bytes]] = defaultdict(list)
    for m, _, v in good:
        by_mod[m].append(v)

    fz = _Fuzzer(rng, [sp.stream_id for sp in specs], by_mod)
    kinds = fz.kinds()
    names, fns, weights = zip(*kinds, strict=True)
    bad: list[tuple[str, str, bytes | None, bytes | None, set[str]]] = []
    for _ in range(N_BAD):
        i = rng.choices(range(len(kinds)), weights=weights)[0]
        bad.append((names[i], *fns[i]()))
    # the expensive ones, a fixed few
    for name, fn, n in (("big_image", fz.big_image, 2), ("big_audio", fz.big_audio, 1),
                        ("big_text", fz.big_text, 20)):
        bad.extend((name, *fn()) for _ in range(n))
    bad.extend(nokey)
    dups = rng.sample([g for g in good if g[1] is not None], 20)

    # one sequence: good records in their order, bad ones and re-sent duplicates
    # sprinkled in at random places
    seq: list[tuple[str, str, bytes | None, bytes | None, set[str]]] = [
        ("good", m, k, v, set()) for m, k, v in good]
    for item in bad:
        seq.insert(rng.randrange(len(seq) + 1), item)
    for m, k, v in dups:  # re-sent after the original, or it would be the duplicate
        after = next(i for i, it in enumerate(seq) if it[0] == "good" and it[3] == v)
        seq.insert(rng.randrange(after + 1, len(seq) + 1), ("duplicate", m, k, v, set()))

    t0 = time.monotonic()
    sent: dict[tuple[str, int, int], tuple[str, str, bytes | None, bytes | None, set[str]]] = {}
    producer = make_producer(s)
    await producer.start()
    try:
        pending = []
        for item in seq:
            _kind, m, k, v, _ = item
            pending.append((item, await producer.send(s.topic(m), key=k, value=v)))
            if len(pending) >= 512:
                for it, f in pending:
                    md = await f
                    sent[(md.topic, md.partition, md.offset)] = it
                pending.clear()
        for it, f in pending:
            md = await f
            sent[(md.topic, md.partition, md.offset)] = it
    finally:
        await producer.stop()
    publish_s = time.monotonic() - t0
    assert len(sent) == len(seq)
    n_good = sum(1 for it in sent.values() if it[0] == "good")
    n_dup = sum(1 for it in sent.values() if it[0] == "duplicate")
    n_bad = len(sent) - n_good - n_dup
    expect = len(sent) - n_dup  # a duplicate is counted in metrics, not merged twice

    out = await collect(s, until=lambda o: o.accounted >= expect, timeout_s=150)
    took = time.monotonic() - t0
    log = (pipeline.tmp / "worker0.log").read_text(errors="replace")
    assert out.accounted == expect, log[-3000:]

    # every bad record is on the dlq with its original bytes and a sensible reason
    table: Counter[tuple[str, str]] = Counter()
    wrong: list[str] = []
    for dl in out.dlq:
        kind, m, k, v, allowed = sent[(dl["source_topic"], dl["partition"], dl["offset"])]
        table[(kind, dl["error"])] += 1
        assert dl["value"] == v and dl["key"] == k, (kind, dl["error"], dl["detail"])
        if dl["error"] not in allowed:
            wrong.append(f"{kind} -> {dl['error']}: {dl['detail']}")
    print(f"\n{'kind':<18} {'error':<13} count")
    for (kind, err), n in sorted(table.items()):
        print(f"{kind:<18} {err:<13} {n}")
    assert not wrong, "\n".join(wrong[:20])
    assert len(out.dlq) == n_bad
    assert {kind for kind, _ in table} == {it[0] for it in bad}  # every kind seen

    # every good record merged into exactly one window
    in_windows = Counter(tuple(src) for w in out.windows for src in w["sources"])
    good_src = {(m, p, o) for (t, p, o), it in sent.items() if it[0] == "good"
                for m in [it[1]]}
    assert not out.late
    assert set(in_windows) == good_src
    assert max(in_windows.values()) == 1
    assert out.merged() == n_good

    metrics = pipeline.metrics(worker)
    dup_seen = sum(float(x) for x in re.findall(
        r'mmsync_events_total\{modality="\w+",outcome="duplicate"\} ([\d.]+)', metrics))
    assert dup_seen == n_dup

    # no crash, no restart
    assert worker.poll() is None
    hwm = peak_rss_bytes(worker.pid) // 1024
    assert "Traceback" not in log, log[-3000:]
    print(f"fuzz: tried {len(sent)} records ({n_good} good, {n_bad} bad, {n_dup} duplicates) "
          f"in {publish_s:.1f} s; dead-lettered {len(out.dlq)}, merged {out.merged()} into "
          f"{len(out.windows)} windows, duplicates dropped {int(dup_seen)}, replayed windows "
          f"dropped {out.duplicate_windows}; all out after {took:.1f} s; worker pid "
          f"{worker.pid} alive, peak RSS (VmHWM) {hwm / 1024:.0f} MiB")
