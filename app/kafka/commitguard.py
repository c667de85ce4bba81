"""No offset commit from a group consumer that is not a member of its group.

aiokafka resets a consumer's generation to -1 (and its member id to "") when the
coordinator no longer knows it (``reset_generation``: a heartbeat answered
UnknownMemberId), and a commit sent before the consumer has joined again goes
out with generation -1. Kafka's coordinator takes such a commit, as a commit of
a consumer outside any group, whenever the group has no members (KAFKA-2596):
after a broker restart that lost the group, that is always. The commit names
offsets of the logs before the outage; the group then joins, seeks to them, and
skips as many records of the new logs. Seen on the embedded broker (in memory:
a restart empties every log): the first records of a load published after the
restart never came out (CI, 2026-12-05: 91 of 94, the first record of three
partitions).

A consumer that takes its partitions from the group owns nothing while it has
no generation, so a commit then is never right: this refuses it as the broker
would for a stale member (UnknownMemberIdError, which aiokafka turns into
CommitFailedError "...already rebalanced..." and Faust drops). Consumers with
partitions assigned by hand (no group membership) keep committing with
generation -1, as Kafka allows them.

No commit past a held record either. Faust's ``Stream.take_events`` acks the
batch it yielded in a ``finally``, whatever ended the loop: an agent cancelled
at shutdown (SIGTERM) or on a rebalance, or one that raised (a
``DeliveryError``). Its outputs never reached the broker, yet the worker's last
commit covered it: two image frames of each of two partitions lost when a
worker left under load (test_faults.py, join/leave, 1 run in 3 with a busy
core, 2026-12-05). :func:`hold` takes one more reference on each message of such
a batch (``Message.incref``, as Faust's conductor does for a message several
streams share), so that ack is not the final one; and it notes the lowest held
offset per partition, because a held message is no longer tracked once the
batch is freed (Faust's ``_unacked_messages`` is a WeakSet) and Faust's commit
skips one unacked offset at the head of the acked ones (``min(acked) -
committed > 1``: faust-streaming issue 606, open upstream in 0.15.3). Commits
stop below the hold until the generation changes; the next owner replays from
there (at least once).

No ack of a record fetched before a rebalance counts either. Faust acks every record
a stream skips because it was fetched in an earlier generation or while the flow was
stopped for a rebalance (``Stream.__aiter__``: "otherwise the lag would increase"),
and ``Consumer.ack`` records it whatever its generation. Faust clears a partition's
acks and committed offset when it is revoked; a skipped record acked after that was
counted from nothing (no committed offset to check against), so the commit timer, still
running through the rebalance, could commit past the records the aligner had held
open below it: they left the unacked set (a WeakSet) when the aligner dropped its
windows on the revoke. Kafka takes such a commit while the group is still preparing
the rebalance. Seen as two image frames "lost in the aligner" when a worker joined and
one left under load (CI, 2026-12-06, Tansu). The record is replayed from the committed
offset by whoever holds its partition next, which is what acks it then.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from typing import Any

from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.errors import UnknownMemberIdError
from faust.transport.consumer import Consumer
from mode.utils.futures import notify

__all__ = ["hold", "install"]

log = logging.getLogger(__name__)

_MARK = "_mmsync_commit_guard"
#: per Faust consumer: TP -> (lowest held offset, the generation it was fetched in)
_HOLDS = "_mmsync_holds"
#: per Faust consumer, during one commit's filtering: TP -> lowest open offset (_open_low)
_OPEN = "_mmsync_open_low"
#: per Faust consumer: (the generation a revoke came in, the TPs revoked in it). The
#: assignment that follows clears it; the generation is kept so that, should the consumer's
#: generation move on before that wrapper runs, a record of the new generation is never
#: taken for one fetched before the revoke.
_REVOKED = "_mmsync_revoked"
#: per Faust consumer: TP -> acks not counted since the last assignment (logged then)
_REFUSED = "_mmsync_refused_acks"


def install() -> None:
    """Guard every aiokafka group coordinator and Faust consumer of this process
    (idempotent)."""
    _guard_generation()
    _guard_holds()
    _guard_stale_acks()


def hold(consumer: Any, events: Iterable[Any]) -> int:
    """Keep ``events`` (Faust events an agent took and will not finish) from being
    committed, by this worker, in their generation; the number held. Call it before
    the loop over ``take_events`` ends, so that its ``finally`` finds them held."""
    holds: dict[Any, tuple[int, int]] = consumer.__dict__.setdefault(_HOLDS, {})
    n = 0
    for event in events:
        msg = event.message
        msg.incref()
        low = holds.get(msg.tp)
        if low is None or low[1] != msg.generation_id or msg.offset < low[0]:
            holds[msg.tp] = (msg.offset, msg.generation_id)
        n += 1
    return n


def _open_low(consumer: Any, gen: int) -> dict[Any, int]:
    """TP -> the lowest offset a stream took in generation ``gen`` and has not acked yet,
    from one pass over the consumer's unacked set."""
    low: dict[Any, int] = {}
    for msg in list(getattr(consumer, "_unacked_messages", ())):
        if not msg.acked and msg.generation_id == gen:
            o = low.get(msg.tp)
            if o is None or msg.offset < o:
                low[msg.tp] = msg.offset
    return low


def _held_from(consumer: Any, tp: Any) -> int | None:
    """The lowest offset of ``tp`` held in the consumer's current generation, or taken by
    a stream in it and not acked yet."""
    gen = consumer.app.consumer_generation_id
    low = consumer.__dict__.get(_HOLDS, {}).get(tp)
    held = None if low is None or low[1] != gen else low[0]
    # Faust's commit counts from the first run of consecutive acked offsets, and checks
    # that run against the committed offset only when one is known and not 0 (a fresh
    # group's partitions have none), and then only for a gap of more than one
    # (faust-streaming issue 606): a record a stream still holds unacked at the head (the
    # aligner's records wait in open windows, acked only once emitted) could be
    # committed past. Such records are alive in the consumer's unacked set; no commit
    # goes past the lowest of them. One commit reads that set once for all its
    # partitions (_guard_holds); a lone call (tests) reads it itself.
    table = consumer.__dict__.get(_OPEN)
    taken = (table if table is not None else _open_low(consumer, gen)).get(tp)
    if taken is not None and (held is None or taken < held):
        held = taken
    return held


def _guard_holds() -> None:
    orig = Consumer._new_offset
    if getattr(orig, _MARK, False):
        return
    orig_filter = Consumer._filter_committable_offsets

    @functools.wraps(orig_filter)
    def filtered(self: Any, tps: Iterable[Any]) -> dict[Any, int]:
        # one pass over the unacked set per commit, not one per assigned partition
        self.__dict__[_OPEN] = _open_low(self, self.app.consumer_generation_id)
        try:
            return orig_filter(self, tps)
        finally:
            self.__dict__.pop(_OPEN, None)

    @functools.wraps(orig)
    def capped(self: Any, tp: Any) -> int | None:
        held = _held_from(self, tp)
        acked: list[int] = self._acked[tp]
        beyond = [o for o in acked if o >= held] if held is not None else []
        if held is None or not beyond:
            return orig(self, tp)
        # Faust's own count over only the acks below the hold; the rest put back after.
        acked[:] = [o for o in acked if o < held]
        try:
            return orig(self, tp) if acked else None
        finally:
            acked.extend(beyond)

    setattr(capped, _MARK, True)
    Consumer._new_offset = capped  # type: ignore[method-assign]
    Consumer._filter_committable_offsets = filtered  # type: ignore[method-assign]


def _guard_generation() -> None:
    orig = GroupCoordinator._do_commit_offsets
    if getattr(orig, _MARK, False):
        return

    # Checked right before the request is built: commit_offsets may have waited
    # through an outage for the coordinator (and the commit lock) since it was called.
    @functools.wraps(orig)
    async def guarded(self: Any, assignment: Any, offsets: Any) -> Any:
        if offsets and self.generation < 0 and self._subscription.partitions_auto_assigned():
            raise UnknownMemberIdError(
                f"not committing {len(offsets)} offsets for group {self.group_id}: the "
                "consumer is not a member (generation -1) until it joins again")
        return await orig(self, assignment, offsets)

    setattr(guarded, _MARK, True)
    GroupCoordinator._do_commit_offsets = guarded


def _stale(consumer: Any, message: Any) -> bool:
    """Whether ``message`` was fetched before the rebalance now under way or done: in an
    earlier generation, or in this one on a partition revoked since."""
    gen = consumer.app.consumer_generation_id
    if message.generation_id != gen:
        return True
    revoked = consumer.__dict__.get(_REVOKED)
    return revoked is not None and revoked[0] == gen and message.tp in revoked[1]


def _guard_stale_acks() -> None:
    orig_ack = Consumer.ack
    if getattr(orig_ack, _MARK, False):
        return
    orig_revoked = Consumer.on_partitions_revoked
    orig_assigned = Consumer.on_partitions_assigned

    @functools.wraps(orig_ack)
    def ack(self: Any, message: Any) -> bool:
        if not _stale(self, message):
            return orig_ack(self, message)
        # done with, so that nothing waits for it; never committable (the docstring)
        message.acked = True
        self._unacked_messages.discard(message)
        refused: dict[Any, int] = self.__dict__.setdefault(_REFUSED, {})
        refused[message.tp] = refused.get(message.tp, 0) + 1
        notify(self._waiting_for_ack)
        return False

    @functools.wraps(orig_revoked)
    async def on_partitions_revoked(self: Any, revoked: Any) -> None:
        # marked before Faust clears the partitions' acks: an ack from here on is stale
        gen = self.app.consumer_generation_id
        old = self.__dict__.get(_REVOKED)
        tps = set(old[1]) if old is not None and old[0] == gen else set()
        self.__dict__[_REVOKED] = (gen, tps | set(revoked))
        await orig_revoked(self, revoked)

    @functools.wraps(orig_assigned)
    async def on_partitions_assigned(self: Any, assigned: Any, generation_id: int = 0) -> None:
        # a new generation: the records fetched from here on are fresh
        self.__dict__.pop(_REVOKED, None)
        refused = self.__dict__.pop(_REFUSED, None)
        if refused:
            log.info("acks of records fetched before the rebalance not counted for a commit "
                     "(consumed again from the committed offsets): %s",
                     ", ".join(f"{n} of {tp.topic}[{tp.partition}]"
                               for tp, n in sorted(refused.items())))
        await orig_assigned(self, assigned, generation_id)

    setattr(ack, _MARK, True)
    Consumer.ack = ack  # type: ignore[method-assign]
    Consumer.on_partitions_revoked = on_partitions_revoked  # type: ignore[method-assign]
    Consumer.on_partitions_assigned = on_partitions_assigned  # type: ignore[method-assign]
