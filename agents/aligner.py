"""The aligner agent: feature records in, aligned windows (and late events) out.

Durability by manual acks: a feature record is acked only once its window
has been sent (or it went to ``mm.late``, ``mm.dlq`` or was a duplicate) and
every earlier record of its partition is done too (``app.align.acks``: Faust's own
contiguity check has a hole before a partition's first commit); Faust commits
the acked prefix after flushing the producer. A worker that dies loses
nothing: the next owner of the partition replays every record not yet
committed. A replayed window comes out again with the same id
(``stream_id@window_start``); a replayed record that the new owner's fresh
skew estimate puts into a neighbouring window comes out twice; consumers
de-duplicate by window id and by each window's ``sources`` (``app.clients.collect``).
No table is involved, so the embedded broker's end-offset fault (changelog
recovery stops short, broker-notes.md) cannot lose state; the skew estimate
is the one thing a restart forgets, and it re-converges within seconds while
the watermark waits for it (app.align.aligner, "margin").
"""

from __future__ import annotations

import time
from typing import Any

from app.align.acks import OrderedAcks
from app.align.aligner import Aligner, AlignerConfig, build_window
from app.consumed import RawMsg, dead_letter
from app.errors import InvalidInputError
from app.runtime.faust_app import Runtime
from schemas.features import FeatureRecord

__all__ = ["register"]

#: How often open windows are checked for idle streams, seconds.
_TICK_S = 0.05


def register(rt: Runtime) -> Aligner:
    s = rt.settings
    aligner = Aligner(AlignerConfig(
        window_us=s.window_ms * 1000, lateness_us=s.lateness_ms * 1000, idle_s=s.idle_ms / 1000,
        rate_hz=s.sync_hz, correct_skew=s.skew_correction, max_skew_us=s.max_skew_ms * 1000,
        skew_context_us=s.skew_context_ms * 1000, stream_ttl_s=s.stream_ttl_s,
    ))
    m = rt.metrics
    aligned, late_topic = rt.topics["aligned"], rt.topics["late"]
    #: id(record) -> (partition, offset) of its event, done once the record is placed.
    held: dict[int, tuple[int, int]] = {}
    acks = OrderedAcks()
    #: stream_id -> partition of the features topic it arrives on.
    partition_of: dict[str, int] = {}

    async def emit(stream_ids: list[str] | None, arrived: float) -> None:
        for sid, start, recs in aligner.poll(time.time(), stream_ids):
            t0 = time.perf_counter()
            emitted_at = time.time_ns() // 1000
            mods = aligner.cfg.modalities
            offsets = {mod: aligner.offset_us(sid, mod) / 1000.0 for mod in mods}
            conf = {mod: aligner.confidence(sid, mod) for mod in mods}
            win = build_window(aligner, sid, start, recs, offsets_ms=offsets, confidence=conf,
                               emitted_at=emitted_at)
            # Input record's Kafka timestamp to this window's, s: where a consumer
            # sees the whole path's time next to the per-stage sums.
            e2e = [max(0.0, emitted_at / 1e6 - r.kafka_ts_ms / 1e3) for r in recs
                   if r.kafka_ts_ms > 0]
            if e2e:
                win.stages["e2e_max"] = max(e2e)
                win.stages["e2e_mean"] = sum(e2e) / len(e2e)
            win.stages["align"] = time.perf_counter() - t0
            # arrival of the record (or idle tick) that closed it to its send, s
            sync = win.stages["sync"] = max(0.0, time.time() - arrived)
            await aligned.send(key=sid.encode(), value=win.encode())
            m.windows.inc()
            m.stage.labels("align").observe(win.stages["align"])
            m.sync_latency.observe(sync)
            for secs in e2e:
                m.e2e.observe(secs)
            for mod, off in offsets.items():
                m.offset_ms.labels(mod).set(off)
            for rec in recs:
                where = held.pop(id(rec), None)
                if where is not None:
                    acks.done(*where)
        m.open_records.set(aligner.open_records())

    async def agent(stream: Any) -> None:
        async for event in stream.noack().events():
            msg = event.message
            arrived = time.time()
            acks.hold(msg.partition, msg.offset, event)
            try:
                rec = FeatureRecord.decode(msg.value)
            except InvalidInputError as exc:
                raw = RawMsg(topic=msg.topic, partition=msg.partition, offset=msg.offset,
                             key=msg.key, value=msg.value, timestamp_ms=0)
                await rt.send_dead_letter(dead_letter(raw, exc.reason, exc.detail), "features")
                acks.done(msg.partition, msg.offset)
                continue
            partition_of[rec.stream_id] = msg.partition
            res = aligner.add(rec, arrived)
            m.events.labels(rec.modality, res.outcome).inc()
            if res.outcome == "merged":
                held[id(rec)] = (msg.partition, msg.offset)
            else:
                if res.late is not None:
                    m.late.labels(rec.modality).inc()
                    await late_topic.send(key=rec.stream_id.encode(), value=res.late.encode())
                acks.done(msg.partition, msg.offset)
            await emit([rec.stream_id], arrived)

    async def idle_flush() -> None:
        await emit(None, time.time())

    async def evict() -> None:
        for sid in aligner.evict_idle(time.time()):
            partition_of.pop(sid, None)

    async def on_revoked(_app: Any, revoked: set[Any], **_: Any) -> None:
        # The new owner replays what we held (it was never acked): drop it here
        # so this worker cannot emit a window of a stream it no longer owns.
        gone = {tp.partition for tp in revoked if tp.topic == s.topic("features")}
        sids = [sid for sid, p in partition_of.items() if p in gone]
        for sid in sids:
            st = aligner.streams.get(sid)
            for rec in st.pending if st is not None else ():
                held.pop(id(rec), None)
            partition_of.pop(sid, None)
        aligner.forget(sids)
        acks.drop(gone)
        m.open_records.set(aligner.open_records())

    rt.app.agent(rt.topics["features"], name="mmsync.aligner")(agent)
    rt.app.timer(_TICK_S, name="mmsync.aligner.idle")(idle_flush)
    rt.app.timer(min(10.0, s.stream_ttl_s / 2), name="mmsync.aligner.evict")(evict)
    # Faust calls receivers as (sender, revoked, signal=...); its stub types only *args
    rt.app.on_partitions_revoked.connect(on_revoked)  # type: ignore[arg-type]
    return aligner
