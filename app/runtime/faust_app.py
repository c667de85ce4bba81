"""The Faust app: settings passed in explicitly, over topics made before it starts.

The topics are made or checked by ``app.kafka.topics.ensure_topics`` before the
app exists (``app.runtime.process.run_worker``): Faust declares none of them and
runs without its one-partition leader topic (nothing here runs on the leader
only), so a worker reads and writes exactly the topics mmsync lists.

Topics carry raw bytes: agents decode inside their loop so a record that fails
to decode is dead-lettered with its original bytes instead of being acked and
lost by Faust's codec (style.md, "Errors are types").

Faust stops the whole worker when a timer or a task raises ("We experienced a
crash!"): every one of ours is registered through :meth:`Runtime.timer` or
:meth:`Runtime.task`, which log what escapes instead (issue 23).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import wraps
from typing import Any

import faust
from faust.types.tuples import FutureMessage

from app.cache.features import FeatureMemo
from app.errors import MmsyncError
from app.kafka import commitguard, fetchguard, gapguard
from app.kafka.clients import (
    COMPACTED_TOPICS,
    CONTRACT_TOPICS,
    INTERNAL_TOPICS,
    MAX_REQUEST_BYTES,
)
from app.runtime.delivery import Record, Send, send_error_reason, where
from app.runtime.metrics import LOOP_PROBE_S, SEND_TOPICS, Metrics
from app.runtime.offsets import GroupOffsets, LagReporter
from app.runtime.readiness import Readiness
from app.runtime.skewboard import SkewBoard, follow
from app.runtime.topicwatch import TOPIC_CHECK_S, TopicWatch
from app.settings import Settings
from schemas.dead_letter import DeadLetter

__all__ = ["Runtime", "guarded", "make_app", "quiet_failed_sends"]

log = logging.getLogger("mmsync")


def quiet_failed_sends(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The event loop's exception handler: no traceback for a failed send's Faust future.

    When a send fails, Faust logs a one-line warning (``_on_published error``) and
    sets the exception on a second future of the message (its FutureMessage) that
    nothing awaits; asyncio then prints "exception was never retrieved" with a
    traceback for each, though the failure was handled (``deliver`` sends the
    record again, or a progress mark is superseded). Everything else goes to
    asyncio's default handler."""
    if isinstance(context.get("future"), FutureMessage):
        return
    loop.default_exception_handler(context)


def guarded(name: str, fun: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
    """``fun`` as a timer's or task's body that logs what it raises instead of raising it:
    an exception out of a Faust timer or task stops the whole worker. Cancellation (a
    rebalance, the worker stopping) goes through."""

    @wraps(fun)
    async def run() -> None:
        try:
            await fun()
        except asyncio.CancelledError:
            raise
        except MmsyncError as exc:  # already described (a delivery given up, say)
            log.error("%s: %s; it runs again at its next tick", name, exc)
        except Exception:
            log.exception("%s failed; it runs again at its next tick", name)

    return run


class _App(faust.App):
    """faust.App that can swap in the embedded broker's transport (built lazily, on
    first use of ``app.transport``; the choice is this instance's, made at construction)."""

    def __init__(self, *args: Any, embedded: bool = False, fetch_wait_ms: int = 20,
                 **kwargs: Any) -> None:
        self._embedded = embedded
        #: the worker consumer's longest fetch wait on the embedded broker, ms
        self.embedded_fetch_wait_ms = fetch_wait_ms
        super().__init__(*args, **kwargs)

    def _new_transport(self) -> Any:
        if self._embedded:
            from app.kafka.transport import EmbeddedTransport

            return EmbeddedTransport(self.conf.broker_consumer, self)
        return super()._new_transport()


@dataclass
class Runtime:
    """What the agents of one worker share."""

    settings: Settings
    app: faust.App
    topics: dict[str, faust.TopicT]
    metrics: Metrics
    #: the worker group's committed offsets (consumer lag, progress marks)
    offsets: GroupOffsets
    #: one thread per modality keeps each modality's batches in order while
    #: keeping decoding and inference off the event loop.
    pools: dict[str, ThreadPoolExecutor] = field(default_factory=dict)
    #: every stream's newest skew estimate, read from PREFIX.skew (for the alerts)
    skew_board: SkewBoard = field(default_factory=SkewBoard)
    readiness: Readiness | None = None
    #: modality -> what loads its models (registered by the feature agents; run by
    #: :meth:`load_models` before the worker subscribes)
    loaders: dict[str, Callable[[], None]] = field(default_factory=dict)
    _memo: FeatureMemo | None = None

    def load_models(self) -> float:
        """Load (the first time: build) every feature agent's models, each in its
        modality's thread (where its batches run), all at once; seconds it took.
        Called before the Faust worker starts, so no partition is taken before the
        worker can serve it (issue 29: frames went late while a new worker built its
        INT8 models)."""
        t0 = time.perf_counter()
        futures = {m: self.pool(m).submit(load) for m, load in self.loaders.items()}
        for f in futures.values():
            f.result()  # a model that cannot load is a start-up error: raise it
        if self.readiness is not None:
            self.readiness.loaded()
        return time.perf_counter() - t0

    def feature_memo(self) -> FeatureMemo | None:
        """The worker's feature cache, opened on first use; None when switched off or
        when the models are the light ones (nothing worth caching)."""
        s = self.settings
        if self._memo is None and s.cache and s.models == "full":
            from app.cache.features import open_worker_cache

            self._memo = FeatureMemo(open_worker_cache(s, self.metrics))
        return self._memo

    def dead_letter_send(self, dl: DeadLetter, modality: str) -> Send:
        """Count it; the send of it to the dead-letter topic, its reason also as a header
        (for :func:`app.runtime.delivery.deliver`)."""
        self.metrics.dlq.labels(dl.error).inc()
        self.metrics.events.labels(modality, "dead_letter").inc()
        return Record(self.topics["dlq"], dl.key, dl.encode(), headers={"error": dl.error.encode()})

    def send_failed(self, send: Send, exc: BaseException) -> None:
        """Count a failed try of ``send`` in ``mmsync_send_errors_total{topic,reason}``
        (``deliver``'s ``on_failure``; deliver logs them)."""
        topic = send.topic.rsplit(".", 1)[-1] if isinstance(send, Record) else ""
        reason = send_error_reason(exc)
        if topic in SEND_TOPICS:
            self.metrics.send_errors.labels(topic, reason).inc()
        log.debug("send to %s failed: %s %r", where(send), reason, exc)

    async def known_partitions(self, topic: faust.TopicT, timeout_s: float
                               ) -> frozenset[int] | None:
        """The partitions of ``topic`` the worker's producer has metadata for: what a send
        to an explicit partition may name (aiokafka asserts it does). Fetched when the
        producer has none yet, for at most ``timeout_s`` (then ``asyncio.TimeoutError``);
        None while the producer has not started."""
        # Faust has no public accessor for its aiokafka producer.
        producer = getattr(self.app.producer, "_producer", None)
        if producer is None:
            return None
        name = topic.get_topic_name()
        parts = producer.client.cluster.partitions_for_topic(name)
        if parts is None:
            parts = await asyncio.wait_for(producer.partitions_for(name), timeout_s)
        return frozenset(parts)

    async def topics_changed(self, remade: Sequence[str]) -> None:
        """A topic was deleted, made again (``remade``: full names) or changed its count:
        the producer fetches its metadata now, and the partitions this worker reads of a
        topic made again are read from their start (app.runtime.topicwatch)."""
        producer = getattr(self.app.producer, "_producer", None)
        if producer is not None:
            await producer.client.force_metadata_update()
        consumer = self.app.consumer
        for tp in sorted(tp for tp in consumer.assignment() if tp.topic in remade):
            log.warning("reading %s partition %d from its start (the topic was made again)",
                        tp.topic, tp.partition)
            await consumer.seek(tp, 0)

    def timer(self, interval_s: float, name: str, fun: Callable[[], Awaitable[None]]) -> None:
        """Run ``fun`` every ``interval_s`` on every worker; what it raises is logged."""
        self.app.timer(interval_s, on_leader=False, name=name)(guarded(name, fun))

    def task(self, name: str, fun: Callable[[], Awaitable[None]]) -> None:
        """Run ``fun`` once when the worker starts; what it raises is logged."""
        self.app.task(on_leader=False)(guarded(name, fun))

    def pool(self, name: str) -> ThreadPoolExecutor:
        if name not in self.pools:
            self.pools[name] = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        return self.pools[name]


def make_app(s: Settings, metrics: Metrics | None = None) -> Runtime:
    if not s.broker:
        raise ValueError("make_app needs settings.broker")
    conf: dict[str, Any] = {
        "id": f"mmsync-{s.topic_prefix}",
        # Faust reads its settings from unprefixed environment variables too, and they win
        # over what is passed here (BROKER_URL, WEB_PORT, BROKER_COMMIT_EVERY, ... : a
        # BROKER_URL set for some other service took the worker to that broker). Settings
        # come from MMSYNC_* only (app.settings): Faust gets an empty environment.
        "env": {},
        "broker": s.broker,
        "datadir": str(s.data_dir / "faust"),
        "store": "memory://",
        "autodiscover": False,
        "topic_replication_factor": 1,
        "topic_partitions": s.partitions,
        # ensure_topics made or checked every topic before the app exists; no leader topic
        # (nothing runs on the leader only), so the worker uses exactly mmsync's topics
        "topic_allow_declare": False,
        "topic_disable_leader": True,
        "consumer_auto_offset_reset": "earliest",
        "processing_guarantee": "at_least_once",
        # Faust's 60 s defaults made a worker take 32 s to become ready on the
        # embedded broker; these give 7 to 10 s (docs/broker.md).
        "broker_session_timeout": 6,
        "broker_heartbeat_interval": 0.5,
        "broker_rebalance_timeout": 20,
        "broker_commit_interval": 1.0,
        # The aligner holds its acks until a record's window is emitted; on a
        # rebalance the new owner replays those records, so there is nothing
        # to wait for (Faust would wait for acks that never come).
        "stream_wait_empty": False,
        # Backpressure: a full buffer pauses its partition's fetching, so what a
        # worker holds is bounded by partitions x buffer_max records.
        "stream_buffer_maxsize": s.buffer_max,
        "producer_max_request_size": MAX_REQUEST_BYTES,
        "producer_linger": s.producer_linger_ms / 1000,
        "consumer_max_fetch_size": MAX_REQUEST_BYTES,
        "key_serializer": "raw",
        "value_serializer": "raw",
        "web_enabled": True,
        "web_bind": s.web_host,
        "web_port": s.web_port,
        "web_host": s.web_host,
    }
    if s.security_protocol != "PLAINTEXT":
        conf["broker_credentials"] = _faust_credentials(s)
    # Faust commits through aiokafka: no commit while the worker is out of its group
    # (stale offsets after a broker restart; app.kafka.commitguard); a seek back to the
    # committed offsets moves a partition with none to its start (app.kafka.fetchguard);
    # a fetch answered with a later batch than the one asked is fetched again, not taken
    # as a hole (Tansu: app.kafka.gapguard).
    commitguard.install()
    fetchguard.install()
    gapguard.install(s.topic(name) for name in COMPACTED_TOPICS)
    app = _App(**conf, embedded=s.broker_embedded, fetch_wait_ms=s.embedded_fetch_wait_ms)
    topics = {name: app.topic(s.topic(name), key_type=bytes, value_type=bytes,
                              partitions=s.partitions,
                              compacting=True if name in COMPACTED_TOPICS else None)
              for name in (*CONTRACT_TOPICS, *INTERNAL_TOPICS)}
    metrics = metrics or Metrics()
    readiness = Readiness(metrics.ready)
    rt = Runtime(settings=s, app=app, topics=topics, metrics=metrics,
                 offsets=GroupOffsets(s, app.conf.id),
                 skew_board=SkewBoard(window_us=s.window_ms * 1000), readiness=readiness)

    async def _on_assigned(_app: Any, assigned: set[Any], **_: Any) -> None:
        readiness.on_assigned()

    # Faust calls receivers as (sender, assigned, signal=...); its stub types only *args
    app.on_partitions_assigned.connect(_on_assigned)  # type: ignore[arg-type]

    async def _quiet_failed_sends() -> None:
        asyncio.get_running_loop().set_exception_handler(quiet_failed_sends)

    rt.task("mmsync.quiet_failed_sends", _quiet_failed_sends)

    async def _loop_lag() -> None:
        # How long other work kept the event loop from a timer that was due: what a
        # caption's alert, decided on the loop before any model, waits for besides its fetch
        # (issue 26). One observation per probe, 20 a second.
        loop = asyncio.get_running_loop()
        lag = metrics.stage.labels("loop")
        while True:
            t0 = loop.time()
            await asyncio.sleep(LOOP_PROBE_S)
            lag.observe(max(0.0, loop.time() - t0 - LOOP_PROBE_S))

    rt.task("mmsync.loop_lag", _loop_lag)

    if s.alerts and s.enabled_agents & {"text", "audio"}:
        # Alerts of modalities other than the reference need the aligner's skew estimate.
        async def _follow_skew() -> None:
            await follow(s, rt.skew_board)

        rt.task("mmsync.follow_skew", _follow_skew)

    lag = LagReporter(rt.offsets, rt.metrics)

    async def _lag() -> None:
        consumer = app.consumer
        await lag.update(consumer.assignment(), consumer.highwater)

    rt.timer(5.0, "mmsync.lag", _lag)
    # topics deleted under the worker are made again; a changed count is reported
    rt.timer(TOPIC_CHECK_S, "mmsync.topics",
             TopicWatch(s, rt.metrics, on_change=rt.topics_changed))

    if s.device != "cpu":
        async def _gpu_memory() -> None:
            import os

            from app.runtime.metrics import gpu_memory_bytes

            used = await asyncio.get_running_loop().run_in_executor(
                None, gpu_memory_bytes, os.getpid())
            if used is not None:
                rt.metrics.gpu_memory.set(used)

        rt.timer(15.0, "mmsync.gpu_memory", _gpu_memory)

    @app.page("/ready")
    async def _ready(web: Any, request: Any) -> Any:
        missing = readiness.missing()
        return web.text("ready\n" if not missing else f"not ready: {missing}\n",
                        status=200 if not missing else 503)

    @app.page("/metrics")
    async def _metrics(web: Any, request: Any) -> Any:
        from prometheus_client import generate_latest

        # aiohttp refuses a charset inside content_type; the text format is UTF-8 anyway.
        return web.bytes(generate_latest(rt.metrics.registry),
                         content_type="text/plain; version=0.0.4")

    return rt


def _faust_credentials(s: Settings) -> Any:
    from app.kafka.clients import ssl_context

    ctx = ssl_context(s)
    if s.security_protocol == "SSL":
        return faust.SSLCredentials(ctx)
    password = s.sasl_password.get_secret_value() if s.sasl_password else ""
    return faust.SASLCredentials(
        username=s.sasl_username or "", password=password, mechanism=s.sasl_mechanism,
        ssl_context=ctx if s.security_protocol == "SASL_SSL" else None,
    )
