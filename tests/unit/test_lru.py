"""LRU: the bound on every per-stream memory."""

from __future__ import annotations

import pytest

from app.lru import LRU


def test_oldest_by_use_is_dropped():
    c: LRU[str, int] = LRU(2)
    assert c.put("a", 1) is None and c.put("b", 2) is None
    assert c.get("a") == 1  # a is now the newest
    assert c.put("c", 3) == "b" and "b" not in c and list(c) == ["a", "c"]
    assert c.get_or_create("a", lambda: 9) == 1 and c.get_or_create("d", lambda: 4) == 4
    assert list(c) == ["a", "d"] and len(c) == 2 and c.pop("a") == 1 and c.get("a") is None
    with pytest.raises(ValueError):
        LRU(0)
