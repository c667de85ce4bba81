"""A mapping that keeps only its most recently used keys (per-stream state, memos).

Workers serve ever new streams; every per-stream memory (the previous frame, the
VAD's state, an image anchor) is bounded by one of these instead of growing
with the number of streams ever seen.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["LRU"]

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    """At most ``maxlen`` entries; reading or writing a key makes it the newest, and the
    oldest is dropped when a new key would exceed ``maxlen``."""

    def __init__(self, maxlen: int) -> None:
        if maxlen < 1:
            raise ValueError("maxlen must be >= 1")
        self.maxlen = maxlen
        self._d: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        if key not in self._d:
            return None
        self._d.move_to_end(key)
        return self._d[key]

    def get_or_create(self, key: K, factory: Callable[[], V]) -> V:
        got = self.get(key)
        if got is None:
            got = factory()
            self.put(key, got)
        return got

    def put(self, key: K, value: V) -> K | None:
        """Store ``value`` as the newest; returns the key dropped to make room, if any."""
        self._d[key] = value
        self._d.move_to_end(key)
        if len(self._d) > self.maxlen:
            return self._d.popitem(last=False)[0]
        return None

    def pop(self, key: K) -> V | None:
        return self._d.pop(key, None)

    def clear(self) -> None:  # scripts/benchlib/naive.py empties the text memo per record
        self._d.clear()

    def __contains__(self, key: object) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)

    def __iter__(self) -> Iterator[K]:
        return iter(self._d)
