"""The topic check's words and numbers agree with deploy/topic-init.sh and the compose
broker (issue 23: one wording of the count error wherever it comes from)."""

from __future__ import annotations

from pathlib import Path

import yaml  # type: ignore[import-untyped]

from app.kafka.clients import COMPACTED_TOPICS, MAX_REQUEST_BYTES
from app.kafka.topics import (
    ALL_TOPICS,
    MAX_MESSAGE_BYTES,
    TopicsCheck,
    _count_error,
    topic_configs,
)
from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_the_count_error_says_what_topic_init_says():
    script = (ROOT / "deploy" / "topic-init.sh").read_text()
    s = Settings(partitions=8)
    err = _count_error(s, {"mm.image": 4})
    assert str(err) == ("topic mm.image has 4 partitions, MMSYNC_PARTITIONS is 8; create new "
                        "topics (another MMSYNC_TOPIC_PREFIX) instead of changing the count")
    assert err.topic == "mm.image" and err.partitions == 4
    # the script's line, with its variables: the same words
    for words in ('"topic-init: $topic has $have partitions, MMSYNC_PARTITIONS is $PARTITIONS;"',
                  '"create new topics (another MMSYNC_TOPIC_PREFIX) instead of changing the '
                  'count"'):
        assert words in script
    # more than one: one line still, naming the first and the others after it
    two = str(_count_error(s, {"mm.text": 4, "mm.audio": 1}))
    assert "\n" not in two and two.startswith("topic mm.audio has 1 partitions")
    assert two.endswith("; also mm.text (4)")


def test_the_record_size_limit_is_the_one_topic_init_and_the_broker_use():
    script = (ROOT / "deploy" / "topic-init.sh").read_text()
    assert f"MAX_MESSAGE_BYTES={MAX_MESSAGE_BYTES}" in script
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    broker = compose["services"]["kafka"]["environment"]
    assert int(broker["KAFKA_MESSAGE_MAX_BYTES"]) == MAX_MESSAGE_BYTES >= MAX_REQUEST_BYTES


def test_configs_of_every_topic():
    for name in ALL_TOPICS:
        cfg = topic_configs(name)
        assert cfg["max.message.bytes"] == str(MAX_MESSAGE_BYTES)
        assert (cfg.get("cleanup.policy") == "compact") == (name in COMPACTED_TOPICS)


def test_a_check_is_true_when_something_is_wrong():
    assert not TopicsCheck()
    assert TopicsCheck(missing=("features",)) and TopicsCheck(wrong={"text": 4})
    assert TopicsCheck(wrong={"text": 4}) == TopicsCheck(wrong={"text": 4})
