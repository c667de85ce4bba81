"""Replay seeded cache traces at one byte budget: W-TinyLFU against plain LRU and LFU.

    .venv/bin/python scripts/bench_cache.py            # full run, about a minute on 2 cores
    .venv/bin/python scripts/bench_cache.py --quick    # a few seconds

Prints, per trace, the request hit ratio of each policy, W-TinyLFU's lead over
each baseline in percentage points, and each policy's ops/s (pure Python, one
thread, a get then a put on a miss). Then the full FeatureCache on RocksDB in a
temporary directory replays the first trace (get, and put on a miss).

Traces (deterministic for a seed):
  zipf      Zipf(0.9) over 100k keys.
  zipf+scan Zipf(0.9) over 20k keys, 3k requests at a time, each run followed by a scan
            of 3k one-off keys (~8 MB, a budget's worth: LRU's bad case, a backfill).
  video     frames held for 1-5 ticks, recurring ads and jingles (frames and audio),
            captions drawn from a heavy-skewed Zipf(1.1), speech audio mostly unique.
Sizes: each key has a fixed size by modality: image ~5 KB, audio ~2 KB, text ~1 KB (+-20%).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.cache import FeatureCache, LFUPolicy, LRUPolicy, Policy, WTinyLFU  # noqa: E402

_SIZE = {"image": 5000, "audio": 2000, "text": 1000}
_MODS = ("image", "audio", "text")


@dataclass
class Trace:
    name: str
    keys: list[bytes]
    sizes: list[int]
    mods: list[str]


class _Keys:
    """Random 16-byte keys (like content digests), each with a modality and a fixed size."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.keys: list[bytes] = []
        self.sizes: list[int] = []
        self.mods: list[str] = []

    def new(self, n: int, mod: str | None = None) -> np.ndarray:
        raw = self.rng.bytes(16 * n)
        first = len(self.keys)
        self.keys.extend(raw[16 * i:16 * i + 16] for i in range(n))
        ms = [mod] * n if mod else [_MODS[i] for i in self.rng.integers(0, 3, n)]
        jitter = self.rng.uniform(0.8, 1.2, n)
        self.sizes.extend(int(_SIZE[m] * j) for m, j in zip(ms, jitter, strict=True))
        self.mods.extend(ms)
        return np.arange(first, first + n)

    def trace(self, name: str, ids: np.ndarray) -> Trace:
        return Trace(name, [self.keys[i] for i in ids], [self.sizes[i] for i in ids],
                     [self.mods[i] for i in ids])


def _zipf(rng: np.random.Generator, n: int, s: float, size: int) -> np.ndarray:
    cdf = np.cumsum(1.0 / np.arange(1, n + 1) ** s)
    return np.searchsorted(cdf, rng.random(size) * cdf[-1])


def zipf_trace(n_req: int, seed: int) -> Trace:
    k = _Keys(np.random.default_rng(seed))
    ids = k.new(100_000)
    return k.trace("zipf", ids[_zipf(k.rng, len(ids), 0.9, n_req)])


def scan_trace(n_req: int, seed: int, hot_keys: int = 20_000, block: int = 3_000,
               scan: int = 3_000) -> Trace:
    """Blocks of ``block`` Zipf(0.9) requests over ``hot_keys``, each followed by ``scan``
    one-off keys: about 8 MB, the default budget, so every scan flushes an LRU."""
    k = _Keys(np.random.default_rng(seed))
    hot = k.new(hot_keys)
    parts: list[np.ndarray] = []
    total = 0
    while total < n_req:
        parts.append(hot[_zipf(k.rng, len(hot), 0.9, block)])
        parts.append(k.new(scan))
        total += block + scan
    return k.trace("zipf+scan", np.concatenate(parts)[:n_req])


def video_trace(n_req: int, seed: int) -> Trace:
    """About 2.4 requests a tick: a frame, an audio chunk, a caption every third tick."""
    k = _Keys(np.random.default_rng(seed))
    rng = k.rng
    ads = [(k.new(40, "image"), k.new(40, "audio")) for _ in range(60)]  # 2 s spots at 20 Hz
    jingles = [(k.new(10, "image"), k.new(10, "audio")) for _ in range(5)]
    captions = k.new(20_000, "text")
    out: list[int] = []
    frame = int(k.new(1, "image")[0])
    hold = 0
    tick = 0
    while len(out) < n_req:
        if tick % 1200 == 0:  # an ad break every minute: three spots, popular ones recur most
            for a in _zipf(rng, len(ads), 1.0, 3):
                for f, au in zip(*ads[a], strict=True):
                    out.extend((int(f), int(au)))
        if tick % 300 == 0:  # a station jingle every 15 s
            j = jingles[int(rng.integers(0, len(jingles)))]
            for f, au in zip(*j, strict=True):
                out.extend((int(f), int(au)))
        if hold == 0:  # a new frame; static shots repeat the same bytes for a few ticks
            frame, hold = int(k.new(1, "image")[0]), int(rng.integers(1, 6))
        hold -= 1
        out.append(frame)
        out.append(int(k.new(1, "audio")[0]))  # speech: unique
        if tick % 3 == 0:  # captions: a few recur constantly (tickers, names), most rarely
            if rng.random() < 0.7:
                out.append(int(captions[_zipf(rng, len(captions), 1.1, 1)[0]]))
            else:
                out.append(int(k.new(1, "text")[0]))
        tick += 1
    return k.trace("video", np.array(out[:n_req]))


def replay(policy: Policy, t: Trace) -> tuple[float, float]:
    """(hit ratio, ops/s): a get per request, a put on each miss."""
    touch, admit = policy.touch, policy.admit
    hits = 0
    t0 = time.perf_counter()
    for key, size in zip(t.keys, t.sizes, strict=True):
        if touch(key):
            hits += 1
        else:
            admit(key, size)
    dt = time.perf_counter() - t0
    assert policy.weighted_size <= policy.max_bytes
    return hits / len(t.keys), len(t.keys) / dt


def replay_store(t: Trace, budget: int, n: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as d:
        cache = FeatureCache(Path(d) / "cache", budget, {m: 3600 for m in _MODS})
        payload = bytes(range(256)) * 40
        hits = 0
        t0 = time.perf_counter()
        for key, size, mod in zip(t.keys[:n], t.sizes[:n], t.mods[:n], strict=True):
            if cache.get(mod, key) is not None:
                hits += 1
            else:
                cache.put(mod, key, payload[:size])
        dt = time.perf_counter() - t0
        st = cache.stats()
        cache.close()
        assert st.bytes <= budget
        return hits / n, n / dt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="short traces (a smoke run)")
    ap.add_argument("--budget-mib", type=float, default=8.0, help="cache budget, MiB")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    n = 60_000 if a.quick else 400_000
    n_store = 20_000 if a.quick else 100_000
    budget = int(a.budget_mib * (1 << 20))
    makers: list[Callable[[int, int], Trace]] = [zipf_trace, scan_trace, video_trace]
    policies: list[tuple[str, Callable[[], Policy]]] = [
        ("W-TinyLFU", lambda: WTinyLFU(budget, expected_entry_bytes=2600)),
        ("LRU", lambda: LRUPolicy(budget)),
        ("LFU", lambda: LFUPolicy(budget)),
    ]
    print(f"budget {budget / (1 << 20):.1f} MiB, {n} requests per trace, seed {a.seed}")
    hdr = (f"{'trace':<10} {'W-TinyLFU':>9} {'LRU':>7} {'LFU':>7} {'vs LRU':>8} {'vs LFU':>8}"
           f" {'W-TinyLFU/LRU':>13} | {'ops/s W-TinyLFU':>15} {'LRU':>9} {'LFU':>9}")
    print(hdr)
    print("-" * len(hdr))
    first: Trace | None = None
    ok = True
    for make in makers:
        t = make(n, a.seed)
        first = first or t
        res = [replay(f(), t) for _, f in policies]
        (w, wo), (lru, lo), (lfu, fo) = res
        print(f"{t.name:<10} {w:9.2%} {lru:7.2%} {lfu:7.2%} {100 * (w - lru):+7.2f}p"
              f" {100 * (w - lfu):+7.2f}p {w / lru if lru else float('inf'):13.2f} |"
              f" {wo:15,.0f} {lo:9,.0f} {fo:9,.0f}")
        ok &= w >= lru and w >= lfu and (t.name != "zipf+scan" or w - lru >= 0.10)
    assert first is not None
    hr, ops = replay_store(first, budget, n_store)
    print(f"\nFeatureCache on RocksDB ({first.name}, {n_store} requests, get + put on miss):"
          f" hit ratio {hr:.2%}, {ops:,.0f} requests/s")
    verdict = "met" if ok else "MISSED"
    if a.quick:
        verdict += " (judged on the full run: --quick traces are mostly warm-up)"
    print("goals (W-TinyLFU >= LRU and >= LFU everywhere, +10 points over LRU on zipf+scan):",
          verdict)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
