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
"""

from __future__ import annotations

import functools
from typing import Any

from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.errors import UnknownMemberIdError

__all__ = ["install"]

_MARK = "_mmsync_commit_guard"


def install() -> None:
    """Guard every aiokafka group coordinator of this process (idempotent)."""
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
