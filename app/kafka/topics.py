"""Every topic mmsync uses, made or checked before anything is consumed or sent.

A worker, ``mmsync produce``, the demo and the benchmarks call :func:`ensure_topics`
first (contract, "Topics at start"). It never relies on a broker's auto-creation,
which makes a topic with the broker's own default count (Tansu: 4; Apache Kafka's
``num.partitions``: 1) on the first request that names it, metadata requests
included: a worker that sent to ``mm.features`` partition 7 of such a topic
crashed (issue 23). So the topics are read from a metadata request for *all*
topics (which creates nothing), the missing ones are created through the admin
API with ``MMSYNC_PARTITIONS`` partitions and the configs below, and the call
returns only once the metadata shows every partition of every topic with a
leader. A topic with another count is a :class:`~app.errors.TopicConfigError`
naming it, its count and the setting, as ``deploy/topic-init.sh`` says it:
changing the count of a topic re-maps stream_id keys to partitions, so it is
never done here. With ``MMSYNC_CREATE_TOPICS=false`` (no create ACL) nothing is
created: a missing topic is the same kind of error.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, for_code

from app.errors import MmsyncError, TopicConfigError
from app.kafka.clients import (
    COMPACTED_TOPICS,
    CONTRACT_TOPICS,
    INTERNAL_TOPICS,
    MAX_REQUEST_BYTES,
    auth_kwargs,
)
from app.settings import Settings

__all__ = ["ALL_TOPICS", "MAX_MESSAGE_BYTES", "TopicsCheck", "TopicsReport", "check_topics",
           "ensure_topics", "topic_configs"]

log = logging.getLogger(__name__)

#: Every topic a worker reads or writes: the contract's and the workers' own.
ALL_TOPICS: tuple[str, ...] = (*CONTRACT_TOPICS, *INTERNAL_TOPICS)
#: ``max.message.bytes`` of every topic made here: an 8 MiB frame plus its envelope (or
#: its dead-lettered copy), as ``deploy/topic-init.sh`` and the compose broker set it.
MAX_MESSAGE_BYTES = 12 * 1024 * 1024
#: How long the metadata may take to show every partition of the topics, s.
METADATA_WAIT_S = 30.0


def topic_configs(name: str) -> dict[str, str]:
    """The configs a topic is created with (``name`` without the prefix)."""
    cfg = {"max.message.bytes": str(MAX_MESSAGE_BYTES)}
    if name in COMPACTED_TOPICS:
        cfg["cleanup.policy"] = "compact"
    return cfg


@dataclass(frozen=True)
class TopicsReport:
    """What :func:`ensure_topics` found: full topic names."""

    created: tuple[str, ...]
    existing: tuple[str, ...]
    #: one line per config of an existing topic that differs from what mmsync needs
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class TopicsCheck:
    """What :func:`check_topics` found wrong: names without the prefix."""

    missing: tuple[str, ...] = ()
    #: name -> the partition count it has instead of ``MMSYNC_PARTITIONS``
    wrong: Mapping[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.missing or self.wrong)


def _count_error(s: Settings, wrong: Mapping[str, int]) -> TopicConfigError:
    (topic, have), *more = sorted(wrong.items())
    also = "; also " + ", ".join(f"{t} ({n})" for t, n in more) if more else ""
    return TopicConfigError(
        f"topic {topic} has {have} partitions, MMSYNC_PARTITIONS is {s.partitions}; create new "
        f"topics (another MMSYNC_TOPIC_PREFIX) instead of changing the count{also}",
        topic=topic, partitions=have)


async def _describe(admin: AIOKafkaAdminClient, names: Iterable[str]) -> dict[str, list[Any]]:
    """Partition entries of each of ``names`` that exists. One metadata request for every
    topic: asking for the names themselves would auto-create them on brokers that do so."""
    wanted = set(names)
    return {t["topic"]: t["partitions"] for t in await admin.describe_topics()
            if t["topic"] in wanted and t["error_code"] == 0}


async def _create(admin: AIOKafkaAdminClient, s: Settings, missing: list[str]) -> None:
    new = [NewTopic(s.topic(n), num_partitions=s.partitions, replication_factor=1,
                    topic_configs=topic_configs(n)) for n in missing]
    try:
        resp = await admin.create_topics(new)
    except KafkaError as exc:
        raise TopicConfigError(f"cannot create topics {[t.name for t in new]}: {exc!r}",
                               topic=new[0].name) from exc
    for topic, code, *rest in resp.topic_errors:
        if code == 0 or code == TopicAlreadyExistsError.errno:
            continue  # made now, or by another worker a moment ago (its count is checked)
        err = for_code(code)
        detail = rest[0] if rest and rest[0] else err.description
        raise TopicConfigError(
            f"cannot create topic {topic} ({err.message}: {detail}); create it with "
            f"{s.partitions} partitions (deploy/topic-init.sh) and set "
            f"MMSYNC_CREATE_TOPICS=false where mmsync may not create topics", topic=topic)


async def _config_warnings(admin: AIOKafkaAdminClient, s: Settings,
                           names: list[str]) -> list[str]:
    """Configs of existing topics that differ from what mmsync needs (advice only: the
    operator made them so). Nothing when the broker does not tell."""
    if not names:
        return []
    try:
        resps = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, s.topic(n)) for n in names])
    except (TimeoutError, KafkaError, OSError) as exc:
        log.debug("topic configs not described: %r", exc)
        return []
    got: dict[str, dict[str, str]] = {}
    for resp in resps:
        for code, _msg, _type, topic, entries in resp.resources:
            if code == 0:
                got[topic] = {e[0]: e[1] for e in entries}
    out = []
    for n in names:
        cfg = got.get(s.topic(n))
        if cfg is None:
            continue
        limit = cfg.get("max.message.bytes")
        if limit is not None and limit.isdigit() and int(limit) < MAX_REQUEST_BYTES:
            out.append(f"topic {s.topic(n)} takes records of at most {limit} bytes "
                       f"(max.message.bytes); frames and their dead letters may be up to "
                       f"{MAX_REQUEST_BYTES}")
        if n in COMPACTED_TOPICS and cfg.get("cleanup.policy", "compact") != "compact":
            out.append(f"topic {s.topic(n)} is not compacted (cleanup.policy="
                       f"{cfg.get('cleanup.policy')}); only each key's newest record is needed")
    return out


async def ensure_topics(s: Settings, names: Iterable[str] = ALL_TOPICS, *,
                        create: bool | None = None,
                        timeout_s: float = METADATA_WAIT_S) -> TopicsReport:
    """Make sure each of ``names`` (without the prefix) exists with ``s.partitions``
    partitions; create the missing ones unless ``create`` (default
    ``s.create_topics``) is false, then wait until the metadata shows every partition.

    Raises:
        TopicConfigError: a topic has another partition count (checked before anything
            is created), is missing where creating is off or not allowed, or its
            partitions did not all show up within ``timeout_s``.
    """
    names = list(dict.fromkeys(names))
    create = s.create_topics if create is None else create
    try:
        return await _ensure(s, names, create, timeout_s)
    except (KafkaError, OSError) as exc:
        raise MmsyncError(f"topics not checked: broker {s.broker} ({s.bootstrap}) "
                          f"failed: {exc!r}") from exc


async def _ensure(s: Settings, names: list[str], create: bool, timeout_s: float
                  ) -> TopicsReport:
    admin = AIOKafkaAdminClient(bootstrap_servers=s.bootstrap, **auth_kwargs(s))
    await admin.start()
    try:
        have = await _describe(admin, (s.topic(n) for n in names))
        wrong = {t: len(p) for t, p in have.items() if len(p) != s.partitions}
        if wrong:
            raise _count_error(s, wrong)
        missing = [n for n in names if s.topic(n) not in have]
        if missing and not create:
            raise TopicConfigError(
                f"topic {s.topic(missing[0])} does not exist and MMSYNC_CREATE_TOPICS is false: "
                f"create {', '.join(s.topic(n) for n in missing)} with {s.partitions} "
                "partitions (MMSYNC_PARTITIONS) first (deploy/topic-init.sh)",
                topic=s.topic(missing[0]))
        if missing:
            await _create(admin, s, missing)
        await _wait_for_partitions(admin, s, names, timeout_s)
        existing = [n for n in names if n not in missing]
        warnings = await _config_warnings(admin, s, existing)
    finally:
        await admin.close()
    for w in warnings:
        log.warning("%s", w)
    report = TopicsReport(created=tuple(s.topic(n) for n in missing),
                          existing=tuple(s.topic(n) for n in existing),
                          warnings=tuple(warnings))
    log.info("topics: %d created, %d there already, all with %d partitions",
             len(report.created), len(report.existing), s.partitions)
    return report


async def _wait_for_partitions(admin: AIOKafkaAdminClient, s: Settings, names: list[str],
                               timeout_s: float) -> None:
    """Until every topic shows ``s.partitions`` partitions, each with a leader."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    pause = 0.05
    while True:
        have = await _describe(admin, (s.topic(n) for n in names))
        # another process may have made one at the same moment with its own count
        wrong = {t: len(p) for t, p in have.items() if len(p) != s.partitions}
        if wrong:
            raise _count_error(s, wrong)
        short = [s.topic(n) for n in names
                 if s.topic(n) not in have
                 or any(p["error_code"] != 0 or p["leader"] < 0 for p in have[s.topic(n)])]
        if not short:
            return
        if loop.time() >= deadline:
            raise TopicConfigError(
                f"topic {short[0]} did not show {s.partitions} partitions with a leader in the "
                f"broker's metadata within {timeout_s:g} s (of {len(short)} not ready)",
                topic=short[0])
        await asyncio.sleep(pause)
        pause = min(pause * 2, 1.0)


async def check_topics(s: Settings, names: Iterable[str] = ALL_TOPICS) -> TopicsCheck:
    """For a running worker: which of ``names`` are gone (deleted under it) or have
    another partition count now. One metadata request for all topics (it makes none);
    broker errors are raised (KafkaError, OSError)."""
    names = list(dict.fromkeys(names))
    admin = AIOKafkaAdminClient(bootstrap_servers=s.bootstrap, **auth_kwargs(s))
    await admin.start()
    try:
        have = await _describe(admin, (s.topic(n) for n in names))
    finally:
        await admin.close()
    return TopicsCheck(missing=tuple(n for n in names if s.topic(n) not in have),
                       wrong={n: len(have[s.topic(n)]) for n in names
                              if s.topic(n) in have and len(have[s.topic(n)]) != s.partitions})
