"""Prometheus metrics of the contract. Holders take a registry so tests get fresh ones.

Every label set known before the first event is created at start (``Metrics.__init__``):
a labelled counter has no series until its first ``.labels()`` call, and a dashboard
panel over a series that does not exist reads "no data" instead of 0 (issue 19: the
late-records panel of a loaded worker). ``tests/unit/test_metric_labels.py`` checks each
vocabulary below against the code that emits the labels.
"""

from __future__ import annotations

import shutil
import subprocess

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from app.kafka.clients import CONTRACT_TOPICS, INTERNAL_TOPICS
from app.settings import MODALITIES
from schemas.alert import KINDS
from schemas.errors import REASONS

__all__ = ["ALERT_SERIES", "ALERT_SKIP_REASONS", "CACHE_RESULTS", "DLQ_REASONS",
           "DYNAMIC_LABELS", "LOOP_PROBE_S", "OUTCOMES", "SEND_ERROR_REASONS", "SEND_TOPICS",
           "STAGES", "TOPIC_FAULTS", "TOPICS", "Metrics", "gpu_memory_bytes"]

#: ``mmsync_events_total{outcome}``: the aligner's placements plus the dead-letter path.
OUTCOMES = ("merged", "late", "duplicate", "dead_letter")
#: ``mmsync_dlq_total{error}``: the closed dead-letter vocabulary (schemas.errors.REASONS).
DLQ_REASONS = tuple(REASONS)
#: ``mmsync_cache_requests_total{result}`` (app.cache.store.Result).
CACHE_RESULTS = ("hit", "miss", "expired", "corrupt")
#: ``mmsync_stage_seconds{stage}``: per item, per batch and once per model load; ``loop``:
#: how late the event loop ran a due timer (app.runtime.faust_app, every LOOP_PROBE_S).
STAGES = ("queue", "decode", "model", "cache", "align", "loop",
          *(f"extract_{m}" for m in MODALITIES), *(f"load_{m}" for m in MODALITIES))
#: ``mmsync_alerts_total{modality,kind}``: each alert kind with the modality it comes from
#: (schemas.alert.KINDS).
ALERT_SERIES = tuple((modality, kind) for kind, modality in KINDS.items())
#: ``mmsync_alert_skipped_total{reason}``: why a frame went unscored (app.alerts.detect).
ALERT_SKIP_REASONS = ("sampled", "off")
#: ``mmsync_topic_faults_total{topic}``: every topic a worker uses, without the prefix.
TOPICS = (*CONTRACT_TOPICS, *INTERNAL_TOPICS)
#: ``mmsync_topic_faults_total{fault}`` (app.runtime.topicwatch): gone, or another count.
TOPIC_FAULTS = ("missing", "partitions")
#: ``mmsync_send_errors_total{topic}``: the topics a worker sends to, without the prefix.
SEND_TOPICS = tuple(t for t in TOPICS if t not in MODALITIES)
#: ``mmsync_send_errors_total{reason}`` (app.runtime.delivery.send_error_reason): a partition
#: the producer's metadata does not know, a topic it has no metadata for (deleted, or not
#: there in time), a time-out, a record over the size limit, another broker error, other.
SEND_ERROR_REASONS = ("unknown_partition", "unknown_topic", "timeout", "too_large", "broker",
                      "other")
#: Families whose label values exist only at run time: the topic-partitions assigned to
#: this worker (set by the 5 s lag timer once it owns some), and the model sessions with
#: the provider and precision they really got (set once the models have loaded).
DYNAMIC_LABELS = frozenset({"mmsync_consumer_lag", "mmsync_model_info"})

#: How often the event loop's lag is probed, s.
LOOP_PROBE_S = 0.05

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: Alert latency, s: finer than the window's, whose floor is the 1 s window itself.
_ALERT_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0)
_STAGE_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                  2.5, 5.0, 10.0)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        ProcessCollector(registry=r)  # process_resident_memory_bytes, cpu seconds, fds
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
        self.degradation = Gauge("mmsync_degradation_level",
                                 "0 full features; 1-3 fewer model runs under load (degrade.py)",
                                 ["modality"], registry=r)
        self.consumer_lag = Gauge("mmsync_consumer_lag",
                                  "Records in the partition after this worker's committed offset",
                                  ["topic", "partition"], registry=r)
        self.gpu_memory = Gauge("mmsync_gpu_memory_bytes",
                                "GPU memory this process holds (nvidia-smi), on CUDA only",
                                registry=r)
        self.restore_seconds = Histogram(
            "mmsync_restore_seconds", "Reading back mm.aligned and mm.late after a rebalance"
            " (all partitions it assigned at once)", buckets=_STAGE_BUCKETS, registry=r)
        self.restore_records = Counter("mmsync_restore_records_total",
                                       "Output records read back after takeovers", registry=r)
        self.restore_partitions = Counter("mmsync_restore_partitions_total",
                                          "Features partitions whose outputs were read back",
                                          registry=r)
        self.model_info = Gauge("mmsync_model_info",
                                "1 per model session: where it runs and at what precision",
                                ["model", "provider", "precision"], registry=r)
        self.open_records = Gauge("mmsync_open_records", "Records held in open windows",
                                  registry=r)
        self.alerts = Counter("mmsync_alerts_total", "Moderation alerts sent to PREFIX.alerts",
                              ["modality", "kind"], registry=r)
        self.alert_latency = Histogram("mmsync_alert_latency_seconds",
                                       "Input record Kafka timestamp to its alert's send",
                                       buckets=_ALERT_BUCKETS, registry=r)
        self.alert_skipped = Counter("mmsync_alert_skipped_total",
                                     "Inputs not checked for alerts: frames left unscored under"
                                     " load (reported by blind alerts)",
                                     ["modality", "reason"], registry=r)
        self.int8_scored = Counter("mmsync_image_int8_scored_total",
                                   "Frames a worker at FP32 scored with the INT8 Open-NSFW"
                                   " because their batch was behind (MMSYNC_DEGRADE_INT8)",
                                   registry=r)
        self.unembedded = Counter("mmsync_image_unembedded_total",
                                  "Frames scored without the EfficientNet embedding because"
                                  " their batch's alerts would have come late"
                                  " (MMSYNC_DEGRADE_EMBED_LAG_MS)", registry=r)
        self.ready = Gauge("mmsync_ready",
                           "1 once the models are loaded and the worker has its partitions"
                           " (also GET /ready)", registry=r)
        self.send_errors = Counter("mmsync_send_errors_total",
                                   "Sends that failed (each try) or were not made (a partition"
                                   " the metadata does not know), by topic without the prefix",
                                   ["topic", "reason"], registry=r)
        self.topic_faults = Counter("mmsync_topic_faults_total",
                                    "Checks of a running worker (every 10 s) that found a topic"
                                    " gone or with another partition count, by topic without"
                                    " the prefix", ["topic", "fault"], registry=r)
        self._create_known_series()

    def _create_known_series(self) -> None:
        """Every known label set at 0, so each panel reads 0 until something happens."""
        for mod in MODALITIES:
            for outcome in OUTCOMES:
                self.events.labels(mod, outcome)
            for result in CACHE_RESULTS:
                self.cache_requests.labels(mod, result)
            self.cache_evictions.labels(mod)
            self.cache_expirations.labels(mod)
            self.late.labels(mod)
            self.degradation.labels(mod)
            # 0 ms is also what windows carry until the first skew estimate.
            self.offset_ms.labels(mod)
        for reason in DLQ_REASONS:
            self.dlq.labels(reason)
        for stage in STAGES:
            self.stage.labels(stage)
        for mod, kind in ALERT_SERIES:
            self.alerts.labels(mod, kind)
        for reason in ALERT_SKIP_REASONS:
            self.alert_skipped.labels("image", reason)
        for topic in SEND_TOPICS:
            for reason in SEND_ERROR_REASONS:
                self.send_errors.labels(topic, reason)
        for topic in TOPICS:
            for fault in TOPIC_FAULTS:
                self.topic_faults.labels(topic, fault)


def gpu_memory_bytes(pid: int, timeout_s: float = 5.0) -> int | None:
    """GPU memory held by process ``pid`` as nvidia-smi reports it (MiB x 2**20), or
    None without nvidia-smi. ONNX Runtime exposes no such counter of its own."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=timeout_s, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    total = 0
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid) and parts[1].isdigit():
            total += int(parts[1]) << 20
    return total
