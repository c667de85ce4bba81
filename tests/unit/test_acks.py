"""OrderedAcks: an event is acked only after every earlier one of its partition."""

from __future__ import annotations

from app.align.acks import OrderedAcks


class _Ev:
    def __init__(self, log: list[int], off: int) -> None:
        self.log, self.off = log, off

    def ack(self) -> None:
        self.log.append(self.off)


def test_out_of_order_completion_acks_in_offset_order():
    log: list[int] = []
    a = OrderedAcks()
    for off in range(5):
        a.hold(0, off, _Ev(log, off))
    a.hold(1, 7, _Ev(log, 7))
    assert a.done(0, 3) == 0 and a.done(0, 1) == 0 and log == []  # 0 still open
    assert a.done(1, 7) == 1 and log == [7]  # partitions are independent
    assert a.done(0, 0) == 2 and log == [7, 0, 1]  # 0, 1 done; 2 still open
    assert a.done(0, 2) == 2 and log == [7, 0, 1, 2, 3]
    assert a.waiting() == 1 and a.done(0, 99) == 0  # unknown offsets are ignored
    a.drop([0])
    assert a.waiting() == 0 and a.done(0, 4) == 0 and log == [7, 0, 1, 2, 3]
