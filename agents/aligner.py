"""The aligner agent: feature records in, aligned windows (and late events) out."""

from __future__ import annotations

import time
from typing import Any

from agents.features import send_dead_letter
from app.align import Aligner, AlignerConfig, build_window
from app.dlq import RawMsg, dead_letter
from app.errors import InvalidInputError
from app.main import Runtime
from app.settings import MODALITIES
from schemas.features import FeatureRecord

__all__ = ["register"]

#: How often open windows are checked for idle streams, seconds.
_TICK_S = 0.05


def register(rt: Runtime) -> Aligner:
    s = rt.settings
    aligner = Aligner(AlignerConfig(
        window_us=s.window_ms * 1000, lateness_us=s.lateness_ms * 1000, idle_s=s.idle_ms / 1000,
        rate_hz=s.sync_hz,
    ))
    m = rt.metrics
    aligned, late_topic = rt.topics["aligned"], rt.topics["late"]

    async def emit(stream_ids: list[str] | None, arrived: float) -> None:
        now = time.time()
        for sid, start, recs in aligner.poll(now, stream_ids):
            t0 = time.perf_counter()
            emitted_at = time.time_ns() // 1000
            offsets = dict.fromkeys(MODALITIES, 0.0)
            conf = {mod: 1.0 if mod == "image" else 0.0 for mod in MODALITIES}
            win = build_window(aligner, sid, start, recs, offsets_ms=offsets, confidence=conf,
                               emitted_at=emitted_at)
            win.stages["align"] = time.perf_counter() - t0
            await aligned.send(key=sid.encode(), value=win.encode())
            m.windows.inc()
            m.stage.labels("align").observe(win.stages["align"])
            m.sync_latency.observe(max(0.0, time.time() - arrived))
            for rec in recs:
                m.e2e.observe(max(0.0, emitted_at / 1e6 - rec.kafka_ts_ms / 1e3))
        m.open_records.set(aligner.open_records())

    async def agent(stream: Any) -> None:
        async for event in stream.events():
            msg = event.message
            arrived = time.time()
            try:
                rec = FeatureRecord.decode(msg.value)
            except InvalidInputError as exc:
                raw = RawMsg(topic=msg.topic, partition=msg.partition, offset=msg.offset,
                             key=msg.key, value=msg.value, timestamp_ms=0)
                await send_dead_letter(rt, dead_letter(raw, exc.reason, exc.detail), "features")
                continue
            res = aligner.add(rec, arrived)
            m.events.labels(rec.modality, res.outcome).inc()
            if res.late is not None:
                m.late.labels(rec.modality).inc()
                await late_topic.send(key=rec.stream_id.encode(), value=res.late.encode())
            await emit([rec.stream_id], arrived)

    async def idle_flush() -> None:
        await emit(None, time.time())

    rt.app.agent(rt.topics["features"], name="mmsync.aligner")(agent)
    rt.app.timer(_TICK_S, name="mmsync.aligner.idle")(idle_flush)
    return aligner
