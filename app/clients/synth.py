"""A synthetic multimodal stream whose content co-occurs across modalities.

At each "scene" boundary the picture changes brightness, a voiced burst
sounds and a caption starts: the same moments are visible in all three
activity signals, which is what the aligner's skew estimation needs. Audio
(or text) timestamps can be shifted by a skew and a drift to emulate clocks
that disagree, with jitter on every timestamp.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import simplejpeg

from schemas.events import AudioChunk, Event, FrameEvent, TextEvent, encode_event

__all__ = ["SynthSpec", "Truth", "synth_events", "synth_records"]

_CAPTIONS = (
    "欢迎来到直播间", "今天我们看看新产品", "这个价格非常优惠", "hello and welcome back",
    "look at this new camera", "大家好请点赞关注", "the sound is a little late", "谢谢大家的支持",
)


@dataclass(frozen=True)
class SynthSpec:
    stream_id: str = "demo-1"
    seconds: float = 10.0
    fps: float = 5.0
    audio_chunk_ms: int = 100
    sr: int = 16000
    ch: int = 1
    width: int = 64
    height: int = 48
    #: mean time between scene changes, s.
    scene_s: float = 1.6
    #: audio clock lag behind the image clock at t=0, us (positive: later ts).
    audio_skew_us: int = 0
    #: additional audio lag per minute of media, us.
    audio_drift_us_per_min: int = 0
    text_skew_us: int = 0
    jitter_us: int = 0
    #: probability that any one item is dropped (lost before the producer).
    dropout: float = 0.0
    start_us: int = 1_000_000_000
    seed: int = 1


    def injected_ms(self, modality: str, t_s: float = 0.0) -> float:
        """The lag injected into ``modality`` behind the image clock at media ``t_s``, ms."""
        if modality == "audio":
            return (self.audio_skew_us + self.audio_drift_us_per_min * t_s / 60.0) / 1000.0
        return self.text_skew_us / 1000.0 if modality == "text" else 0.0


@dataclass(frozen=True)
class Truth:
    scene_times_us: list[int]


def _scenes(spec: SynthSpec, rng: random.Random) -> list[float]:
    t, out = 0.3, []
    while t < spec.seconds - 0.3:
        out.append(t)
        t += max(0.5, rng.expovariate(1.0 / spec.scene_s))
    return out


def synth_events(spec: SynthSpec) -> tuple[list[Event], Truth]:
    """Events of one stream in true-time order (seq per modality from 0)."""
    timed, truth = _timed_events(spec)
    return [e for _, e in timed], truth


def _timed_events(spec: SynthSpec) -> tuple[list[tuple[float, Event]], Truth]:
    rng = random.Random(spec.seed)
    nrng = np.random.default_rng(spec.seed)
    scenes = _scenes(spec, rng)
    events: list[tuple[float, Event]] = []

    def jit() -> int:
        return rng.randint(-spec.jitter_us, spec.jitter_us) if spec.jitter_us else 0

    def scene_at(t: float) -> int:
        return sum(1 for s in scenes if s <= t)

    # image
    n_frames = int(spec.seconds * spec.fps)
    for i in range(n_frames):
        t = i / spec.fps
        k = scene_at(t)
        level = 40 + (k * 67) % 180
        img = np.full((spec.height, spec.width, 3), level, dtype=np.uint8)
        img[: spec.height // 2, : spec.width // 2, k % 3] = 255 - level
        img = np.clip(img.astype(np.int16) + nrng.integers(-3, 4, img.shape), 0, 255)
        data = simplejpeg.encode_jpeg(img.astype(np.uint8), quality=85)
        if rng.random() >= spec.dropout:
            ts = spec.start_us + int(t * 1e6) + jit()
            events.append((t, FrameEvent(stream_id=spec.stream_id, ts=max(0, ts), seq=i,
                                         data=data, fmt="jpeg")))
    # audio: quiet noise, with a voiced burst of 400 ms at each scene change
    hop = spec.audio_chunk_ms / 1000
    n = int(spec.sr * hop)
    for i in range(int(spec.seconds / hop)):
        t0 = i * hop
        tt = t0 + np.arange(n) / spec.sr
        x = nrng.normal(0, 0.003, n)
        for s in scenes:
            on = (tt >= s) & (tt < s + 0.4)
            if on.any():
                f0 = 140 + 40 * np.sin(2 * np.pi * 3 * (tt - s))
                x += on * 0.3 * (np.sin(2 * np.pi * f0 * tt) + 0.5 * np.sin(4 * np.pi * f0 * tt))
        pcm = (np.clip(x, -1, 1) * 32767).astype("<i2")
        if spec.ch > 1:
            pcm = np.repeat(pcm, spec.ch)
        lag = spec.audio_skew_us + spec.audio_drift_us_per_min * t0 / 60.0
        if rng.random() >= spec.dropout:
            ts = spec.start_us + int(t0 * 1e6 + lag) + jit()
            events.append((t0, AudioChunk(stream_id=spec.stream_id, ts=max(0, ts), seq=i,
                                          data=pcm.tobytes(), sr=spec.sr, ch=spec.ch)))
    # text: a caption at each scene change
    for i, s in enumerate(scenes):
        if rng.random() >= spec.dropout:
            ts = spec.start_us + int(s * 1e6) + spec.text_skew_us + jit()
            events.append((s, TextEvent(stream_id=spec.stream_id, ts=max(0, ts), seq=i,
                                        text=_CAPTIONS[i % len(_CAPTIONS)], dur=800_000,
                                        lang="zh" if i % 3 != 0 else "en")))
    events.sort(key=lambda p: p[0])
    truth = Truth([spec.start_us + int(s * 1e6) for s in scenes])
    return events, truth


def synth_records(specs: list[SynthSpec]) -> Iterator[tuple[str, bytes, bytes]]:
    """(modality, key, value) of several streams, interleaved in true-time order."""
    per = [_timed_events(sp)[0] for sp in specs]
    merged = sorted(((t, j, e) for j, evs in enumerate(per) for t, e in evs),
                    key=lambda p: (p[0], p[1]))
    for _, _, ev in merged:
        yield ev.modality, ev.stream_id.encode(), encode_event(ev)
