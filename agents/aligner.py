"""The aligner agent: feature records in, aligned windows (and late events) out.

All the state and every decision live in :class:`app.align.runner.AlignRunner`
(pure, unit-tested); this loop feeds it consumed records, sends what each
step holds and acks the offsets the step releases. Durability is by manual
acks (``stream.noack()``): a feature record is acked only once it is placed
and every earlier record of its partition is too; Faust commits the acked
prefix after flushing the producer. A worker that dies loses nothing: the
next owner of the partition replays every record not yet committed.
Nothing is kept in Faust tables: the embedded broker's end-offset fault
(changelog recovery stops short, docs/broker.md) cannot lose state.
"""

from __future__ import annotations

import time
from typing import Any

from app.align.aligner import AlignerConfig
from app.align.runner import AlignRunner, Step
from app.runtime.faust_app import Runtime

__all__ = ["register"]

#: How often open windows are checked for idle streams, seconds.
_TICK_S = 0.05


def register(rt: Runtime) -> AlignRunner:
    s = rt.settings
    features = s.topic("features")
    runner = AlignRunner(AlignerConfig.from_settings(s), features)
    m = rt.metrics
    aligned, late_topic = rt.topics["aligned"], rt.topics["late"]
    #: (partition, offset) -> the Faust event to ack once the runner releases it
    events: dict[tuple[int, int], Any] = {}

    async def publish(step: Step) -> None:
        for dl in step.dead:
            await rt.send_dead_letter(dl, "features")
        for late in step.late:
            m.late.labels(late.modality).inc()
            await late_topic.send(key=late.stream_id.encode(), value=late.encode())
        for win in step.windows:
            await aligned.send(key=win.stream_id.encode(), value=win.encode())
            m.windows.inc()
            m.stage.labels("align").observe(win.stages["align"])
            m.sync_latency.observe(win.stages["sync"])
            for mod, off in win.offsets_ms.items():
                m.offset_ms.labels(mod).set(off)
        for secs in step.e2e:
            m.e2e.observe(secs)
        for mod, outcome in step.outcomes:
            if outcome != "dead_letter":  # counted by send_dead_letter
                m.events.labels(mod, outcome).inc()
        for partition, offsets in step.acks.items():
            for off in offsets:
                ev = events.pop((partition, off), None)
                if ev is not None:
                    ev.ack()
        m.open_records.set(runner.open_records())

    async def agent(stream: Any) -> None:
        async for event in stream.noack().events():
            msg = event.message
            events[(msg.partition, msg.offset)] = event
            await publish(runner.on_record(msg.partition, msg.offset, msg.key, msg.value,
                                           time.time()))

    async def idle_flush() -> None:
        await publish(runner.on_tick(time.time()))

    async def evict() -> None:
        runner.evict_idle(time.time())

    async def on_revoked(_app: Any, revoked: set[Any], **_: Any) -> None:
        # The new owner replays what we held (it was never acked): drop it here so
        # this worker cannot emit a window of a stream it no longer owns.
        gone = {tp.partition for tp in revoked if tp.topic == features}
        runner.revoke(gone)
        for key in [k for k in events if k[0] in gone]:
            del events[key]
        m.open_records.set(runner.open_records())

    rt.app.agent(rt.topics["features"], name="mmsync.aligner")(agent)
    rt.app.timer(_TICK_S, name="mmsync.aligner.idle")(idle_flush)
    rt.app.timer(min(10.0, s.stream_ttl_s / 2), name="mmsync.aligner.evict")(evict)
    # Faust calls receivers as (sender, revoked, signal=...); its stub types only *args
    rt.app.on_partitions_revoked.connect(on_revoked)  # type: ignore[arg-type]
    return runner
