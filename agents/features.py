"""One feature agent per input topic (text, image, audio).

The three differ only in their extractor, which lives in ``app/features``;
one factory keeps the loop in one place instead of three near-copies. Every
``MMSYNC_MARK_INTERVAL_MS`` each agent also sends a progress mark (how far it
got through its input partitions, ``app.features.progress``) to every features
partition, after the feature records it covers: the aligner tells a slow
modality from an idle one by it (``app.align.progress``). Marks go only to the
partitions the producer's metadata knows: a partition it does not know (the
topic deleted and made again with another count) is counted and logged, never
sent to (aiokafka would raise, and a timer that raises stops the worker: issue 23).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from app.alerts.detect import LATE_KINDS, SCORE_KINDS
from app.alerts.publish import AlertPublisher
from app.consumed import RawMsg
from app.features.pipeline import FeaturePipeline
from app.features.progress import InputProgress
from app.kafka import commitguard
from app.runtime.delivery import DeliveryError, Record, Send, deliver
from app.runtime.faust_app import Runtime
from app.runtime.offsets import highwaters, last_poll_ms
from schemas.dead_letter import DeadLetter
from schemas.features import FeatureRecord

__all__ = ["register"]

log = logging.getLogger(__name__)


def _raw(event: Any) -> RawMsg:
    m = event.message
    return RawMsg(topic=m.topic, partition=m.partition, offset=m.offset, key=m.key,
                  value=m.value, timestamp_ms=int(m.timestamp * 1000) if m.timestamp else 0)


def register(rt: Runtime, modality: str) -> None:
    s = rt.settings
    pipeline = FeaturePipeline(s, rt.feature_memo())
    features = rt.topics["features"]
    mark_s = s.mark_interval_ms / 1000
    #: features partitions the producer's metadata lacked at the last mark (logged on change)
    unmarked: set[int] = set()
    within = max(s.batch_wait_ms, 1) / 1000.0
    progress = InputProgress(modality)
    source = s.topic(modality)
    alerts = AlertPublisher(rt) if s.alerts else None

    def load() -> None:
        """The modality's models, loaded (the first time: built) before the worker
        subscribes (Runtime.load_models), in the modality's thread."""
        t0 = time.perf_counter()
        if modality == "image" and s.drill_image_load_s > 0:
            time.sleep(s.drill_image_load_s)  # a fault drill: a slow model load
        pipeline.warm(modality)
        rt.metrics.stage.labels(f"load_{modality}").observe(time.perf_counter() - t0)
        for model, (provider, precision) in list(pipeline.runtime.models.items()):
            rt.metrics.model_info.labels(model, provider, precision).set(1)

    rt.loaders[modality] = load

    def extract(msgs: list[RawMsg], on_scored: Callable[[list[FeatureRecord]], None] | None,
                behind: int) -> list[Any]:
        """The batch's feature records and dead letters, in the modality's thread."""
        if modality == "image" and s.drill_extract_s > 0:
            time.sleep(s.drill_extract_s)  # a fault drill: a slow model
        return pipeline.process(modality, msgs, on_scored, behind)

    def behind(consumer: Any, batch: int) -> int:
        """Records in the input partitions not processed yet, less the batch's (by the high
        watermarks last fetched): the degradation signal's backlog (FeaturePipeline)."""
        try:
            mine = [tp for tp in consumer.assignment() if tp.topic == source]
            ends = {tp.partition: end
                    for tp, end in highwaters(mine, consumer.highwater).items()}
        except Exception:  # noqa: BLE001 - a hint (mid-rebalance: none); never fails a batch
            return 0
        return max(0, progress.behind(ends) - batch)

    async def agent(stream: Any) -> None:
        loop = asyncio.get_running_loop()
        pool = rt.pool(modality)
        m = rt.metrics
        stage = {name: m.stage.labels(name) for name in ("queue", "decode", "model", "cache")}
        level = m.degradation.labels(modality)
        level.set(0)

        async def handle(batch: list[Any]) -> None:
            msgs = [_raw(e) for e in batch]
            m.batch_size.observe(len(msgs))
            #: the batch's alert deliveries, started as soon as each alert's input is scored
            alerted: list[asyncio.Task[None]] = []
            #: records the image thread handed over with their scores, not yet sent
            scored: list[list[FeatureRecord]] = []
            early_frames = False

            def send_alerts(recs: list[Any], kinds: frozenset[str] | None = None) -> None:
                assert alerts is not None
                alerted.append(asyncio.create_task(deliver(
                    alerts.sends(recs, pipeline.degrader.level, kinds),
                    on_failure=rt.send_failed)))

            def send_scored() -> None:  # on the event loop; a second call finds nothing
                while scored:
                    send_alerts(scored.pop(0), SCORE_KINDS)

            def on_scored(recs: list[FeatureRecord]) -> None:
                # In the image thread, right after Open-NSFW and before EfficientNet and
                # OCR: a frame's alert needs only its score (issue 26).
                nonlocal early_frames
                early_frames = True
                scored.append(recs)
                loop.call_soon_threadsafe(send_scored)

            # A caption's alert needs only a term match: decided and sent before any
            # model of its batch runs (issue 26), confirmed before the batch is acked.
            early = pipeline.alert_records(modality, msgs) if alerts is not None else []
            if early:
                send_alerts(early)
            try:
                t0 = time.perf_counter()
                outs = await loop.run_in_executor(
                    pool, extract, msgs,
                    on_scored if alerts is not None and modality == "image" else None,
                    behind(rt.app.consumer, len(msgs)))
                m.stage.labels(f"extract_{modality}").observe(time.perf_counter() - t0)
                send_scored()
                level.set(pipeline.degrader.level)
                # the other alerts first: their sends start before the features' (an alert
                # waits for nothing), and all are confirmed before the batch is acked; a
                # frame batch that was scored has only its OCR alerts left
                sends: list[Send] = []
                if alerts is not None and not early:
                    sends = alerts.sends(outs, pipeline.degrader.level,
                                         LATE_KINDS if early_frames else None)
                for out in outs:
                    if isinstance(out, DeadLetter):
                        sends.append(rt.dead_letter_send(out, modality))
                    else:
                        for name, secs in out.stages.items():
                            stage[name].observe(secs)
                        sends.append(Record(features, out.stream_id.encode(), out.encode()))
                # the batch is acked (when the loop moves on) only once the broker has its
                # outputs
                await deliver(sends, on_failure=rt.send_failed)
                for task in alerted:
                    await task
            except BaseException:
                # the batch is held (below) and consumed again, alerts and all
                for task in alerted:
                    task.cancel()
                raise
            for msg in msgs:
                progress.processed(msg.partition, msg.offset)

        async for batch in stream.take_events(s.batch_max, within=within):
            try:
                await handle(batch)
            except BaseException as exc:
                # take_events acks the batch in a finally, whatever ended the loop (a
                # shutdown, a DeliveryError): held, it is never committed by this worker,
                # and whoever holds its partition next consumes it again (commitguard)
                held = commitguard.hold(rt.app.consumer, batch)
                log.log(logging.INFO if isinstance(exc, asyncio.CancelledError)
                        else logging.WARNING,
                        "a %s batch of %d not finished (%r): held, not committed",
                        modality, held, exc)
                raise

    async def send_marks() -> None:
        consumer = rt.app.consumer
        mine = [tp for tp in consumer.assignment() if tp.topic == source]
        unknown = progress.assigned(tp.partition for tp in mine)
        if unknown:  # newly assigned: where does their consumption start?
            starts = await rt.offsets.starts((tp for tp in mine if tp.partition in unknown),
                                             consumer)
            for tp, start in starts.items():
                progress.started(tp.partition, start)
        # when each end was fetched: what a "drained" vouches for (app.align.progress);
        # read before the ends, so that a fetch between the two makes an end newer than
        # its time says (the safe side), never older
        polled = {tp.partition: ms * 1000
                  for tp, ms in highwaters(mine, last_poll_ms(consumer)).items()}
        ends = {tp.partition: end for tp, end in highwaters(mine, consumer.highwater).items()}
        mark = progress.mark(ends, time.time_ns() // 1000, polled)
        if mark is None:
            return
        errors = rt.metrics.send_errors
        try:
            known = await rt.known_partitions(features, timeout_s=mark_s)
        except TimeoutError:
            errors.labels("features", "timeout").inc(s.partitions)
            log.warning("progress marks not sent: no metadata for %s within %.1f s",
                        features.get_topic_name(), mark_s)
            return
        if known is None:
            return  # the producer is not started yet
        missing = set(range(s.partitions)) - known
        if missing:
            errors.labels("features", "unknown_partition").inc(len(missing))
        if missing != unmarked:
            if missing:
                log.warning("progress marks not sent to %s partitions %s: the producer's "
                            "metadata has %d partitions, MMSYNC_PARTITIONS is %d (the topic "
                            "was deleted, or made again with another count?)",
                            features.get_topic_name(), sorted(missing), len(known), s.partitions)
            else:
                log.warning("progress marks reach every partition of %s again",
                            features.get_topic_name())
            unmarked.clear()
            unmarked.update(missing)
        value = mark.encode()
        marks: list[Send] = [Record(features, None, value, partition=q)
                             for q in range(s.partitions) if q in known]
        try:
            await deliver(marks, attempts=1, on_failure=rt.send_failed)
        except DeliveryError as exc:
            # A mark is advice the next one (in MMSYNC_MARK_INTERVAL_MS) replaces: a lost
            # one is not sent again, but its failure is read (and counted) here.
            log.info("progress marks of %s: %s", modality, exc)

    #: the image extractor's counts already added to their counters (metric -> count)
    counted = {"int8_scored": 0, "unembedded": 0}

    async def show_level() -> None:
        # Between batches too: an idle worker's level decays (app.features.degrade).
        rt.metrics.degradation.labels(modality).set(pipeline.level_now())
        if modality == "image":  # frames scored by the INT8 fallback, without embedding
            ex = pipeline.extractor(modality)
            for name, was in counted.items():
                n = getattr(ex, name, 0)
                if n > was:
                    getattr(rt.metrics, name).inc(n - was)
                    counted[name] = n

    rt.app.agent(rt.topics[modality], name=f"mmsync.features.{modality}")(agent)
    rt.timer(1.0, f"mmsync.features.{modality}.level", show_level)
    rt.timer(mark_s, f"mmsync.features.{modality}.marks", send_marks)
