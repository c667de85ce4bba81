"""OrderedAcks: an offset is released only after every earlier one of its partition."""

from __future__ import annotations

from app.align.acks import OrderedAcks


def test_out_of_order_completion_releases_in_offset_order():
    a = OrderedAcks()
    for off in range(5):
        a.hold(0, off)
    a.hold(1, 7)
    assert a.done(0, 3) == [] and a.done(0, 1) == []  # 0 still open
    assert a.done(1, 7) == [7]  # partitions are independent
    assert a.done(0, 0) == [0, 1]  # 0, 1 done; 2 still open
    assert a.done(0, 2) == [2, 3]
    assert a.waiting() == 1 and a.done(0, 99) == []  # unknown offsets are ignored
    a.drop([0])
    assert a.waiting() == 0 and a.done(0, 4) == []
