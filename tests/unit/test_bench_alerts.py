"""The benchmark's alert check (scripts/benchlib/alerts.py) on crafted alerts: each way an
input can fare is counted where it belongs, and latency comes from the Kafka timestamps."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

from app.features.text import TermMatcher
from app.settings import Settings
from schemas.alert import Alert, Source
from schemas.events import Limits, decode_event
from scripts.benchlib.alerts import judge, print_report, worker_env
from scripts.benchlib.loadgen import MixSpec, mix

SPEC = MixSpec(streams=1, seconds=6.0, seed=3, tag="u")


def _alert(tid: str, modality: str, kind: str, kafka_ts: int, **detail) -> Alert:
    return Alert(stream_id="load-0", modality=modality, kind=kind, score=1.0 if kind != "nsfw"
                 else 0.5, ts=0, window_id="load-0@0", trace_id=tid,
                 source=Source(f"mm.{modality}", 0, 0), emitted_at=kafka_ts * 1000 + 5000,
                 detail=detail, kafka_ts_ms=kafka_ts)


async def test_judge_counts_every_way_an_input_can_fare(tmp_path: Path) -> None:
    args = SimpleNamespace(no_alerts=False, alert_nsfw=0.0)
    worker = worker_env(tmp_path, args)  # threshold 0: every frame is over it
    items = mix(SPEC)
    frames = [it for it in items if it.modality == "image"]
    caps = [it for it in items if it.modality == "text"]
    match = TermMatcher.from_files(worker["MMSYNC_TERMS_FILES"].split(","))
    clean = [c for c in caps if not match(decode_event("text", c.key, c.value, Limits()).text)]
    assert len(frames) > 4 and clean
    got = []
    # frames: all alert but two; one of those is named by a blind record, one is missed
    for i, f in enumerate(frames[:-2]):
        got.append((_alert(f.trace_id, "image", "nsfw", 1000 + i), 1000 + i + 40 + i))
    got.append((_alert(frames[-2].trace_id, "image", "blind", 1,
                       trace_ids=[frames[-2].trace_id]), 2))
    # captions: every one holding a term alerts, and one clean one does too (false)
    for c in caps:
        if c not in clean or c is clean[0]:
            got.append((_alert(c.trace_id, "text", "term", 500, terms=["x"]), 560))
    got.append((_alert("other-step/0/t1", "text", "term", 1, terms=["x"]), 2))  # not ours
    col = SimpleNamespace(got=got, bad=0)
    models = Path(os.environ.get("MMSYNC_MODELS_DIR", tmp_path / "models"))
    res = await judge(col, SPEC, worker, tmp_path, Settings(data_dir=tmp_path),
                      models_dir=models, settle_s=0, edge_s=0)
    im, tx = res["image"], res["text"]
    assert (im["inputs"], im["over"], im["alerted"], im["blind"], im["missed"], im["false"]) == (
        len(frames), len(frames), len(frames) - 2, 1, 1, 0)
    assert im["missed_examples"] == [frames[-1].trace_id]
    assert (tx["inputs"], tx["over"], tx["alerted"], tx["missed"], tx["false"]) == (
        len(caps), len(caps) - len(clean), len(caps) - len(clean), 0, 1)
    # latency: the alert record's Kafka timestamp minus the input's, ms
    assert tx["p50_ms"] == 60.0 and im["p50_ms"] >= 40.0 and res["blind_records"] == 1
    at70 = SimpleNamespace(rate=1.0, p50_s=1.5, p99_s=2.5)
    print_report(res, at70)  # renders without error, with the verdict


async def test_judge_takes_an_fp32_workers_int8_scores_where_its_alerts_say_so(
        tmp_path: Path) -> None:
    """A worker at FP32 scores a batch behind its records at INT8 (MMSYNC_DEGRADE_INT8):
    an alert that says so is judged by the INT8 score, and a frame without an alert that
    the two precisions put on either side of the threshold is left out (``int8``)."""
    import pytest

    from app.features.quantize import int8_instruction
    from schemas.events import FrameEvent
    from scripts.benchlib.alerts import _nsfw_scores

    if int8_instruction() is None:
        pytest.skip("no INT8 instruction on this CPU: an FP32 worker has no INT8 fallback")
    models = Path(os.environ.get("MMSYNC_MODELS_DIR", tmp_path / "models"))
    frames = [it for it in mix(SPEC) if it.modality == "image"]
    data = {f.trace_id: decode_event("image", f.key, f.value, Limits()) for f in frames}
    worker = {**worker_env(tmp_path, SimpleNamespace(no_alerts=False, alert_nsfw=0.0)),
              "MMSYNC_PRECISION": "fp32"}
    fp, i8 = _nsfw_scores([e.data for e in data.values() if isinstance(e, FrameEvent)],
                          worker, models, tmp_path / "scores")
    assert i8 is not None
    # the frame the precisions disagree on most (relative): the threshold between its scores
    def gap(tid: str) -> float:
        d = data[tid]
        assert isinstance(d, FrameEvent)
        return abs(fp[d.data] - i8[d.data]) / max(fp[d.data], i8[d.data])

    f = max(data, key=gap)
    df = data[f]
    assert isinstance(df, FrameEvent) and gap(f) > 0.05
    th = (fp[df.data] + i8[df.data]) / 2
    worker["MMSYNC_ALERT_NSFW"] = str(th)
    got = []
    for i, (tid, ev) in enumerate(data.items()):
        assert isinstance(ev, FrameEvent)
        if tid == f:
            if i8[ev.data] >= th:  # its batch was behind: the worker's INT8 score alerted
                got.append((_alert(tid, "image", "nsfw", 1000, threshold=th,
                                   precision="int8"), 1050))
                # and its OCR text's alert after it: the nsfw alert is still the one judged
                got.append((_alert(tid, "image", "ocr_term", 1000, terms=["x"]), 1060))
            continue  # else: INT8 scored it under, no alert
        if fp[ev.data] >= th:
            got.append((_alert(tid, "image", "nsfw", 1000 + i, threshold=th), 1050 + i))
    res = await judge(SimpleNamespace(got=got, bad=0), SPEC, worker, tmp_path,
                      Settings(data_dir=tmp_path), models_dir=models, settle_s=0, edge_s=0)
    im = res["image"]
    assert im["missed"] == 0 and im["false"] == 0, im
    if i8[df.data] >= th:
        assert im["alerted"] >= 1
    else:
        assert im["int8"] >= 1
