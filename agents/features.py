"""One feature agent per input topic (text, image, audio).

The three differ only in their extractor, which lives in ``app/features``;
one factory keeps the loop in one place instead of three near-copies.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from app.consumed import RawMsg
from app.features.pipeline import FeaturePipeline
from app.runtime.faust_app import Runtime
from schemas.dead_letter import DeadLetter

__all__ = ["register"]


def _raw(event: Any) -> RawMsg:
    m = event.message
    return RawMsg(topic=m.topic, partition=m.partition, offset=m.offset, key=m.key,
                  value=m.value, timestamp_ms=int(m.timestamp * 1000) if m.timestamp else 0)


def register(rt: Runtime, modality: str) -> None:
    s = rt.settings
    pipeline = FeaturePipeline(s, rt.feature_memo())
    features = rt.topics["features"]
    within = max(s.batch_wait_ms, 1) / 1000.0

    async def agent(stream: Any) -> None:
        loop = asyncio.get_running_loop()
        pool = rt.pool(modality)
        # Load (and on first run export) the models before the first batch, in
        # the modality's thread: the event loop keeps heartbeating meanwhile.
        t0 = time.perf_counter()
        await loop.run_in_executor(pool, pipeline.warm, modality)
        rt.metrics.stage.labels(f"load_{modality}").observe(time.perf_counter() - t0)
        m = rt.metrics
        for model, (provider, precision) in list(pipeline.runtime.models.items()):
            m.model_info.labels(model, provider, precision).set(1)
        stage = {name: m.stage.labels(name) for name in ("queue", "decode", "model", "cache")}
        level = m.degradation.labels(modality)
        level.set(0)
        async for batch in stream.take_events(s.batch_max, within=within):
            msgs = [_raw(e) for e in batch]
            m.batch_size.observe(len(msgs))
            t0 = time.perf_counter()
            outs = await loop.run_in_executor(pool, pipeline.process, modality, msgs)
            m.stage.labels(f"extract_{modality}").observe(time.perf_counter() - t0)
            level.set(pipeline.degrader.level)
            for out in outs:
                if isinstance(out, DeadLetter):
                    await rt.send_dead_letter(out, modality)
                else:
                    for name, secs in out.stages.items():
                        stage[name].observe(secs)
                    await features.send(key=out.stream_id.encode(), value=out.encode())

    async def show_level() -> None:
        # Between batches too: an idle worker's level decays (app.features.degrade).
        rt.metrics.degradation.labels(modality).set(pipeline.level_now())

    rt.app.agent(rt.topics[modality], name=f"mmsync.features.{modality}")(agent)
    rt.app.timer(1.0, name=f"mmsync.features.{modality}.level")(show_level)
