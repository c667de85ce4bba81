"""Byte-weighted LRU and LFU: the baselines the cache bench compares W-TinyLFU with (pure)."""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["LFUPolicy", "LRUPolicy"]


class LRUPolicy:
    """Byte-weighted least-recently-used: evicts from the cold end until the new entry fits."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._od: OrderedDict[bytes, int] = OrderedDict()
        self._bytes = 0

    @property
    def weighted_size(self) -> int:
        return self._bytes

    def __contains__(self, key: object) -> bool:
        return key in self._od

    def __len__(self) -> int:
        return len(self._od)

    def size_of(self, key: bytes) -> int | None:
        return self._od.get(key)

    def touch(self, key: bytes) -> bool:
        od = self._od
        if key in od:
            od.move_to_end(key)
            return True
        return False

    def admit(self, key: bytes, size: int) -> list[bytes]:
        if size > self.max_bytes:
            self.remove(key)
            return [key]
        od = self._od
        self._bytes += size - od.pop(key, 0)
        od[key] = size
        out: list[bytes] = []
        while self._bytes > self.max_bytes:
            k, s = od.popitem(last=False)
            self._bytes -= s
            out.append(k)
        return out

    def remove(self, key: bytes) -> int:
        s = self._od.pop(key, 0)
        self._bytes -= s
        return s


class LFUPolicy:
    """Byte-weighted in-cache LFU: evicts the least-counted entry (oldest first among equals).

    Counts live only while an entry is resident, the usual baseline (no history).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._freq: dict[bytes, int] = {}
        self._size: dict[bytes, int] = {}
        self._buckets: dict[int, OrderedDict[bytes, None]] = {}
        self._min = 0
        self._bytes = 0

    @property
    def weighted_size(self) -> int:
        return self._bytes

    def __contains__(self, key: object) -> bool:
        return key in self._size

    def __len__(self) -> int:
        return len(self._size)

    def size_of(self, key: bytes) -> int | None:
        return self._size.get(key)

    def _bump(self, key: bytes, f: int) -> None:
        b = self._buckets[f]
        del b[key]
        if not b:
            del self._buckets[f]
            if self._min == f:
                self._min = f + 1
        self._freq[key] = f + 1
        self._buckets.setdefault(f + 1, OrderedDict())[key] = None

    def touch(self, key: bytes) -> bool:
        f = self._freq.get(key)
        if f is None:
            return False
        self._bump(key, f)
        return True

    def admit(self, key: bytes, size: int) -> list[bytes]:
        f = self._freq.get(key, 0)
        self.remove(key)  # a rewrite keeps its count but never evicts itself
        if size > self.max_bytes:
            return [key]
        out: list[bytes] = []
        while self._bytes + size > self.max_bytes:
            if self._min not in self._buckets:
                self._min = min(self._buckets)
            victim = next(iter(self._buckets[self._min]))
            self.remove(victim)
            out.append(victim)
        f = max(f, 1)
        self._size[key] = size
        self._bytes += size
        self._freq[key] = f
        self._buckets.setdefault(f, OrderedDict())[key] = None
        self._min = min(self._min, f)  # a lower bound; refreshed when it names no bucket
        return out

    def remove(self, key: bytes) -> int:
        s = self._size.pop(key, None)
        if s is None:
            return 0
        f = self._freq.pop(key)
        b = self._buckets[f]
        del b[key]
        if not b:
            del self._buckets[f]
        self._bytes -= s
        return s
