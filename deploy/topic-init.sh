#!/bin/sh
# Create every contract topic with the same partition count (co-partitioned by
# stream_id) and check that existing ones have it. Run by the topic-init
# service of docker-compose.yml with the apache/kafka image.
#
# Environment: BOOTSTRAP (host:port), TOPIC_PREFIX (mm), TOPICS (the contract's
# topic names without the prefix), PARTITIONS, REPLICATION_FACTOR, and
# COMMAND_CONFIG (optional: a client properties file for a secured cluster,
# passed to kafka-topics.sh as --command-config).
# Exits non-zero when a topic exists with another partition count: changing the
# count re-maps stream_id keys to partitions, so it is never done silently.
set -eu

BIN="${KAFKA_BIN:-/opt/kafka/bin}"
: "${BOOTSTRAP:?}" "${TOPIC_PREFIX:?}" "${TOPICS:?}" "${PARTITIONS:?}"
REPLICATION_FACTOR="${REPLICATION_FACTOR:-1}"
# 10 MiB records (an 8 MiB frame plus envelope), as the broker allows.
MAX_MESSAGE_BYTES=12582912
if [ -n "${COMMAND_CONFIG:-}" ]; then
  set -- --command-config "$COMMAND_CONFIG"
else
  set --
fi

status=0
for t in $TOPICS; do
  topic="$TOPIC_PREFIX.$t"
  "$BIN/kafka-topics.sh" --bootstrap-server "$BOOTSTRAP" "$@" --create --if-not-exists \
    --topic "$topic" --partitions "$PARTITIONS" --replication-factor "$REPLICATION_FACTOR" \
    --config "max.message.bytes=$MAX_MESSAGE_BYTES"
  have=$("$BIN/kafka-topics.sh" --bootstrap-server "$BOOTSTRAP" "$@" --describe --topic "$topic" \
    | sed -n 's/.*PartitionCount: *\([0-9][0-9]*\).*/\1/p' | head -n 1)
  if [ "$have" != "$PARTITIONS" ]; then
    echo "topic-init: $topic has $have partitions, MMSYNC_PARTITIONS is $PARTITIONS;" \
      "create new topics (another MMSYNC_TOPIC_PREFIX) instead of changing the count" >&2
    status=1
  else
    echo "topic-init: $topic ok ($have partitions)"
  fi
done
exit "$status"
