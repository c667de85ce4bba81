"""FeatureCache on RocksDB in tmp_path: TTLs on a fake clock, budget, restart, threads, rot."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from rocksdict import Options, Rdict

from app.cache import HEADER_BYTES, FeatureCache, LRUPolicy, Policy, content_key
from app.runtime.metrics import Metrics
from app.settings import Settings, default_cache_bytes

TTL = {"image": 10, "audio": 20, "text": 100}


class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _open(path: Path, clock: Clock, max_bytes: int = 1 << 20, metrics: Metrics | None = None,
          policy: Policy | None = None) -> FeatureCache:
    return FeatureCache(path, max_bytes, TTL, clock=clock, metrics=metrics, policy=policy)


def _raw_items(path: Path) -> dict[bytes, bytes]:
    db = Rdict(str(path), options=Options(raw_mode=True))
    try:
        out = {}
        for k, v in db.items():
            assert isinstance(k, bytes) and isinstance(v, bytes)
            out[k] = v
        return out
    finally:
        db.close()


def _k(i: int, modality: str = "text") -> bytes:
    return content_key(modality, f"input {i}".encode(), "m1")


def test_content_key_depends_on_modality_model_and_bytes() -> None:
    k = content_key("text", b"hello", "v1")
    assert len(k) == 16 and k == content_key("text", b"hello", "v1")
    assert len({k, content_key("image", b"hello", "v1"), content_key("text", b"hello", "v2"),
                content_key("text", b"hello!", "v1")}) == 4


def test_put_get_hit_and_miss(tmp_path: Path) -> None:
    with _open(tmp_path / "c", Clock()) as c:
        assert c.lookup("text", _k(1)) == (None, "miss")
        c.put("text", _k(1), b"features")
        assert c.lookup("text", _k(1)) == (b"features", "hit")
        assert c.get("audio", _k(1)) is None  # same digest, other modality: another entry
        st = c.stats()
        assert (st.hits, st.misses, st.entries) == (1, 2, 1)
        assert st.bytes == 1 + 16 + HEADER_BYTES + len(b"features")


def test_ttl_per_modality_expires_on_read(tmp_path: Path) -> None:
    clock = Clock()
    with _open(tmp_path / "c", clock) as c:
        c.put("image", _k(1, "image"), b"img")
        c.put("text", _k(1), b"txt")
        clock.t += 9.9
        assert c.get("image", _k(1, "image")) == b"img"
        clock.t += 0.2  # image's 10 s are up; text has 100
        assert c.lookup("image", _k(1, "image")) == (None, "expired")
        assert c.lookup("image", _k(1, "image")) == (None, "miss")  # deleted, not re-expired
        assert c.get("text", _k(1)) == b"txt"
        st = c.stats()
        assert (st.expired, st.expirations, st.entries) == (1, 1, 1)


def test_sweep_removes_expired_entries_without_reads(tmp_path: Path) -> None:
    clock = Clock()
    with _open(tmp_path / "c", clock) as c:
        for i in range(5):
            c.put("audio", _k(i, "audio"), b"a" * 100)
        c.put("text", _k(0), b"t")
        clock.t += 21
        assert c.sweep() == 5
        st = c.stats()
        assert (st.entries, st.expirations) == (1, 5)
        assert st.expired == 0  # nobody asked for them
    assert len(_raw_items(tmp_path / "c")) == 1


def test_sweep_rides_on_puts(tmp_path: Path) -> None:
    clock = Clock()
    with _open(tmp_path / "c", clock) as c:
        c.put("image", _k(1, "image"), b"x")
        clock.t += 11
        c.put("text", _k(2), b"y")
        assert c.stats().expirations == 1 and c.stats().entries == 1


def test_budget_held_on_rocksdb(tmp_path: Path) -> None:
    budget = 40_000
    with _open(tmp_path / "c", Clock(), max_bytes=budget) as c:
        for i in range(2400):
            # A hot score of keys among colder ones; half-way the hot score changes, so
            # the new favourites must evict the old ones.
            j = (i // 2) % 150 if i % 2 else (i // 2) % 20 + (1000 if i >= 1200 else 0)
            if c.get("text", _k(j)) is None:
                c.put("text", _k(j), bytes([j % 256]) * (500 + (j * 37) % 1500))
            assert c.stats().bytes <= budget
        st = c.stats()
        assert st.evictions > 0 and st.hits > 0
        assert sum(c.get("text", _k(1000 + j)) is not None for j in range(20)) >= 15
    on_disk = _raw_items(tmp_path / "c")
    assert sum(len(k) + len(v) for k, v in on_disk.items()) == st.bytes <= budget
    assert len(on_disk) == st.entries


def test_restart_keeps_entries_and_drops_expired(tmp_path: Path) -> None:
    clock = Clock()
    with _open(tmp_path / "c", clock) as c:
        c.put("text", _k(1), b"kept")
        c.put("image", _k(2, "image"), b"gone")
        before = c.stats().bytes
    clock.t += 50  # past image's TTL, within text's
    with _open(tmp_path / "c", clock) as c:
        assert c.get("text", _k(1)) == b"kept"
        st = c.stats()
        assert st.entries == 1 and st.expirations == 1
        assert st.bytes < before
        assert c.get("image", _k(2, "image")) is None


def test_restart_with_smaller_budget_evicts_down(tmp_path: Path) -> None:
    clock = Clock()
    with _open(tmp_path / "c", clock) as c:
        for i in range(50):
            c.put("text", _k(i), b"z" * 1000)
    with _open(tmp_path / "c", clock, max_bytes=10_000) as c:
        assert c.stats().bytes <= 10_000
    assert sum(len(k) + len(v) for k, v in _raw_items(tmp_path / "c").items()) <= 10_000


def test_corrupt_entry_is_dropped_and_reported(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    with _open(tmp_path / "c", Clock(), metrics=Metrics(registry)) as c:
        c.put("text", _k(1), b"good")
        c.put("text", _k(2), b"good too")
        c._db[c._dbkey("text", _k(1))] = b"garbage"  # not even a header
        raw = bytearray(c._db.get(c._dbkey("text", _k(2))) or b"")
        raw[-1] ^= 0xFF  # a flipped payload bit: the checksum catches it
        c._db[c._dbkey("text", _k(2))] = bytes(raw)
        assert c.lookup("text", _k(1)) == (None, "corrupt")
        assert c.lookup("text", _k(2)) == (None, "corrupt")
        assert c.lookup("text", _k(1)) == (None, "miss")
        assert c.stats().corrupt == 2 and c.stats().entries == 0
    sample = registry.get_sample_value
    assert sample("mmsync_cache_requests_total", {"modality": "text", "result": "corrupt"}) == 2
    assert _raw_items(tmp_path / "c") == {}


def test_corrupt_entry_found_on_open_is_dropped(tmp_path: Path) -> None:
    with _open(tmp_path / "c", Clock()) as c:
        c.put("text", _k(1), b"good")
    db = Rdict(str(tmp_path / "c"), options=Options(raw_mode=True))
    db[b"\x03" + _k(9)] = b"\x00" * 40
    db.close()
    with _open(tmp_path / "c", Clock()) as c:
        st = c.stats()
        assert (st.entries, st.dropped_on_open) == (1, 1)
        assert c.get("text", _k(1)) == b"good"


def test_three_extractor_threads_share_one_cache(tmp_path: Path) -> None:
    budget = 60_000
    c = _open(tmp_path / "c", Clock(), max_bytes=budget)
    errors: list[BaseException] = []
    hits = {m: 0 for m in TTL}

    def worker(modality: str) -> None:
        try:
            for i in range(1500):
                key = _k(i % 97, modality)  # recurring inputs: hits and evictions both happen
                want = key * (1 + i % 97 % 40)
                got = c.get(modality, key)
                if got is None:
                    c.put(modality, key, want)
                else:
                    assert got == want
                    hits[modality] += 1
                assert c.stats().bytes <= budget
        except BaseException as exc:  # any failure in a thread must fail the test
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(m,)) for m in TTL]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    st = c.stats()
    c.close()
    assert errors == []
    assert all(hits.values()) and st.evictions > 0
    assert st.bytes <= budget


def test_metrics_count_results_evictions_and_bytes(tmp_path: Path) -> None:
    clock = Clock()
    registry = CollectorRegistry()
    with _open(tmp_path / "c", clock, max_bytes=5_000, metrics=Metrics(registry),
               policy=LRUPolicy(5_000)) as c:
        for i in range(10):
            c.put("audio", _k(i, "audio"), b"p" * 1000)
        c.get("audio", _k(9, "audio"))
        clock.t += 21
        c.get("audio", _k(9, "audio"))
        bytes_now = c.stats().bytes
    sample = registry.get_sample_value
    assert (sample("mmsync_cache_evictions_total", {"modality": "audio"}) or 0) >= 5
    assert (sample("mmsync_cache_expirations_total", {"modality": "audio"}) or 0) >= 1
    assert sample("mmsync_cache_requests_total", {"modality": "audio", "result": "hit"}) == 1
    assert sample("mmsync_cache_bytes") == bytes_now


def test_defaults_and_from_settings(tmp_path: Path) -> None:
    with FeatureCache(tmp_path / "d") as c:
        assert c.max_bytes == default_cache_bytes()
    s = Settings(data_dir=tmp_path, cache_max_bytes=123_456, text_ttl_s=7)
    with FeatureCache.from_settings(s) as c:
        assert c.max_bytes == 123_456
        assert (tmp_path / "cache").is_dir()
    with pytest.raises(ValueError, match="unknown modality"):
        c.get("smell", b"x")
