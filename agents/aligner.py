"""The aligner agent: feature records in, aligned windows (and late events) out.

All the state and every decision live in :class:`app.align.runner.AlignRunner`
(pure, unit-tested); this loop feeds it consumed records, sends what each
step holds and acks the offsets the step releases. Durability is by manual
acks (``stream.noack()``): a feature record is acked only once it is placed
and every earlier record of its partition is too; Faust commits the acked
prefix after flushing the producer. A worker that dies loses nothing: the
next owner of the partition replays every record not yet committed.

The outputs are the aligner's memory: when a features partition is assigned,
before its first record is processed, what ``mm.aligned`` and ``mm.late``
hold for it (from ``MMSYNC_RESTORE_LOOKBACK_S`` before that record) is read
back (``app.runtime.outputs``) into the runner, so a replayed record already
in an emitted window is not emitted again and no window id comes out with
fewer inputs. Faust rebalances eagerly, so this runs for every assigned
partition on every rebalance: ``mmsync_restore_seconds`` says what it costs.
Nothing is kept in Faust tables: the embedded broker's end-offset fault
(changelog recovery stops short, docs/broker.md) cannot lose state.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from aiokafka.errors import KafkaError

from app.align.aligner import AlignerConfig
from app.align.progress import MarkBoard
from app.align.runner import AlignRunner, Step
from app.lru import LRU
from app.runtime.delivery import Record, Send, deliver
from app.runtime.faust_app import Runtime
from app.runtime.outputs import read_outputs
from schemas.skew import SkewState

__all__ = ["register"]

log = logging.getLogger(__name__)

#: How often open windows are checked for idle streams, seconds.
_TICK_S = 0.05
#: At most one log line per stream this often (s) tells what closed a late record's window.
_TELL_LATE_S = 60.0


def register(rt: Runtime) -> AlignRunner:
    s = rt.settings
    features = s.topic("features")
    # A mark older than four intervals means its agent stopped sending; a "drained" read
    # less than one after the modality's last record may be its last (app.align.progress).
    interval_s = s.mark_interval_ms / 1000
    marks = MarkBoard(ttl_s=4 * interval_s, max_hold_s=s.max_hold_ms / 1000,
                      after_s=interval_s)
    runner = AlignRunner(AlignerConfig.from_settings(s), features, marks=marks)
    #: features partitions assigned and not yet restored
    to_restore: set[int] = set()
    m = rt.metrics
    aligned, late_topic = rt.topics["aligned"], rt.topics["late"]
    skew_topic = rt.topics["skew"]  # every worker's skew board reads it (alerts' ts)
    #: (partition, offset) -> the Faust event to ack once the runner releases it
    events: dict[tuple[int, int], Any] = {}

    #: stream -> wall time its windowing state was last logged for a late record
    told: LRU[str, float] = LRU(4096)

    async def publish(step: Step) -> None:
        sends: list[Send] = [rt.dead_letter_send(dl, "features") for dl in step.dead]
        for late in step.late:
            m.late.labels(late.modality).inc()
            now = time.time()
            last = told.get(late.stream_id)
            if last is None or now - last >= _TELL_LATE_S:
                # what closed the window before this record came: the first clue (a late
                # input is rare and never silent; at most one line per stream and minute)
                told.put(late.stream_id, now)
                log.warning("late %s record (ts %d, input %d@%d) for window %d, emitted "
                            "before it came; %s", late.modality, late.ts, late.src_offset,
                            late.src_partition, late.window_start,
                            runner.aligner.describe(late.stream_id, now))
            sends.append(Record(late_topic, late.stream_id.encode(), late.encode()))
        for win in step.windows:
            sends.append(Record(aligned, win.stream_id.encode(), win.encode()))
            # the skew estimate for the feature agents' alerts (app.runtime.skewboard)
            sends.append(Record(skew_topic, win.stream_id.encode(),
                                SkewState.of_window(win).encode()))
            m.windows.inc()
            m.stage.labels("align").observe(win.stages["align"])
            m.sync_latency.observe(win.stages["sync"])
            for mod, off in win.offsets_ms.items():
                m.offset_ms.labels(mod).set(off)
        for secs in step.e2e:
            m.e2e.observe(secs)
        for mod, outcome in step.outcomes:
            if outcome != "dead_letter":  # counted by rt.dead_letter_send
                m.events.labels(mod, outcome).inc()
        if sends:  # acked below only once the broker has them
            await deliver(sends, on_failure=rt.send_failed)
        for partition, offsets in step.acks.items():
            for off in offsets:
                ev = events.pop((partition, off), None)
                if ev is not None:
                    ev.ack()
        m.open_records.set(runner.open_records())

    async def restore(first_ms: int) -> None:
        """Read back the outputs of every partition assigned and not restored yet."""
        parts = sorted(to_restore)
        to_restore.clear()
        since = first_ms - int(s.restore_lookback_s * 1000)
        try:
            got = await read_outputs(s, parts, since)
        except (KafkaError, OSError) as exc:
            # Without the read-back a replayed window may come out again; better that
            # than a stalled partition.
            log.warning("features partitions %s: outputs not read back (%s); their replayed "
                        "records are placed as new", parts, exc)
            return
        now = time.time()
        n = sum(runner.restore(p, po.windows, po.late, now) for p, po in got.parts.items())
        m.restore_seconds.observe(got.seconds)
        m.restore_records.inc(got.records)
        m.restore_partitions.inc(len(parts))
        log.info("restored features partitions %s: %d streams from %d output records in "
                 "%.3f s%s", parts, n, got.records, got.seconds,
                 "" if got.complete else " (incomplete: the read timed out)")

    async def agent(stream: Any) -> None:
        async for event in stream.noack().events():
            msg = event.message
            # a rebalance may come while the outputs are read back: then this record is
            # stale, and the runner ignores it (AlignRunner.on_record)
            epoch = runner.epoch(msg.partition)
            ts_ms = int(msg.timestamp * 1000) if msg.timestamp else 0
            if msg.partition in to_restore:
                await restore(ts_ms or int(time.time() * 1000))
            if runner.epoch(msg.partition) == epoch:
                events[(msg.partition, msg.offset)] = event
            await publish(runner.on_record(msg.partition, msg.offset, msg.key, msg.value,
                                           time.time(), ts_ms, epoch=epoch))

    async def idle_flush() -> None:
        await publish(runner.on_tick(time.time()))

    async def evict() -> None:
        runner.evict_idle(time.time())

    async def on_revoked(_app: Any, revoked: set[Any], **_: Any) -> None:
        # The new owner replays what we held (it was never acked): drop it here so
        # this worker cannot emit a window of a stream it no longer owns.
        gone = {tp.partition for tp in revoked if tp.topic == features}
        runner.revoke(gone)
        to_restore.difference_update(gone)
        for key in [k for k in events if k[0] in gone]:
            del events[key]
        m.open_records.set(runner.open_records())

    async def on_assigned(_app: Any, assigned: set[Any], **_: Any) -> None:
        to_restore.update(tp.partition for tp in assigned if tp.topic == features)

    rt.app.agent(rt.topics["features"], name="mmsync.aligner")(agent)
    rt.timer(_TICK_S, "mmsync.aligner.idle", idle_flush)
    rt.timer(min(10.0, s.stream_ttl_s / 2), "mmsync.aligner.evict", evict)
    # Faust calls receivers as (sender, revoked, signal=...); its stub types only *args
    rt.app.on_partitions_revoked.connect(on_revoked)  # type: ignore[arg-type]
    rt.app.on_partitions_assigned.connect(on_assigned)  # type: ignore[arg-type]
    return runner
