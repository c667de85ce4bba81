"""Whether a silent modality is idle or only slow (pure).

The watermark waits for every modality that may still deliver records. A
modality heard from recently is active and holds it anyway; the question is
what a *silent* one means. Wall-clock silence alone cannot tell "nothing more
to come" from "the feature agent is busy" (models loading on a new worker, a
backlog of frames behind the image models, a takeover after a crash): taking
the second for the first closes windows early and turns seconds of frames
into late records.

So idleness comes from the input, as stream processors treat source
idleness: a modality is idle for a stream when the input partition it arrives
on has been processed to its end. The feature agents say how far they got in
:class:`schemas.features.ProgressMark` records on the features topic;
:class:`MarkBoard` keeps the newest per (modality, input partition).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from schemas.features import ProgressMark, is_drained

__all__ = ["IdleAfter", "MarkBoard", "ProgressView"]


class ProgressView(Protocol):
    def drained(self, modality: str, partition: int, now: float, since: float,
                via: int | None = None) -> bool:
        """Whether ``modality``'s input ``partition`` has nothing left to give at ``now``
        (wall s). ``since``: when the modality was last heard from for the stream asking,
        or when the stream was first seen if never; ``via``: the features partition that
        stream's records arrive on."""

    def covered(self, modality: str, partition: int, now: float, via: int | None = None
                ) -> float | None:
        """Up to when (wall s) a "drained" of ``modality``'s input ``partition`` read by
        ``now`` vouches: records made later may be in its log unseen. None: not known."""


@dataclass(frozen=True, slots=True)
class IdleAfter:
    """Silence alone (no progress marks): idle ``idle_s`` after the last record, or after
    the stream's first record for a modality never heard. What a worker did before
    progress marks; the pure aligner's default (tests, offline replays)."""

    idle_s: float

    def drained(self, modality: str, partition: int, now: float, since: float,
                via: int | None = None) -> bool:
        return now - since >= self.idle_s

    def covered(self, modality: str, partition: int, now: float, via: int | None = None
                ) -> float | None:
        return None


@dataclass(slots=True)
class _Seen:
    next_offset: int
    end: int
    #: wall time the aligner read it, s (not the sender's clock: a replayed mark is read
    #: again after a takeover, in order with the records it follows)
    received: float
    #: wall time ``next_offset`` last changed, s
    moved: float
    #: when the agent made the mark (its ``at``, us on the sender's clock): tells a mark
    #: read again in a replay from a new one
    at: int
    #: when the agent's consumer fetched ``end`` (us on the sender's clock); None: unknown
    polled: int | None = None


class MarkBoard:
    """The newest progress mark per (modality, input partition).

    A modality's input is *drained* when its newest mark says everything up to the end
    of the log was processed, and that mark is fresh (read within ``ttl_s``: agents send
    one every few hundred ms, so an older one means the agent stopped). Otherwise it holds
    the watermark, for at most ``max_hold_s`` without progress: since the last mark was
    read when marks stopped, since ``since`` when there never was one, since the agent's
    position last moved when it keeps saying it is behind (a wedged agent). Past that it
    is taken to be gone and the stream's windows close without it (its records, if they
    ever come, are late). A slow agent moves, so it holds as long as it is behind.

    A mark's end is the log's end as the agent last fetched it, and a mark can be read
    well after it was made: a feature record read from at or beyond that end
    (:meth:`heard`) proves the log grew since, so the mark no longer says the input is
    drained, however fresh it is, until a mark with a later end comes. Without this a
    broker restart closed windows early (Kafka, docs/broker.md): marks read just before
    the stop said "drained" at the ends of before the last load; the load's first
    features were read after them, then nothing for the outage, so no modality stayed
    active, and the stale marks closed the windows while the rest of the load was still
    to come.

    A mark vouches only for the features partition it was read from (``via``): an agent
    sends each mark to every features partition after the feature records it covers, so
    on one partition the records come before the mark, but across partitions nothing is
    ordered. Read from another partition, a "drained" mark can come while the records it
    covers still wait on the stream's own (a backlog there after a takeover, or fetches
    served out of order), and the stream's windows would close without them. So marks are
    kept per (features partition, modality, input partition). What the records read show
    (how far an input's log reached) holds whatever partition they came from.

    A mark read again is not news: after a rebalance the aligner reads its features
    partitions again from the committed offset, old marks and all, and a dead agent's
    last "drained" (made before it died, its input growing since) read then as fresh
    closed the stream's windows without the sound that was waiting for a survivor (CI of
    503242c, docs/broker.md). So a mark made no later than the newest one already kept
    for its key (by ``at``) changes nothing. ``at`` is the sender's clock: a survivor whose
    clock is behind the dead agent's has its marks ignored for that long, and the kept
    one goes stale meanwhile, which holds the windows (the safe side).

    Nor does a "drained" read less than ``after_s`` (one mark interval) after the
    modality was last heard (``since``) say that it is idle: it may be the last word of
    an agent killed right after it, whose input goes on growing for the survivor. It
    would have closed the stream's windows on the picture alone once the modality went
    silent, until ``ttl_s`` after the mark (0.5 s with the tests' ``idle_s`` of 1.5 s).
    A live agent's next mark, read an interval later, says it.

    And a "drained" is as old as the fetch that gave its end, not as its mark: records
    sent after that fetch may wait in the log unseen (a camera back on while the rest of
    its stream ran: docs/broker.md). :meth:`covered` gives that fetch's time, which the
    mark carries (``ProgressMark.polled``), for the aligner to bound an idle modality by;
    one older than ``max_hold_s`` (fetches that stopped) bounds nothing.
    """

    def __init__(self, ttl_s: float, max_hold_s: float, after_s: float = 0.0) -> None:
        self.ttl_s = ttl_s
        self.max_hold_s = max_hold_s
        #: a "drained" mark vouches for a silent modality only when read at least this long
        #: (s, an agent's mark interval) after the modality was last heard
        self.after_s = after_s
        self._seen: dict[tuple[int | None, str, int], _Seen] = {}
        #: (modality, input partition) -> highest input offset of a feature record read
        self._heard: dict[tuple[str, int], int] = {}

    def heard(self, modality: str, partition: int, offset: int) -> None:
        """A feature record of ``modality`` from input ``partition`` at ``offset`` was read,
        from any features partition (a duplicate or a late one too: each shows how far the
        log reached)."""
        key = (modality, partition)
        if offset > self._heard.get(key, -1):
            self._heard[key] = offset

    def update(self, mark: ProgressMark, now: float, via: int | None = None) -> None:
        """A mark read from features partition ``via``."""
        for p, (nxt, end) in mark.parts.items():
            key = (via, mark.modality, p)
            old = self._seen.get(key)
            if old is not None and mark.at <= old.at:
                continue  # read again (a replay), or overtaken: the kept one is newer
            if end < 0:
                # the agent lost track of the partition (newly assigned, or its log made
                # again with offsets from 0): what was read of the old log proves nothing
                self._heard.pop((mark.modality, p), None)
            moved = old.moved if old is not None and old.next_offset == nxt else now
            self._seen[key] = _Seen(nxt, end, now, moved, mark.at, mark.polled.get(p))

    def drained(self, modality: str, partition: int, now: float, since: float,
                via: int | None = None) -> bool:
        key = (via, modality, partition)
        seen = self._seen.get(key)
        if seen is None:
            return now - since >= self.max_hold_s
        if now - seen.received > self.ttl_s:  # the agent stopped sending
            return now - seen.received >= self.max_hold_s
        if (is_drained(seen.next_offset, seen.end)
                and self._heard.get((modality, partition), -1) < seen.end
                and seen.received - since >= self.after_s):
            return True
        return now - seen.moved >= self.max_hold_s  # behind: holds while it moves

    def covered(self, modality: str, partition: int, now: float, via: int | None = None
                ) -> float | None:
        seen = self._seen.get((via, modality, partition))
        if seen is None or seen.polled is None or now - seen.polled / 1e6 > self.max_hold_s:
            return None  # unknown, or the fetches stopped: no longer than any hold
        return seen.polled / 1e6
