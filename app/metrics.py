"""Prometheus metrics of the contract. Holders take a registry so tests get fresh ones."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["Metrics"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_STAGE_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        self.events = Counter("mmsync_events_total", "Input events by outcome",
                              ["modality", "outcome"], registry=r)
        self.stage = Histogram("mmsync_stage_seconds", "Time per processing stage",
                               ["stage"], buckets=_STAGE_BUCKETS, registry=r)
        self.e2e = Histogram("mmsync_e2e_latency_seconds",
                             "Input record Kafka timestamp to aligned output",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.sync_latency = Histogram("mmsync_sync_latency_seconds",
                                      "Arrival of the record that closed a window to its emission",
                                      buckets=_STAGE_BUCKETS, registry=r)
        self.cache_requests = Counter("mmsync_cache_requests_total", "Feature cache look-ups",
                                      ["modality", "result"], registry=r)
        self.cache_bytes = Gauge("mmsync_cache_bytes", "Bytes held by the feature cache",
                                 registry=r)
        self.cache_evictions = Counter("mmsync_cache_evictions_total",
                                       "Feature cache entries evicted to hold the byte budget",
                                       ["modality"], registry=r)
        self.cache_expirations = Counter("mmsync_cache_expirations_total",
                                         "Feature cache entries removed when their TTL ran out",
                                         ["modality"], registry=r)
        self.batch_size = Histogram("mmsync_batch_size", "Items per micro-batch",
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r)
        self.offset_ms = Gauge("mmsync_offset_ms", "Estimated lag behind the reference, ms",
                               ["modality"], registry=r)
        self.dlq = Counter("mmsync_dlq_total", "Records sent to the dead-letter topic",
                           ["error"], registry=r)
        self.late = Counter("mmsync_late_total", "Records sent to the late topic",
                            ["modality"], registry=r)
        self.windows = Counter("mmsync_windows_total", "Aligned windows emitted", registry=r)
        self.open_records = Gauge("mmsync_open_records", "Records held in open windows",
                                  registry=r)
