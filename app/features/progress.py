"""How far one feature agent got through its input partitions (pure).

The agent tells :class:`InputProgress` where each assigned partition starts
(the group's committed offset: everything before it was processed by an
earlier owner) and which offsets it has processed (features sent, or dead
letters); :meth:`InputProgress.mark` turns that and the partitions' end
offsets into a :class:`schemas.features.ProgressMark` for the aligner. A
partition whose start is not known yet, or whose end has not been fetched
yet, is reported as behind: the aligner then keeps waiting, which is the safe
side (app.align.progress).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from schemas.features import ProgressMark

__all__ = ["InputProgress"]


class InputProgress:
    """Per assigned input partition: the next offset to process."""

    def __init__(self, modality: str) -> None:
        self.modality = modality
        #: partition -> next offset to process; None until its start is known
        self._next: dict[int, int | None] = {}

    def assigned(self, partitions: Iterable[int]) -> list[int]:
        """Track the current assignment; returns the partitions whose start is unknown."""
        now = set(partitions)
        for p in set(self._next) - now:
            del self._next[p]
        for p in now - set(self._next):
            self._next[p] = None
        return sorted(p for p, n in self._next.items() if n is None)

    def started(self, partition: int, offset: int) -> None:
        """Consumption of ``partition`` starts at ``offset`` (committed, or the log start)."""
        if partition in self._next:
            cur = self._next[partition]
            self._next[partition] = offset if cur is None else max(cur, offset)

    def processed(self, partition: int, offset: int) -> None:
        """The record at ``offset`` is done (its features or dead letter were sent)."""
        cur = self._next.get(partition)
        self._next[partition] = offset + 1 if cur is None else max(cur, offset + 1)

    def behind(self, ends: Mapping[int, int]) -> int:
        """Records not processed yet in the assigned partitions, by ``ends`` (end offsets as
        last fetched); a partition whose start or end is not known counts 0."""
        n = 0
        for p, nxt in self._next.items():
            end = ends.get(p)
            if nxt is not None and end is not None:
                n += max(0, end - nxt)
        return n

    def mark(self, ends: Mapping[int, int], at_us: int,
             polled: Mapping[int, int] | None = None) -> ProgressMark | None:
        """The mark for the current assignment; ``ends``: end offsets as last fetched,
        ``polled``: when each was fetched (wall-clock us). None when nothing is assigned."""
        if not self._next:
            return None
        parts: dict[int, tuple[int, int]] = {}
        for p, nxt in self._next.items():
            end = ends.get(p)
            if nxt is not None and end is not None and end < nxt:
                # the log ends before what we processed: it was recreated (an in-memory
                # broker restarted); where consumption starts must be found again
                self._next[p] = nxt = None
            if nxt is None or end is None:
                parts[p] = (-1, -1)  # unknown: behind
            else:
                parts[p] = (nxt, end)
        known = {p: int(us) for p, us in (polled or {}).items() if p in parts}
        return ProgressMark(modality=self.modality, parts=parts, at=at_us, polled=known)
