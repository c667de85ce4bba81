"""Synthetic corpus streams: content on skewed, drifting, jittery clocks, as contract events.

The reference (image) clock is true time: a frame sampled at true time ``t``
gets ``ts = start + t`` (plus jitter). Audio sampled at true time ``t`` gets
``ts = start + t + offset(t)``, with ``offset = skew + drift * t``; captions get
``ts = start + speech start + their delay``. Jitter moves each timestamp by up
to +-``jitter_ms``; a dropout loses an item before the producer (its seq is
skipped, as a real gap would be).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import simplejpeg

from schemas.events import AudioChunk, Event, FrameEvent, TextEvent
from scripts.benchlib.corpus.content import Content, content_of
from scripts.benchlib.corpus.truth import Caption, Offset, StreamTruth

__all__ = ["START_US", "StreamData", "synth_stream"]

#: Media start of every synthetic stream: in the past (the contract refuses far-future ts),
#: on a window boundary.
START_US = 1_700_000_000_000_000


@dataclass
class StreamData:
    truth: StreamTruth
    #: in arrival order: ts order, as a live source (or ``produce --realtime``) sends them.
    events: list[Event]


def _jitter(rng: np.random.Generator, ms: float) -> int:
    return int(rng.uniform(-ms, ms) * 1000) if ms > 0 else 0


def _frames(c: Content, p: dict[str, Any], sid: str, rng: np.random.Generator,
            start: int) -> list[Event]:
    fps, out = float(p["fps"]), list[Event]()
    pic_rng = np.random.default_rng(rng.integers(1 << 32))
    for k in range(int(c.seconds * fps)):
        t = k / fps
        img = c.frames(t, pic_rng)
        if rng.random() < p.get("dropout", 0.0):
            continue
        data = simplejpeg.encode_jpeg(img, quality=85, colorspace="RGB")
        out.append(FrameEvent(stream_id=sid, ts=start + int(t * 1e6) + _jitter(rng, p["jitter_ms"]),
                              seq=k, data=data, fmt="jpeg"))
    return out


def _audio(c: Content, p: dict[str, Any], sid: str, rng: np.random.Generator, start: int,
           off: Offset) -> list[Event]:
    sr, ch = c.sr, int(p.get("ch", 1))
    n = max(1, sr * int(p["chunk_ms"]) // 1000)
    x = np.clip(c.audio, -1, 1)
    if ch == 2:  # a second microphone: the same sound, a little quieter, its own hiss
        x = np.stack([x, np.clip(0.8 * x + rng.normal(0, 0.001, len(x)), -1, 1)], axis=1)
    else:
        x = x[:, None]
    pcm = (x * 32767).astype("<i2")
    out: list[Event] = []
    for i in range(len(pcm) // n):
        t0 = i * n / sr
        if rng.random() < p.get("dropout", 0.0):
            continue
        ts = start + int((t0 + off.at(t0) / 1000) * 1e6) + _jitter(rng, p["jitter_ms"])
        out.append(AudioChunk(stream_id=sid, ts=ts, seq=i, data=pcm[i * n:(i + 1) * n].tobytes(),
                              sr=sr, ch=ch))
    return out


def _captions(c: Content, p: dict[str, Any], rng: np.random.Generator) -> Offset | None:
    """The text offset: subtitles shift every cue by one amount and time their own durations;
    ASR captions trail their speech by the base delay plus their own +-spread (the
    truth is then their delays' median)."""
    style = p.get("captions", "none")
    if style == "none" or not c.phrases:
        return None
    base = float(p["text_skew_ms"])
    spread = float(p.get("asr_spread_ms", 250.0)) if style == "asr" else 0.0
    caps = tuple(Caption(speech_s=a, delay_ms=base + (rng.uniform(-spread, spread) if spread
                                                      else 0.0), text=txt)
                 for a, _, txt in c.phrases)
    # ASR: the offset that fits the captions best in |error| is their delays' median
    skew = float(np.median([cap.delay_ms for cap in caps])) if spread else base
    return Offset(skew_ms=skew, style=style, captions=caps)


def _text(c: Content, off: Offset, p: dict[str, Any], sid: str, rng: np.random.Generator,
          start: int) -> list[Event]:
    out: list[Event] = []
    ends = [b for _, b, _ in c.phrases]
    for i, cap in enumerate(off.captions):
        if off.style == "asr":
            dur = ends[i] - cap.speech_s + rng.uniform(0.0, 0.3)
        else:  # a subtitle stays up for reading time, not for the speech's length
            nxt = off.captions[i + 1].speech_s if i + 1 < len(off.captions) else c.seconds
            dur = max(0.4, min(rng.uniform(1.0, 3.5), nxt - cap.speech_s - 0.05))
        if rng.random() < p.get("dropout", 0.0):
            continue
        ts = start + int((cap.speech_s + cap.delay_ms / 1000) * 1e6) + _jitter(rng, p["jitter_ms"])
        out.append(TextEvent(stream_id=sid, ts=max(0, ts), seq=i, text=cap.text,
                             dur=int(dur * 1e6), lang="zh" if ord(cap.text[0]) > 0x2000 else "en"))
    return out


def _asr_events(c: Content, p: dict[str, Any], sid: str, rng: np.random.Generator, start: int
                ) -> tuple[Offset, list[Event]]:
    """ASR captions as a recogniser makes them: each caption's delay drawn on its own from
    ``asr_delay_s`` (lo, hi), in publishing order (a caption never comes before the one
    it follows); some merge two utterances (``merge``: the share), some split one in two
    (``split``: the second part's speech starts where its words do, inside the utterance),
    some are never published (``drop``). A caption's truth is the start of the speech it
    belongs to; ``seq`` is its index in the truth's captions."""
    lo, hi = p["asr_delay_s"]
    pieces: list[tuple[float, float, str]] = []  # (speech start s, speech end s, text)
    i, ph = 0, c.phrases
    while i < len(ph):
        a, b, txt = ph[i]
        u = rng.random()
        if u < p.get("merge", 0.0) and i + 1 < len(ph):
            pieces.append((a, ph[i + 1][1], f"{txt} {ph[i + 1][2]}"))
            i += 2
            continue
        if u < p.get("merge", 0.0) + p.get("split", 0.0) and b - a > 1.2:
            cut = a + (b - a) * rng.uniform(0.4, 0.6)
            half = max(1, len(txt) // 2)
            pieces += [(a, cut, txt[:half]), (cut, b, txt[half:])]
        else:
            pieces.append((a, b, txt))
        i += 1
    caps: list[Caption] = []
    events: list[Event] = []
    last = -1.0
    for a, b, txt in pieces:
        delay = rng.uniform(lo, hi)
        shown = max(a + delay, last + 0.1)  # in order: a caption waits for the one before
        dropped = rng.random() < p.get("drop", 0.0)
        if dropped:
            continue
        last = shown
        seq = len(caps)
        caps.append(Caption(speech_s=a, delay_ms=(shown - a) * 1000, text=txt))
        if rng.random() < p.get("dropout", 0.0):
            continue
        ts = start + int(shown * 1e6) + _jitter(rng, p["jitter_ms"])
        dur = b - a + rng.uniform(0.0, 0.3)
        events.append(TextEvent(stream_id=sid, ts=max(0, ts), seq=seq, text=txt,
                                dur=int(dur * 1e6), lang=str(p.get("lang", "en")),
                                trace_id=f"{sid}:text:{seq}"))
    skew = float(np.median([cap.delay_ms for cap in caps])) if caps else 0.0
    return Offset(skew_ms=skew, style="asr", captions=tuple(caps)), events


def synth_stream(kind: str, p: dict[str, Any], seed: int, stream_id: str) -> StreamData:
    """One synthetic stream of ``kind`` with parameters ``p`` (see ``cases.py``)."""
    c = content_of(kind, seed, p)
    rng = np.random.default_rng(seed + 7919)
    start = int(p.get("start_us", START_US))
    audio_off = Offset(skew_ms=float(p["audio_skew_ms"]),
                       drift_ms_per_min=float(p.get("drift_ms_per_min", 0.0)))
    per_caption = "asr_delay_s" in p  # per-caption ASR (issue 25)
    text_off = None if per_caption else _captions(c, p, rng)  # rng order as before
    events = _frames(c, p, stream_id, rng, start) + _audio(c, p, stream_id, rng, start, audio_off)
    if per_caption:
        text_off, text = _asr_events(c, p, stream_id, rng, start)
        events += text
    elif text_off:
        events += _text(c, text_off, p, stream_id, rng, start)
    order = {"image": 0, "audio": 1, "text": 2}
    events.sort(key=lambda e: (e.ts, order[e.modality]))
    offsets = {"audio": audio_off} | ({"text": text_off} if text_off else {})
    keys = ("fps", "sr", "ch", "chunk_ms", "jitter_ms", "dropout", "captions")
    info: dict[str, Any] = {k: p[k] for k in keys if k in p}
    truth = StreamTruth(stream_id=stream_id, start_us=start, seconds=c.seconds, offsets=offsets,
                        stretches=c.stretches, info={"kind": kind, **info})
    return StreamData(truth=truth, events=events)
