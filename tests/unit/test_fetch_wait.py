"""The embedded broker's fetch wait (MMSYNC_EMBEDDED_FETCH_WAIT_MS) reaches every consumer
that waits on it, and only on that broker (Apache Kafka answers a fetch when data comes)."""

from __future__ import annotations

from pathlib import Path

from app.kafka.clients import make_consumer
from app.kafka.transport import EmbeddedTransport
from app.runtime.faust_app import make_app
from app.settings import Settings


def _settings(tmp_path: Path, embedded: bool) -> Settings:
    return Settings(data_dir=tmp_path, broker="kafka://127.0.0.1:9", broker_embedded=embedded,
                    embedded_fetch_wait_ms=20)


async def test_aiokafka_consumers_wait_the_setting_on_the_embedded_broker_only(tmp_path):
    for embedded, want in ((True, 20), (False, 500)):  # 500: aiokafka's own default
        consumer = make_consumer(_settings(tmp_path, embedded), "t")
        try:
            assert consumer._fetch_max_wait_ms == want
        finally:
            await consumer.stop()  # never started: only closes what the constructor made


def test_the_workers_faust_consumer_reads_it_from_the_app(tmp_path):
    rt = make_app(_settings(tmp_path, True))
    assert isinstance(rt.app.transport, EmbeddedTransport)
    assert rt.app.embedded_fetch_wait_ms == 20  # what _ConsumerThread puts on its consumer
    assert not isinstance(make_app(_settings(tmp_path, False)).app.transport, EmbeddedTransport)
