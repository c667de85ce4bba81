"""The content of each synthetic kind, in true (reference) time, before any clock is skewed.

A kind gives a :class:`Content`: the whole sound, a picture function, the
phrases that captions will carry (speech start, end, text) and the
informative and non-informative stretches. ``app``-independent: the clocks,
chunking and encoding are :mod:`scripts.benchlib.corpus.synth`'s job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scripts.benchlib.corpus.render import (
    Frames,
    H,
    W,
    bursts,
    drum_hit,
    jingle_note,
    place,
    syllabic_burst,
    texture,
)
from scripts.benchlib.corpus.truth import Stretch

__all__ = ["KINDS", "Content", "content_of"]

_PHRASES = ("欢迎来到直播间", "今天我们看看新产品", "hello and welcome back", "look at this",
            "这个价格非常优惠", "the sound is late", "大家好", "thank you all", "请点赞关注",
            "one more thing", "我们下次再见", "see you soon")


@dataclass
class Content:
    seconds: float
    audio: np.ndarray  # mono float64, true time, at ``sr``
    sr: int
    frames: Frames
    #: (speech start s, speech end s, text): what captions are made from.
    phrases: list[tuple[float, float, str]] = field(default_factory=list)
    stretches: list[Stretch] = field(default_factory=list)


def _card(rng: np.random.Generator) -> tuple[tuple[int, int, int, int], tuple[int, int, int]]:
    w, h = int(rng.integers(W // 3, W // 2)), int(rng.integers(H // 3, H // 2))
    x, y = int(rng.integers(4, W - w - 4)), int(rng.integers(4, H - h - 4))
    colour = tuple(int(c) for c in rng.integers(170, 256, 3))
    return (x, y, w, h), (colour[0], colour[1], colour[2])


def _speech(rng: np.random.Generator, audio: np.ndarray, sr: int, spans: list[tuple[float, float]],
            texts: list[str]) -> list[tuple[float, float, str]]:
    out = []
    for i, (a, b) in enumerate(spans):
        place(audio, syllabic_burst(rng, sr, b - a), a, sr)
        out.append((a, b, texts[i % len(texts)]))
    return out


def _visual_for_speech(rng: np.random.Generator, frames: Frames, spans: list[tuple[float, float]],
                       visual: str) -> None:
    """A card while each burst sounds, or a cut to the speaker at its start and away at its end."""
    if visual == "card":
        frames.cards = (frames.cards or []) + [(a, b, *_card(rng)) for a, b in spans]
        return
    wide = frames.background
    speakers = [texture(rng, wide.shape[1], wide.shape[0], cells=4) for _ in range(3)]
    scenes = list(frames.scenes or [])
    for i, (a, b) in enumerate(spans):
        scenes += [(a, speakers[i % 3]), (b, wide)]
    frames.scenes = sorted(scenes, key=lambda s: s[0])


def _noise_floor(rng: np.random.Generator, n: int, level: float) -> np.ndarray:
    return rng.normal(0, level, n) if level > 0 else np.zeros(n)


def talking(rng: np.random.Generator, p: dict[str, Any]) -> Content:
    secs, sr = float(p["seconds"]), int(p["sr"])
    audio = _noise_floor(rng, int(secs * sr), p.get("noise_floor", 0.003))
    spans = bursts(rng, 0.0, secs)
    phrases = _speech(rng, audio, sr, spans, list(_PHRASES))
    frames = Frames(background=texture(rng, W, H), noise=p.get("pixel_noise", 3.0))
    _visual_for_speech(rng, frames, spans, p.get("visual", "card"))
    return Content(secs, audio, sr, frames, phrases, [Stretch(0.0, secs, True)])


def music(rng: np.random.Generator, p: dict[str, Any]) -> Content:
    """Sections of drums and a jingle at their own tempo, short breaks between; cuts on beats.

    Every section starts with a cut; within it a cut falls on about a third of
    the beats. Tempo changes and breaks keep the beat grid from repeating, so
    one beat period is not an equally good answer.
    """
    secs, sr = float(p["seconds"]), int(p["sr"])
    audio = _noise_floor(rng, int(secs * sr), 0.002)
    scenes: list[tuple[float, np.ndarray]] = []
    t = rng.uniform(0.3, 0.8)
    while t < secs - 1.5:
        bpm = rng.uniform(84, 150)
        beat = 60.0 / bpm
        n_beats = int(rng.integers(8, 20))
        notes = rng.choice([262, 294, 330, 392, 440, 523, 587], size=n_beats)
        for k in range(n_beats):
            bt = t + k * beat
            if bt > secs - 0.3:
                break
            place(audio, drum_hit(rng, sr, 0.45 if k % 4 == 0 else 0.25), bt, sr)
            if k % 2 == 0:
                place(audio, jingle_note(sr, float(notes[k]), beat * 1.8, 0.08), bt, sr)
            if k == 0 or rng.random() < 0.33:
                scenes.append((bt, texture(rng, W, H, cells=int(rng.integers(3, 10)))))
        t += n_beats * beat + rng.uniform(0.3, 0.9)  # a break before the next section
    frames = Frames(background=texture(rng, W, H), noise=p.get("pixel_noise", 2.0), scenes=scenes)
    return Content(secs, audio, sr, frames, [], [Stretch(0.0, secs, True)])


def panning(rng: np.random.Generator, p: dict[str, Any]) -> Content:
    """A wide noisy picture panning slowly (the frame difference never falls to zero)."""
    secs = float(p["seconds"])
    inner = music if p.get("audio", "speech") == "music" else talking
    c = inner(rng, {**p, "visual": "card"})
    wide = texture(rng, W * 4, H, cells=40)
    c.frames.background = wide
    c.frames.pan_px_s = float(p.get("pan_px_s", 12.0))
    c.frames.noise = p.get("pixel_noise", 5.0)
    if c.frames.scenes:  # cuts to other wide pictures, which keep panning
        c.frames.scenes = [(a, texture(rng, W * 4, H, cells=int(rng.integers(10, 40))))
                           for a, _ in c.frames.scenes]
    c.stretches = [Stretch(0.0, secs, True)]
    return c


def static(rng: np.random.Generator, p: dict[str, Any]) -> Content:
    """Talking with cards, then a long stretch of still picture and silence, then talking again."""
    secs, sr = float(p["seconds"]), int(p["sr"])
    a, b = float(p["quiet_from_s"]), float(p["quiet_to_s"])
    floor = p.get("noise_floor", 0.002)
    audio = _noise_floor(rng, int(secs * sr), floor)
    spans = bursts(rng, 0.0, a) + bursts(rng, b, secs)
    phrases = _speech(rng, audio, sr, spans, list(_PHRASES))
    if p.get("digital_silence"):
        audio[int(a * sr):int(b * sr)] = 0.0
    frames = Frames(background=texture(rng, W, H), noise=p.get("pixel_noise", 2.0))
    _visual_for_speech(rng, frames, spans, p.get("visual", "card"))
    if p.get("frozen", True):
        frames.frozen = [(a, b)]
    return Content(secs, audio, sr, frames, phrases,
                   [Stretch(0.0, a, True), Stretch(a, b, False), Stretch(b, secs, True)])


_EN = ("hello and welcome back", "look at this", "the sound is late", "thank you all",
       "one more thing", "see you soon", "today we try the new phone", "it is on sale now",
       "please like and follow", "let me show you", "that is all for today", "good evening")
_ZH = ("欢迎来到直播间", "今天我们看看新产品", "这个价格非常优惠", "大家好", "请点赞关注",
       "我们下次再见", "先看一下外观", "质量真的很好", "库存不多了", "马上开始")


def asr(rng: np.random.Generator, p: dict[str, Any]) -> Content:
    """Talking in one language (``lang``: en or zh), each utterance its own phrase: what the
    per-caption ASR cases are made of (synth.py draws each caption's delay)."""
    c = talking(rng, {**p, "visual": p.get("visual", "speaker")})
    texts = _ZH if p.get("lang") == "zh" else _EN
    c.phrases = [(a, b, texts[i % len(texts)]) for i, (a, b, _) in enumerate(c.phrases)]
    return c


KINDS: dict[str, Callable[[np.random.Generator, dict[str, Any]], Content]] = {
    "talking": talking, "music": music, "panning": panning, "static": static, "asr": asr,
}


def content_of(kind: str, seed: int, p: dict[str, Any]) -> Content:
    return KINDS[kind](np.random.default_rng(seed), p)
