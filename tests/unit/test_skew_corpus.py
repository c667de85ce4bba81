"""The skew estimate on a handful of corpus cases, replayed offline (issue 14).

Bounds are loose (two to three times what the benchmark measures on these
cases) so that a change of numpy or of a codec cannot flake them; the
figures themselves are in docs/benchmarks.md (``scripts/bench_align.py
--corpus``). Each case is named, so a failure says where to look.
"""

from __future__ import annotations

import numpy as np
import pytest

from scripts.benchlib.corpus.cases import select
from scripts.benchlib.corpus.run import run_case
from scripts.benchlib.corpus.score import WARMUP_S, Scored


def _scored(name: str) -> list[Scored]:
    (case,) = select("all", None, [name])
    return run_case(case, with_oracle=False).scored


def _informative(s: Scored) -> list[tuple[float, float]]:
    """(|error| ms, confidence) of the windows in informative media after the warm-up."""
    return [(w.err, w.conf) for w in s.wins if w.informative and w.t_s >= WARMUP_S]


@pytest.mark.parametrize("name", ["issue-first-report", "talking-01", "clip-en-talking-1"])
def test_speech_with_cards_audio_and_subtitles(name):
    sure_share: dict[str, list[bool]] = {"audio": [], "text": []}
    for s in _scored(name):
        if s.label == "text-asr":
            continue
        got = _informative(s)
        errs = [e for e, _ in got]
        assert np.median(errs) <= 40 and np.percentile(errs, 95) <= 120, (s.stream_id, s.label)
        assert max((e for e, c in got if c >= 0.5), default=0) <= 100, (s.stream_id, s.label)
        sure_share[s.modality] += [c >= 0.5 for _, c in got]
    # over the case's streams; captions' confidence is the more cautious (it needs
    # several of them to agree)
    assert np.mean(sure_share["audio"]) >= 0.5
    if sure_share["text"]:
        assert np.mean(sure_share["text"]) >= 0.25


def test_long_silence_lowers_confidence_and_holds_the_offset():
    (s,) = [s for s in _scored("static-04") if s.modality == "audio"]
    assert s.quiet, "static-04 has a quiet stretch"
    for conf, moved in s.quiet:
        assert conf <= 0.3 and moved <= 40
    got = _informative(s)
    assert np.median([e for e, _ in got]) <= 40


def test_music_cuts_on_beats():
    (s,) = [s for s in _scored("music-04") if s.modality == "audio"]
    errs = [e for e, _ in _informative(s)]
    assert np.median(errs) <= 40 and np.percentile(errs, 95) <= 120
