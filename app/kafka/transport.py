"""Faust transport for the embedded Tansu broker: a shorter fetch wait.

Faust hard-codes ``fetch_max_wait_ms=1500`` for worker consumers; Tansu
answers an empty fetch only after half the remaining wait, so new data waits
up to 750 ms (docs/broker.md, fault 2). Apache Kafka answers as soon as data
arrives, so this transport is installed for the embedded profile only.
"""

from __future__ import annotations

from typing import Any

from faust.transport.drivers import aiokafka as faust_aiokafka

__all__ = ["EmbeddedTransport"]


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # Read by AIOKafkaConsumer.start() when it builds its Fetcher; the app's
        # (app.runtime.faust_app), from MMSYNC_EMBEDDED_FETCH_WAIT_MS.
        consumer._fetch_max_wait_ms = transport.app.embedded_fetch_wait_ms
        return consumer


class _Consumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> Any:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class EmbeddedTransport(faust_aiokafka.Transport):
    Consumer = _Consumer
