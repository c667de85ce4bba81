"""The corpus: every case, its parameters, its seed and whether it is held out.

Skews are spread evenly from -max to +max within each kind (audio +-500 ms,
subtitles +-400 ms, ASR captions +500..+2000 ms; the ``asr`` kind of issue 25
draws each caption's own delay, 0.3..2.5 s) and the formats (frame rate,
sample rate, channels, chunk length, drift, jitter, dropout) are dealt round
the cases of a kind, not crossed. The held-out set was fixed by a rule (every
third case of each kind, and two of the five real clips, their replays
included) before any estimator result was looked at: do not move cases
between the sets after seeing numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["CASES", "SETS", "Case", "select"]

SETS = ("tune", "heldout", "all")


@dataclass(frozen=True)
class Case:
    name: str
    #: talking, music, panning, static, asr (synthetic) or clip (a real encoded file).
    kind: str
    params: dict[str, Any] = field(default_factory=dict, hash=False)
    seed: int = 0
    held_out: bool = False
    #: streams of this case (the issue's first report had three, replayed together).
    streams: int = 1

    @property
    def set(self) -> str:
        return "heldout" if self.held_out else "tune"


_FPS = (25, 5, 30, 10)
_AUDIO = ((16000, 1), (48000, 2), (8000, 1), (44100, 2), (44100, 1), (48000, 1), (16000, 2))
_CHUNK_MS = (20, 100, 200, 50, 40, 160)
_DRIFT = (0.0, 20.0, -45.0, 60.0, -60.0, 35.0)
_JITTER_MS = (0.0, 10.0, 20.0, 5.0)
_DROPOUT = (0.0, 0.02, 0.05, 0.01)


def _spread(n: int, lo: float, hi: float, seed: int) -> list[float]:
    """``n`` values evenly from lo to hi, in a fixed shuffled order."""
    vals = np.linspace(lo, hi, n).round(0)
    return [float(v) for v in np.random.default_rng(seed).permutation(vals)]


def _formats(i: int) -> dict[str, Any]:
    sr, ch = _AUDIO[i % len(_AUDIO)]
    return {"fps": _FPS[i % len(_FPS)], "sr": sr, "ch": ch, "chunk_ms": _CHUNK_MS[i % 6],
            "drift_ms_per_min": _DRIFT[i % 6], "jitter_ms": _JITTER_MS[i % 4],
            "dropout": _DROPOUT[i % 4]}


def _synthetic() -> list[Case]:
    cases: list[Case] = []
    deal = 0  # formats are dealt across all synthetic cases, so each kind gets a mix

    def add(kind: str, n: int, extra: list[dict[str, Any]], seconds: float, first: int = 1
            ) -> None:
        nonlocal deal
        skews = _spread(n, -500, 500, seed=len(cases) + 1)
        for j in range(n):
            p = {**_formats(deal), "seconds": seconds, "audio_skew_ms": skews[j], **extra[j]}
            cases.append(Case(name=f"{kind}-{j + first:02d}", kind=kind, params=p,
                              seed=1000 + 17 * len(cases), held_out=j % 3 == 2))
            deal += 1

    sub = _spread(4, -400, 400, seed=5)
    asr = _spread(3, 500, 2000, seed=6)
    add("talking", 9, [
        {"captions": "subtitles", "text_skew_ms": sub[0], "visual": "card"},
        {"captions": "asr", "text_skew_ms": asr[0], "visual": "speaker"},
        {"captions": "subtitles", "text_skew_ms": sub[1], "visual": "card"},
        {"captions": "none", "visual": "speaker"},
        {"captions": "asr", "text_skew_ms": asr[1], "visual": "card"},
        {"captions": "subtitles", "text_skew_ms": sub[2], "visual": "speaker"},
        {"captions": "asr", "text_skew_ms": asr[2], "visual": "card"},
        {"captions": "subtitles", "text_skew_ms": sub[3], "visual": "card"},
        {"captions": "none", "visual": "card", "noise_floor": 0.02},
    ], seconds=30.0)
    add("music", 6, [{}] * 6, seconds=30.0)
    psub = _spread(3, -400, 400, seed=7)
    add("panning", 6, [
        {"audio": "speech", "captions": "subtitles", "text_skew_ms": psub[0]},
        {"audio": "music"},
        {"audio": "speech", "captions": "subtitles", "text_skew_ms": psub[1], "pan_px_s": 25.0},
        {"audio": "music", "pan_px_s": 6.0},
        {"audio": "speech", "captions": "subtitles", "text_skew_ms": psub[2]},
        {"audio": "music", "pan_px_s": 20.0},
    ], seconds=30.0)
    ssub = _spread(5, -400, 400, seed=8)
    add("static", 5, [
        {"captions": "subtitles", "text_skew_ms": ssub[0], "quiet_from_s": 10.0,
         "quiet_to_s": 30.0},
        {"captions": "subtitles", "text_skew_ms": ssub[1], "quiet_from_s": 12.0,
         "quiet_to_s": 28.0, "frozen": False, "pixel_noise": 3.0},
        {"captions": "subtitles", "text_skew_ms": ssub[2], "quiet_from_s": 10.0,
         "quiet_to_s": 32.0, "digital_silence": True},
        {"captions": "subtitles", "text_skew_ms": ssub[3], "quiet_from_s": 14.0,
         "quiet_to_s": 30.0, "visual": "speaker", "frozen": False},
        {"captions": "subtitles", "text_skew_ms": ssub[4], "quiet_from_s": 10.0,
         "quiet_to_s": 30.0, "digital_silence": True},
    ], seconds=40.0)
    # issue 25: per-caption ASR, added after the sets above were fixed (their formats are
    # dealt on, so no case above changes). Delays drawn per caption 0.3-2.5 s; merges,
    # splits and drops in turns; English and Chinese text; the held-out third by the same
    # rule (every third case of the kind), fixed here before any result was seen.
    mix = ((0.15, 0.0, 0.0), (0.0, 0.2, 0.0), (0.0, 0.0, 0.1), (0.1, 0.1, 0.05))
    add("asr", 12, [
        {"captions": "asr", "lang": "en" if j % 2 == 0 else "zh", "asr_delay_s": (0.3, 2.5),
         "merge": mix[j % 4][0], "split": mix[j % 4][1], "drop": mix[j % 4][2],
         "visual": "speaker" if j % 3 else "card"}
        for j in range(12)
    ], seconds=40.0)
    # issue 25: music with cuts on beats fooled the estimate only on held-out cases (locked
    # a beat off, confidently); six more, added before any result of theirs was seen, so
    # the tune set has some to calibrate on. Held out by the same rule.
    add("music", 6, [{}] * 6, seconds=30.0, first=7)
    # issue 25, 2026-12-05: the first ASR held-out third had been looked at three times
    # while the alignment was tuned, so it is no longer blind. Twelve more, drawn and held
    # out by the same rule (asr-15, -18, -21, -24) before any result of theirs was seen;
    # the mixes are dealt the other way round so each held-out case gets another one.
    add("asr", 12, [
        {"captions": "asr", "lang": "zh" if j % 2 == 0 else "en", "asr_delay_s": (0.3, 2.5),
         "merge": mix[-1 - j % 4][0], "split": mix[-1 - j % 4][1], "drop": mix[-1 - j % 4][2],
         "visual": "card" if j % 3 else "speaker"}
        for j in range(12)
    ], seconds=40.0, first=13)
    return cases


def _issue() -> Case:
    """The issue's first report: 3 streams x 24 s, 25 fps, audio skew +-120..420 ms with drift,
    caption skew +-80..380 ms, syllabic bursts with a bright card each, sensor noise between."""
    return Case(name="issue-first-report", kind="talking", seed=14, streams=3, params={
        "seconds": 24.0, "fps": 25, "sr": 16000, "ch": 1, "chunk_ms": 100, "jitter_ms": 10.0,
        "dropout": 0.01, "captions": "subtitles", "visual": "card", "pixel_noise": 4.0,
        # per stream: (audio skew, drift ms/min, caption skew)
        "per_stream": [(320.0, 30.0, -250.0), (-120.0, -40.0, 380.0), (420.0, 55.0, -80.0)],
    })


#: The real clips (tests/data/corpus/, made by scripts/make_corpus.py) and their replays:
#: (clip, audio ms added on replay, text ms added, replay fps, audio chunk ms).
_CLIP_REPLAYS = {
    "en-talking": [(0.0, 0.0, 25, 100), (-450.0, 250.0, 10, 40)],
    "cmn-talking": [(0.0, 0.0, 25, 100), (-500.0, 400.0, 10, 200)],
    "en-music": [(0.0, 0.0, 25, 100), (-560.0, 0.0, 5, 20)],
    "en-static": [(0.0, 0.0, 25, 100), (-300.0, 300.0, 10, 100)],
    "en-panning": [(0.0, 0.0, 25, 100), (-700.0, -300.0, 30, 50)],
}
#: chosen before any estimator result: one language, one picture style.
_HELD_OUT_CLIPS = ("cmn-talking", "en-panning")


def _clips() -> list[Case]:
    out = []
    for clip, replays in _CLIP_REPLAYS.items():
        for j, (da, dt, fps, chunk) in enumerate(replays):
            out.append(Case(name=f"clip-{clip}-{j + 1}", kind="clip", seed=j, params={
                "clip": clip, "add_audio_ms": da, "add_text_ms": dt, "fps": fps,
                "chunk_ms": chunk}, held_out=clip in _HELD_OUT_CLIPS))
    return out


CASES: list[Case] = [*_synthetic(), _issue(), *_clips()]


def select(which: str = "all", kind: str | None = None, names: list[str] | None = None
           ) -> list[Case]:
    """Cases of a set (``tune``, ``heldout`` or ``all``), optionally one kind or some names."""
    if which not in SETS:
        raise ValueError(f"set {which!r}: want one of {SETS}")
    out = [c for c in CASES if which == "all" or c.set == which]
    if kind:
        out = [c for c in out if c.kind == kind]
    if names:
        out = [c for c in out if c.name in names]
    return out
