"""A worker that has seen no input yet already exposes a series for every metric the
Grafana board queries, so each panel reads 0 instead of "no data" (issue 19: a real
Prometheus answered 31 of the board's 32 queries; the late-records panel had no series)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.kafka.topics import ensure_topics
from app.runtime.metrics import DYNAMIC_LABELS
from tests.integration.brokers import ON_BOTH

pytestmark = pytest.mark.integration

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy/grafana/dashboards/mmsync.json"
#: Series Prometheus makes itself (whether a scrape succeeded), never on a worker's page.
PROMETHEUS_OWN = {"up"}
_PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                 "and", "or", "unless", "offset", "inf", "nan"}


def board_metrics() -> dict[str, set[str]]:
    """Metric name -> the board's queries that select it."""
    out: dict[str, set[str]] = {}
    panels = json.loads(DASHBOARD.read_text())["panels"]
    for expr in (t["expr"] for p in panels for t in p.get("targets", [])):
        bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"", " ", expr)  # matchers, ranges
        bare = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", bare)  # grouping labels
        for m in re.finditer(r"(?<![\w.:])([a-zA-Z_:][\w:]*)(?![\w:]|\s*\()", bare):
            if m.group(1).lower() not in _PROMQL_WORDS:
                out.setdefault(m.group(1), set()).add(expr)
    return out


def _sample_names(text: str) -> set[str]:
    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_board_metric_names_are_read_from_the_queries() -> None:
    names = board_metrics()
    # the parse finds what the board's panels are about, and no function or label names
    assert {"mmsync_late_total", "mmsync_dlq_total", "mmsync_e2e_latency_seconds_bucket",
            "mmsync_consumer_lag", "process_resident_memory_bytes", "up"} <= set(names)
    assert not {"rate", "sum", "histogram_quantile", "le", "modality", "vector"} & set(names)


@ON_BOTH
async def test_every_board_query_has_a_series_right_after_start(pipeline):
    s = pipeline.settings
    await ensure_topics(s)
    worker = pipeline.start_worker(MMSYNC_MODELS="light")
    wanted = {n: q for n, q in board_metrics().items() if n not in PROMETHEUS_OWN}
    first = _sample_names(pipeline.metrics(worker))  # the first answer, before any input
    t0 = time.monotonic()
    missing = {n: sorted(q) for n, q in wanted.items()
               if n not in first and n not in DYNAMIC_LABELS}
    assert not missing, f"no series at start for: {missing}"

    # Per topic-partition series need the worker's partitions: they appear with the
    # first lag tick (every 5 s) after its first assignment, with no input either.
    dynamic = {n for n in wanted if n in DYNAMIC_LABELS}
    seen = first
    while not dynamic <= seen and time.monotonic() - t0 < 60:
        time.sleep(1)
        seen = _sample_names(pipeline.metrics(worker))
    assert dynamic <= seen, pipeline.logs()
    print(f"\n{len(wanted)} board metrics, {len(wanted) - len(dynamic)} at the first scrape, "
          f"{sorted(dynamic)} {time.monotonic() - t0:.1f} s later")
