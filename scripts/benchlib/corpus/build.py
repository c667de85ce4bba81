"""A case's streams: synthetic ones made from their seed, real clips decoded from file."""

from __future__ import annotations

from scripts.benchlib.corpus.cases import Case
from scripts.benchlib.corpus.clips import clip_stream
from scripts.benchlib.corpus.synth import StreamData, synth_stream

__all__ = ["build"]


def build(case: Case) -> list[StreamData]:
    """Every stream of ``case``, events in arrival (ts) order, with its truth."""
    if case.kind == "clip":
        return [clip_stream(case)]
    if case.streams == 1:
        return [synth_stream(case.kind, dict(case.params), case.seed, case.name)]
    out = []
    for k, (audio, drift, text) in enumerate(case.params["per_stream"]):
        p = {**case.params, "audio_skew_ms": audio, "drift_ms_per_min": drift,
             "text_skew_ms": text}
        out.append(synth_stream(case.kind, p, case.seed + k, f"{case.name}-{k + 1}"))
    return out

