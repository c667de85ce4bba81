"""aiokafka clients built from Settings: producers, consumers, waiting for the broker.

The topics themselves are made or checked by ``app/kafka/topics.py``.

Used by the CLI (produce, tail, demo) and tests; the workers use Faust's own
clients (``app/runtime/faust_app.py``) configured from the same Settings.
"""

from __future__ import annotations

import asyncio
import logging
import math
import ssl
from collections.abc import Callable, Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaConnectionError
from aiokafka.partitioner import murmur2
from aiokafka.structs import ConsumerRecord

from app.errors import MmsyncError
from app.kafka import gapguard
from app.settings import Settings

__all__ = ["COMPACTED_TOPICS", "CONTRACT_TOPICS", "INTERNAL_TOPICS", "auth_kwargs", "consume",
           "default_partition", "make_consumer", "make_producer", "ssl_context",
           "wait_for_broker"]

CONTRACT_TOPICS = ("text", "image", "audio", "features", "aligned", "late", "alerts", "dlq")
#: The workers' own topics, not in the external contract: each stream's skew estimate,
#: from the aligner to every worker's feature agents (app/runtime/skewboard.py).
INTERNAL_TOPICS = ("skew",)
#: Only the newest record per key matters: compacted where the broker honours it
#: (the embedded Tansu accepts the setting and keeps everything: docs/broker.md).
COMPACTED_TOPICS = frozenset({"skew"})
#: Largest record we send: an 8 MiB frame plus its envelope (dead-lettered copy included).
MAX_REQUEST_BYTES = 10 * 1024 * 1024


def ssl_context(s: Settings) -> ssl.SSLContext:
    """The TLS context of every client: the CA (or the system's), a client certificate
    for mutual TLS when one is set, the host-name check unless switched off."""
    ctx = ssl.create_default_context(cafile=str(s.ssl_cafile) if s.ssl_cafile else None)
    if s.ssl_certfile:
        password = s.ssl_key_password.get_secret_value() if s.ssl_key_password else None
        ctx.load_cert_chain(str(s.ssl_certfile), str(s.ssl_keyfile) if s.ssl_keyfile else None,
                            password)
    if not s.ssl_check_hostname:
        ctx.check_hostname = False
    return ctx


def auth_kwargs(s: Settings) -> dict[str, Any]:
    """aiokafka security keywords for SSL and SASL (PLAIN, SCRAM)."""
    kw: dict[str, Any] = {"security_protocol": s.security_protocol}
    if s.security_protocol in ("SSL", "SASL_SSL"):
        kw["ssl_context"] = ssl_context(s)
    if s.security_protocol.startswith("SASL"):
        kw["sasl_mechanism"] = s.sasl_mechanism
        kw["sasl_plain_username"] = s.sasl_username
        kw["sasl_plain_password"] = s.sasl_password.get_secret_value() if s.sasl_password else None
    return kw


def make_producer(s: Settings, **kw: Any) -> AIOKafkaProducer:
    opts: dict[str, Any] = {"acks": "all", "linger_ms": 5, "max_request_size": MAX_REQUEST_BYTES}
    opts.update(kw)
    return AIOKafkaProducer(bootstrap_servers=s.bootstrap, **auth_kwargs(s), **opts)


def make_consumer(s: Settings, *topics: str, **kw: Any) -> AIOKafkaConsumer:
    opts: dict[str, Any] = {"auto_offset_reset": "earliest", "enable_auto_commit": False,
                            "max_partition_fetch_bytes": MAX_REQUEST_BYTES}
    if s.broker_embedded:
        opts["fetch_max_wait_ms"] = s.embedded_fetch_wait_ms
    opts.update(kw)
    # no batch skipped when the broker answers with a later one (Tansu: app.kafka.gapguard)
    gapguard.install(s.topic(name) for name in COMPACTED_TOPICS)
    return AIOKafkaConsumer(*topics, bootstrap_servers=s.bootstrap, **auth_kwargs(s), **opts)


def default_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's (and aiokafka's) default partitioner picks for ``key``:
    murmur2 of the key bytes, positive, modulo the partition count."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


async def consume(s: Settings, topics: Iterable[str], handle: Callable[[ConsumerRecord], None],
                  *, until: Callable[[], bool] = lambda: False, timeout_s: float = math.inf,
                  idle_polls: int | None = None, poll_ms: int = 200, **consumer_kw: Any
                  ) -> None:
    """Read ``topics`` from the beginning (no group), calling ``handle`` on every record,
    until ``until()`` holds, ``timeout_s`` passes, or ``idle_polls`` polls in a row
    returned nothing. The one consumer loop of the clients, benchmarks and tests."""
    consumer = make_consumer(s, *topics, **consumer_kw)
    await consumer.start()
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        empty = 0
        while not until() and loop.time() < deadline:
            batch = await consumer.getmany(timeout_ms=poll_ms)
            empty = 0 if batch else empty + 1
            if idle_polls is not None and empty >= idle_polls:
                return
            for msgs in batch.values():
                for m in msgs:
                    handle(m)
    finally:
        await consumer.stop()


async def wait_for_broker(s: Settings, timeout_s: float = 30.0) -> None:
    """Bounded retries with backoff until the broker answers; a clear error otherwise.

    Sleeps between tries (0.2 s doubling to 2 s), so a worker waiting for a broker
    that is not there costs next to no CPU. aiokafka logs an ERROR line per failed
    connection; those are held back while we wait (the one message that counts is
    the MmsyncError at the end, naming the address).
    """
    delay, loop = 0.2, asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last: Exception | None = None
    quiet = logging.getLogger("aiokafka")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        while True:
            admin = AIOKafkaAdminClient(bootstrap_servers=s.bootstrap,
                                        request_timeout_ms=max(1000, int(timeout_s * 1000)),
                                        **auth_kwargs(s))
            try:
                await admin.start()
                return
            except (KafkaConnectionError, OSError) as exc:
                last = exc
            finally:
                await admin.close()
            left = deadline - loop.time()
            if left <= 0:
                break
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, 2.0)
    finally:
        quiet.setLevel(level)
    raise MmsyncError(f"broker {s.broker} ({s.bootstrap}) did not answer within "
                      f"{timeout_s:g} s: {last}")
