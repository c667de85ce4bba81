"""What a model failure does: isolation, bounded retries, a reason from the vocabulary."""

from __future__ import annotations

from typing import Any

import pytest

from app.errors import InvalidInputError, TransientError
from app.features.degrade import Level
from app.features.pipeline import FeaturePipeline
from app.settings import Settings
from schemas.dead_letter import REASONS, DeadLetter
from schemas.events import TextEvent
from schemas.features import FeatureRecord
from tests.helpers import raw_msg


class _Flaky:
    """Fails a whole batch when it holds a poison text; alone, a poison text raises
    ``RuntimeError`` and a 'busy' one a TransientError ``busy_failures`` times."""

    def __init__(self, busy_failures: int) -> None:
        self.load_s: dict[str, float] = {}
        self.calls: list[int] = []
        self.busy_left = busy_failures

    def load(self) -> None:
        return None

    def set_level(self, level: Level) -> None:
        return None

    def run(self, events: list[Any]) -> list[dict[str, Any] | Exception]:
        self.calls.append(len(events))
        texts = [e.text for e in events]
        if len(events) > 1 and any(t in ("poison", "busy") for t in texts):
            raise RuntimeError("the batch failed")
        if texts == ["poison"]:
            raise RuntimeError("model crashed on this input")
        if texts == ["busy"] and self.busy_left:
            self.busy_left -= 1
            raise TransientError("out of GPU memory")
        return [{"tokens": [t]} for t in texts]


def _pipe(tmp_path, ex: _Flaky, sleeps: list[float]) -> FeaturePipeline:
    p = FeaturePipeline(Settings(data_dir=tmp_path, models="light"), sleep=sleeps.append)
    p._extractors["text"] = ex
    return p


def _msgs(texts: list[str]):
    return [raw_msg(TextEvent(stream_id="s", ts=i, text=t), offset=i)
            for i, t in enumerate(texts)]


def test_a_failed_batch_is_run_record_by_record(tmp_path):
    ex, sleeps = _Flaky(busy_failures=0), []
    out = _pipe(tmp_path, ex, sleeps).process("text", _msgs(["ok", "poison", "fine"]))
    assert [type(o).__name__ for o in out] == ["FeatureRecord", "DeadLetter", "FeatureRecord"]
    dl = out[1]
    assert isinstance(dl, DeadLetter) and dl.error == "extract_failed" and dl.offset == 1
    assert "model crashed" in dl.detail and dl.value is not None
    assert ex.calls == [3, 1, 1, 1] and sleeps == []
    assert isinstance(out[0], FeatureRecord) and out[0].feats == {"tokens": ["ok"]}


def test_transient_failure_is_retried_with_growing_pauses(tmp_path):
    ex, sleeps = _Flaky(busy_failures=2), []
    out = _pipe(tmp_path, ex, sleeps).process("text", _msgs(["busy", "ok"]))
    assert all(isinstance(o, FeatureRecord) for o in out)
    assert sleeps == [0.05, 0.1]


def test_transient_failure_that_outlasts_the_retries_is_dead_lettered(tmp_path):
    ex, sleeps = _Flaky(busy_failures=99), []
    (dl,) = _pipe(tmp_path, ex, sleeps).process("text", _msgs(["busy"]))
    assert isinstance(dl, DeadLetter) and dl.error == "retries_exhausted"
    assert sleeps == [0.05, 0.1, 0.2]  # bounded: 0.35 s in all


def test_reasons_are_a_closed_vocabulary():
    assert {"extract_failed", "retries_exhausted", "bad_image"} <= set(REASONS)
    with pytest.raises(ValueError, match="oops"):
        DeadLetter(source_topic="t", partition=0, offset=0, key=None, value=b"", error="oops",
                   detail="")
    with pytest.raises(ValueError, match="oops"):
        InvalidInputError("oops", "")


def test_a_captions_alert_needs_no_model(tmp_path):
    """Issue 26: the term match is made before any model of the batch runs (the
    sentence embedding is not loaded, let alone run); a record that does not decode is
    left to process(), which dead-letters it; frames and audio get nothing here."""
    pipe = FeaturePipeline(Settings(data_dir=tmp_path, models="full", cache=False))
    msgs = [raw_msg(TextEvent(stream_id="s", ts=10, text="a bomb threat here", trace_id="t0")),
            raw_msg(TextEvent(stream_id="s", ts=20, text="the weather is fine"), offset=1),
            raw_msg(TextEvent(stream_id="s", ts=30, text="x"), offset=2, value=b"\xc1")]
    recs = pipe.alert_records("text", msgs)
    assert [(r.trace_id, r.feats) for r in recs] == [
        ("t0", {"terms": ["bomb threat"]}), ("text-0-1", {"terms": []})]
    assert recs[0].src_offset == 0 and recs[1].src_offset == 1 and recs[0].ts == 10
    ex = pipe.extractor("text")
    assert getattr(ex, "_e5", "missing") is None  # the embedding was not even loaded
    assert pipe.alert_records("image", msgs) == []
    light = FeaturePipeline(Settings(data_dir=tmp_path, models="light"))
    assert light.alert_records("text", msgs) == []
