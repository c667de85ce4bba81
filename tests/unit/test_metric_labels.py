"""Every known label set exists from a worker's start, and the vocabularies of
app.runtime.metrics match the code that emits those labels (read from its syntax trees,
so a new reason, outcome or stage in the code fails here until it is listed)."""

from __future__ import annotations

import ast
import typing
from collections.abc import Iterator
from pathlib import Path

from app.runtime.metrics import (
    ALERT_SERIES,
    ALERT_SKIP_REASONS,
    CACHE_RESULTS,
    DLQ_REASONS,
    DYNAMIC_LABELS,
    OUTCOMES,
    SEND_ERROR_REASONS,
    SEND_TOPICS,
    STAGES,
    TOPIC_FAULTS,
    TOPICS,
    Metrics,
)
from app.settings import MODALITIES

ROOT = Path(__file__).resolve().parents[2]
#: The code that emits labels; app/runtime/metrics.py itself only walks the vocabularies.
CODE = [p for d in ("app", "agents", "schemas") for p in sorted((ROOT / d).rglob("*.py"))
        if p != ROOT / "app" / "runtime" / "metrics.py"]


def _calls() -> Iterator[tuple[Path, ast.Call, dict[ast.AST, ast.AST]]]:
    for path in CODE:
        tree = ast.parse(path.read_text(), str(path))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                yield path, node, parents


def _name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _owner(func: ast.expr) -> str:
    """``m.stage.labels`` -> ``stage``."""
    return _name(func.value) if isinstance(func, ast.Attribute) else ""


def _str(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _arg(call: ast.Call, pos: int, kw: str) -> ast.expr | None:
    if len(call.args) > pos:
        return call.args[pos]
    return next((k.value for k in call.keywords if k.arg == kw), None)


def test_a_fresh_registry_has_a_series_for_every_family() -> None:
    """The Grafana board reads 0, not "no data", before the first event (issue 19)."""
    empty = [fam.name for fam in Metrics().registry.collect()
             if not fam.samples and fam.name not in DYNAMIC_LABELS]
    assert not empty, f"create their known label sets in Metrics._create_known_series: {empty}"


def test_known_label_values_are_there_at_zero() -> None:
    reg = Metrics().registry
    for mod in MODALITIES:
        for outcome in OUTCOMES:
            assert reg.get_sample_value("mmsync_events_total",
                                        {"modality": mod, "outcome": outcome}) == 0
        assert reg.get_sample_value("mmsync_late_total", {"modality": mod}) == 0
        for result in CACHE_RESULTS:
            assert reg.get_sample_value("mmsync_cache_requests_total",
                                        {"modality": mod, "result": result}) == 0
    for reason in DLQ_REASONS:
        assert reg.get_sample_value("mmsync_dlq_total", {"error": reason}) == 0
    for stage in STAGES:
        assert reg.get_sample_value("mmsync_stage_seconds_count", {"stage": stage}) == 0
    for mod, kind in ALERT_SERIES:
        assert reg.get_sample_value("mmsync_alerts_total", {"modality": mod, "kind": kind}) == 0
    for reason in ALERT_SKIP_REASONS:
        assert reg.get_sample_value("mmsync_alert_skipped_total",
                                    {"modality": "image", "reason": reason}) == 0
    for topic in SEND_TOPICS:
        for reason in SEND_ERROR_REASONS:
            assert reg.get_sample_value("mmsync_send_errors_total",
                                        {"topic": topic, "reason": reason}) == 0
    for topic in TOPICS:
        for fault in TOPIC_FAULTS:
            assert reg.get_sample_value("mmsync_topic_faults_total",
                                        {"topic": topic, "fault": fault}) == 0


def test_dead_letter_reasons_are_the_ones_the_code_raises() -> None:
    found: dict[str, str] = {}
    for path, call, _ in _calls():
        name = _name(call.func)
        node = {"InvalidInputError": _arg(call, 0, "reason"),
                "dead_letter": _arg(call, 1, "reason"),
                "DeadLetter": _arg(call, 5, "error"),
                "_Failed": _arg(call, 0, "reason")}.get(name)
        if node is None:
            continue
        reason = _str(node)
        if reason is not None:
            found.setdefault(reason, str(path.relative_to(ROOT)))
    assert set(found) == set(DLQ_REASONS), (
        f"in the code: {sorted(found)}; app.runtime.metrics.DLQ_REASONS: {sorted(DLQ_REASONS)}")


def test_outcomes_are_the_ones_the_code_counts() -> None:
    found: set[str] = set()
    for _, call, _ in _calls():
        if _name(call.func) == "AddResult" and (s := _str(_arg(call, 0, "outcome"))):
            found.add(s)
        if _name(call.func) == "labels" and _owner(call.func) == "events":
            if (s := _str(_arg(call, 1, "outcome"))) is not None:
                found.add(s)
    assert found == set(OUTCOMES)


def test_cache_results_are_the_stores() -> None:
    from app.cache.store import Result

    assert typing.get_args(Result) == CACHE_RESULTS


def _stage_values(call: ast.Call, parents: dict[ast.AST, ast.AST]) -> set[str]:
    arg = _arg(call, 0, "stage")
    if (s := _str(arg)) is not None:
        return {s}
    if isinstance(arg, ast.JoinedStr):  # f"extract_{modality}": one per modality
        prefix = "".join(v.value for v in arg.values if isinstance(v, ast.Constant))
        return {f"{prefix}{m}" for m in MODALITIES}
    if isinstance(arg, ast.Name):  # {name: ... for name in ("queue", ...)}
        node: ast.AST | None = call
        while node is not None and not isinstance(node, ast.DictComp | ast.ListComp
                                                   | ast.SetComp | ast.GeneratorExp):
            node = parents.get(node)
        if node is not None:
            for gen in node.generators:  # type: ignore[attr-defined]
                if isinstance(gen.target, ast.Name) and gen.target.id == arg.id and isinstance(
                        gen.iter, ast.Tuple):
                    return {v for e in gen.iter.elts if (v := _str(e)) is not None}
    raise AssertionError(f"cannot read a stage label from {ast.unparse(call)}")


def test_stages_are_the_ones_the_code_observes() -> None:
    found: set[str] = set()
    for _, call, parents in _calls():
        if _name(call.func) == "labels" and _owner(call.func) == "stage":
            found |= _stage_values(call, parents)
    assert found == set(STAGES)


def test_alert_kinds_and_skip_reasons_are_the_ones_the_detector_makes():
    """``Detector._alert(rec, KIND, ...)`` calls and the blind record's ``"reason"``."""
    kinds: set[str] = set()
    reasons: set[str] = set()
    for path, call, _ in _calls():
        if path.parts[-2:] != ("alerts", "detect.py"):
            continue
        if _name(call.func) == "_alert" and (s := _str(_arg(call, 1, "kind"))):
            kinds.add(s)
    tree = ast.parse((ROOT / "app" / "alerts" / "detect.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if _str(k) == "reason" and isinstance(v, ast.IfExp):
                    reasons |= {x for x in (_str(v.body), _str(v.orelse)) if x}
    assert kinds == {kind for _, kind in ALERT_SERIES}
    assert reasons == set(ALERT_SKIP_REASONS)


def _function(path: Path, name: str) -> ast.FunctionDef:
    tree = ast.parse(path.read_text())
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def test_send_error_reasons_are_the_ones_the_code_gives():
    """What ``send_error_reason`` returns, and the reasons the progress marks count
    themselves (``send_errors.labels("features", REASON)``)."""
    fun = _function(ROOT / "app" / "runtime" / "delivery.py", "send_error_reason")
    found = {s for n in ast.walk(fun) if isinstance(n, ast.Return) and (s := _str(n.value))}
    topics: set[str] = set()
    for _, call, _ in _calls():
        if _name(call.func) == "labels" and _owner(call.func) == "send_errors":
            if (s := _str(_arg(call, 1, "reason"))) is not None:
                found.add(s)
            if (s := _str(_arg(call, 0, "topic"))) is not None:
                topics.add(s)
    assert found == set(SEND_ERROR_REASONS)
    assert topics <= set(SEND_TOPICS)


def test_topic_faults_are_the_ones_the_watch_counts():
    found = {s for _, call, _ in _calls()
             if _name(call.func) == "labels" and _owner(call.func) == "topic_faults"
             and (s := _str(_arg(call, 1, "fault"))) is not None}
    assert found == set(TOPIC_FAULTS)
