"""Byte-weighted eviction policies for the feature cache (pure: no I/O, no RocksDB, no Faust).

:class:`WTinyLFU` is the cache's policy, after Caffeine (Einziger, Friedman and
Manes, "TinyLFU: A Highly Efficient Cache Admission Policy", 2017): a small LRU
admission window in front of a segmented LRU main area (probation and
protected), with a count-min frequency sketch deciding which of a window
victim and a probation victim stays. A hill climber resizes the window from
the hit rate, as Caffeine does, so recency-heavy traces get a larger window.
:class:`LRUPolicy` and :class:`LFUPolicy` are the baselines the bench
compares it with.

Every policy holds ``key -> size`` and is weighted by bytes: the budget is
bytes, not entries. All share one interface (:class:`Policy`): ``touch``
records a read and says whether the key is resident; ``admit`` inserts (or
resizes) a key and returns the keys to evict, possibly the new key itself;
``remove`` forgets a key. After every ``admit`` the resident bytes are at
most ``max_bytes`` (an entry larger than the budget is refused outright).

The sketch is in ``sketch.py``, the baselines in ``baselines.py``.
"""

from __future__ import annotations

import random
from collections import OrderedDict, deque
from typing import Protocol

from app.cache.baselines import LFUPolicy, LRUPolicy
from app.cache.sketch import FrequencySketch

__all__ = ["FrequencySketch", "LFUPolicy", "LRUPolicy", "Policy", "WTinyLFU"]

#: A candidate this frequent that loses still gets in 1 time in 128: without this,
#: an attacker who warms a victim's frequency could keep hot keys out (Caffeine's
#: hash-flooding defence).
_HASHDOS_FREQ = 6


class Policy(Protocol):
    """What :class:`~app.cache.store.FeatureCache` and the bench need of a policy."""

    max_bytes: int

    def touch(self, key: bytes) -> bool: ...
    def admit(self, key: bytes, size: int) -> list[bytes]: ...
    def remove(self, key: bytes) -> int: ...
    def size_of(self, key: bytes) -> int | None: ...
    def __contains__(self, key: object) -> bool: ...
    def __len__(self) -> int: ...
    @property
    def weighted_size(self) -> int: ...


class WTinyLFU:
    """Window TinyLFU, byte-weighted, with Caffeine's hill-climbing window.

    Args:
        max_bytes: the budget; resident bytes never exceed it after ``admit``.
        window_pct: initial share of the budget for the admission window (1%).
        protected_pct: share of the main area kept for entries read twice (80%).
        expected_entry_bytes: sizes the sketch (``max_bytes / this`` keys); the
            sketch doubles if more keys than its width are ever resident.
        adaptive: resize the window by hill climbing on the hit rate.
        seed: for the hash-flooding coin only, so runs are reproducible.
    """

    def __init__(self, max_bytes: int, *, window_pct: float = 0.01, protected_pct: float = 0.80,
                 expected_entry_bytes: int = 2048, adaptive: bool = True, seed: int = 0) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.max_bytes = max_bytes
        self._protected_pct = protected_pct
        self._window = window_pct * max_bytes  # float: the climber moves it in fractions
        # The climber never shrinks the window below where it started: at 0 a trace of
        # short bursts (held video frames) loses most of its hits before it climbs back.
        self._window_min = self._window
        self._set_limits()
        self.sketch = FrequencySketch(max(16, max_bytes // max(1, expected_entry_bytes)))
        self._win: OrderedDict[bytes, int] = OrderedDict()
        self._prob: OrderedDict[bytes, int] = OrderedDict()
        self._prot: OrderedDict[bytes, int] = OrderedDict()
        self._win_b = self._prob_b = self._prot_b = 0
        self._rng = random.Random(seed)
        self.adaptive = adaptive
        # Hill climber (Caffeine's defaults): one step per sketch sample of requests;
        # a step is 6.25% of the budget, decays by 2% a step, restarts on a 5-point swing.
        self._hits = self._misses = 0
        self._prev_rate = 0.0
        self._step = -0.0625 * max_bytes

    def _set_limits(self) -> None:
        self._window = min(max(self._window, self._window_min), 0.8 * self.max_bytes)
        self._win_max = int(self._window)
        self._prot_max = int(self._protected_pct * (self.max_bytes - self._win_max))

    @property
    def weighted_size(self) -> int:
        return self._win_b + self._prob_b + self._prot_b

    @property
    def window_bytes(self) -> int:
        """The window's current limit, bytes (moved by the climber)."""
        return self._win_max

    def __contains__(self, key: object) -> bool:
        return key in self._win or key in self._prob or key in self._prot

    def __len__(self) -> int:
        return len(self._win) + len(self._prob) + len(self._prot)

    def size_of(self, key: bytes) -> int | None:
        for seg in (self._win, self._prob, self._prot):
            s = seg.get(key)
            if s is not None:
                return s
        return None

    def touch(self, key: bytes) -> bool:
        self.sketch.increment(key)
        hit = True
        if key in self._win:
            self._win.move_to_end(key)
        elif key in self._prot:
            self._prot.move_to_end(key)
        elif key in self._prob:
            s = self._prob.pop(key)
            self._prob_b -= s
            self._prot[key] = s
            self._prot_b += s
            self._demote()
        else:
            hit = False
        if self.adaptive:
            if hit:
                self._hits += 1
            else:
                self._misses += 1
            if self._hits + self._misses >= self.sketch.sample:
                self._climb()
        return hit

    def _demote(self) -> None:
        # Protected overflow goes back to probation's hot end, where it must earn its place again.
        prot, prob = self._prot, self._prob
        while self._prot_b > self._prot_max and prot:
            k, s = prot.popitem(last=False)
            self._prot_b -= s
            prob[k] = s
            self._prob_b += s

    def _climb(self) -> None:
        n = self._hits + self._misses
        rate = self._hits / n
        change = rate - self._prev_rate
        amount = self._step if change >= 0 else -self._step
        if abs(change) >= 0.05:
            self._step = 0.0625 * self.max_bytes * (1 if amount >= 0 else -1)
        else:
            self._step = 0.98 * amount
        self._prev_rate = rate
        self._hits = self._misses = 0
        self._window += amount
        self._set_limits()
        self._demote()
        self._spill()  # a smaller window spills into probation; the total is unchanged

    def admit(self, key: bytes, size: int) -> list[bytes]:
        if size > self.max_bytes:
            self.remove(key)
            return [key]
        for seg, attr in ((self._win, "_win_b"), (self._prob, "_prob_b"), (self._prot, "_prot_b")):
            old = seg.get(key)
            if old is not None:  # a rewrite: same place, new size
                seg[key] = size
                seg.move_to_end(key)
                setattr(self, attr, getattr(self, attr) + size - old)
                break
        else:
            self._win[key] = size
            self._win_b += size
        if len(self) * 2 > self.sketch.width:
            # Far more keys than the sketch was sized for: it would saturate; grow it
            # (counts restart, once per doubling).
            self.sketch = FrequencySketch(len(self))
        out: list[bytes] = []
        self._demote()
        self._evict(out)
        return out

    def _spill(self) -> deque[bytes]:
        """Move window overflow to probation's hot end; these are the admission candidates."""
        win, prob = self._win, self._prob
        cands: deque[bytes] = deque()
        while self._win_b > self._win_max and win:
            k, s = win.popitem(last=False)
            self._win_b -= s
            prob[k] = s
            self._prob_b += s
            cands.append(k)
        return cands

    def _evict(self, out: list[bytes]) -> None:
        # Caffeine's evictFromMain, weighted: the newest candidate faces the coldest entries
        # of probation (then protected) that it would displace, as many as free its bytes.
        # It gets in only if it is more frequent than every one of them (ties keep the
        # incumbents); otherwise it alone goes, and none of them is evicted for nothing.
        cands = self._spill()
        freq = self.sketch.frequency
        while self.weighted_size > self.max_bytes:
            if not cands:
                out.append(self._evict_lru())
                continue
            cand = cands.pop()
            need = self.weighted_size - self.max_bytes
            victims: list[bytes] = []
            fv = 0
            for seg in (self._prob, self._prot):
                for k, sz in seg.items():
                    if k == cand:
                        continue
                    victims.append(k)
                    fv = max(fv, freq(k))
                    need -= sz
                    if need <= 0:
                        break
                if need <= 0:
                    break
            fc = freq(cand)
            if victims and (fc > fv or (fc >= _HASHDOS_FREQ and self._rng.getrandbits(7) == 0)):
                for k in victims:
                    self.remove(k)
                    out.append(k)
                gone = set(victims)
                while cands and cands[0] in gone:
                    cands.popleft()
            else:
                out.append(self._drop_prob(cand))

    def _drop_prob(self, key: bytes) -> bytes:
        self._prob_b -= self._prob.pop(key)
        return key

    def _evict_lru(self) -> bytes:
        for seg, attr in ((self._prob, "_prob_b"), (self._prot, "_prot_b"), (self._win, "_win_b")):
            if seg:
                k, s = seg.popitem(last=False)
                setattr(self, attr, getattr(self, attr) - s)
                return k
        raise AssertionError("over budget with nothing resident")

    def remove(self, key: bytes) -> int:
        for seg, attr in ((self._win, "_win_b"), (self._prob, "_prob_b"), (self._prot, "_prot_b")):
            s = seg.pop(key, None)
            if s is not None:
                setattr(self, attr, getattr(self, attr) - s)
                return s
        return 0
