"""The real encoded clips (tests/data/corpus/): decoded as ``mmsync produce --video`` does.

Each clip is ``NAME.mp4`` (h264/aac), ``NAME.srt`` (its sidecar captions) and
``NAME.json`` (its truth on the file's own time line: the audio delay baked
into the file, the captions' shift, the informative stretches). A replay may
shift the decoded audio and caption timestamps further, so one clip gives
several skews; its truth is then the baked-in offset plus the added one.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from pathlib import Path

from app.clients.media import video_records
from schemas.events import AudioChunk, Event, TextEvent, decode_event
from scripts.benchlib.corpus.cases import Case
from scripts.benchlib.corpus.synth import START_US, StreamData
from scripts.benchlib.corpus.truth import Caption, Offset, StreamTruth

__all__ = ["CLIP_DIR", "clip_paths", "clip_stream", "clip_truth", "decoded"]

CLIP_DIR = Path(__file__).resolve().parents[3] / "tests" / "data" / "corpus"


def clip_paths(clip: str, root: Path = CLIP_DIR) -> tuple[Path, Path, Path]:
    """(video, srt, truth json) of a clip."""
    return root / f"{clip}.mp4", root / f"{clip}.srt", root / f"{clip}.json"


def clip_truth(clip: str, root: Path = CLIP_DIR) -> StreamTruth:
    """The clip's truth on its own time line (start_us 0)."""
    return StreamTruth.load(clip_paths(clip, root)[2])


@lru_cache(maxsize=16)
def decoded(clip: str, fps: float, chunk_ms: int, root: Path = CLIP_DIR) -> tuple[Event, ...]:
    """The clip's events as ``mmsync produce --video F --srt S --fps N`` publishes them (ts order,
    media time 0 at START_US). Cached: replays of one clip decode it once."""
    video, srt, _ = clip_paths(clip, root)
    out: list[Event] = []
    for _, (modality, key, value) in video_records(video, "clip", START_US, fps=fps,
                                                    chunk_ms=chunk_ms, srt=srt, timed=True):
        out.append(decode_event(modality, key, value))
    return tuple(out)


def _shift(ev: Event, sid: str, audio_us: int, text_us: int) -> Event:
    d = audio_us if isinstance(ev, AudioChunk) else text_us if isinstance(ev, TextEvent) else 0
    return dataclasses.replace(ev, stream_id=sid, ts=ev.ts + d)


def clip_stream(case: Case, root: Path = CLIP_DIR) -> StreamData:
    p = case.params
    clip = str(p["clip"])
    base = clip_truth(clip, root)
    da, dt = float(p.get("add_audio_ms", 0.0)), float(p.get("add_text_ms", 0.0))
    events = [_shift(ev, case.name, int(da * 1000), int(dt * 1000))
              for ev in decoded(clip, float(p.get("fps", 25)), int(p.get("chunk_ms", 100)), root)]
    order = {"image": 0, "audio": 1, "text": 2}
    events.sort(key=lambda e: (e.ts, order[e.modality]))
    offsets = {}
    for m, o in base.offsets.items():
        add = da if m == "audio" else dt
        offsets[m] = Offset(skew_ms=o.skew_ms + add, drift_ms_per_min=o.drift_ms_per_min,
                            style=o.style, captions=tuple(
                                Caption(c.speech_s, c.delay_ms + add, c.text) for c in o.captions))
    truth = StreamTruth(stream_id=case.name, start_us=START_US, seconds=base.seconds,
                        offsets=offsets, stretches=list(base.stretches),
                        info={**base.info, "kind": "clip", "clip": clip, "fps": p.get("fps"),
                              "chunk_ms": p.get("chunk_ms"), "add_audio_ms": da,
                              "add_text_ms": dt})
    return StreamData(truth=truth, events=events)
