"""Resampling a window's records onto the sync grid (pure functions, no state).

Each modality has its own function; :func:`build_window` assembles the
AlignedWindow from them. Records arrive as ``(corrected_ts, record)`` pairs:
their time on the reference clock, the skew estimate already applied.
The one thing that carries from window to window, the image scalars held
from the last frame (sample-and-hold: a frame persists on screen), goes in
as ``hold`` and comes back updated; the caller keeps it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from schemas.aligned import AlignedWindow
from schemas.codec import pack_array, unpack_array
from schemas.features import FeatureRecord

__all__ = ["GridSpec", "audio_grid", "build_window", "image_grid", "mean_embedding",
           "text_grid"]

Timed = tuple[int, FeatureRecord]

#: The image scalars held across ticks and windows.
_HELD = ("luma", "change", "nsfw")


@dataclass(frozen=True, slots=True)
class GridSpec:
    start_us: int
    window_us: int
    ticks: int
    tick_us: int

    @property
    def end_us(self) -> int:
        return self.start_us + self.window_us

    def tick_of(self, ts: int) -> int:
        return min(self.ticks - 1, max(0, (ts - self.start_us) // self.tick_us))


def mean_embedding(recs: Iterable[FeatureRecord]) -> dict[str, Any] | None:
    """The window's mean embedding, unit length, float16 (one per window, not per
    tick: 1280 numbers x 20 ticks would dwarf the rest of the window)."""
    embs = [unpack_array(r.feats["emb"]).astype(np.float32) for r in recs if "emb" in r.feats]
    if not embs:
        return None
    m = np.mean(embs, axis=0)
    norm = float(np.linalg.norm(m))
    return pack_array((m / norm if norm > 0 else m).astype(np.float16))


def image_grid(frames: list[Timed], g: GridSpec, hold: dict[str, float]
               ) -> tuple[dict[str, Any], dict[str, float]]:
    """Scalars held from the last frame at or before each tick end; ``change`` as an
    event at its frame's tick (not held: it is a change, not a level). Returns the grid
    and the held values after the window."""
    frames = sorted(frames, key=lambda p: p[0])
    held = dict(hold)
    T = g.ticks
    out: dict[str, Any] = {name: [None] * T for name in _HELD}
    fi = 0
    for k in range(T):
        t_end = g.start_us + (k + 1) * g.tick_us
        while fi < len(frames) and frames[fi][0] < t_end:
            feats = frames[fi][1].feats
            for name in _HELD:
                if name in feats:
                    held[name] = float(feats[name])
            fi += 1
        for name in _HELD:
            out[name][k] = held.get(name)
    out["change"] = [0.0] * T if frames else [None] * T
    for ts, rec in frames:
        k = g.tick_of(ts)
        out["change"][k] = max(out["change"][k], float(rec.feats.get("change", 0.0)))
    out["emb"] = mean_embedding(r for _, r in frames)
    return out, held


def audio_grid(chunks: list[Timed], g: GridSpec) -> dict[str, Any]:
    """Per-hop series (RMS, speech probability) averaged per tick; None where no audio."""
    T = g.ticks
    out: dict[str, Any] = {}
    for name in ("rms", "speech"):
        sums = np.zeros(T, dtype=np.float64)
        ns = np.zeros(T, dtype=np.int64)
        for ts, rec in chunks:
            if name not in rec.feats:
                continue
            vals = unpack_array(rec.feats[name]).astype(np.float64).reshape(-1)
            hop = int(rec.feats.get("hop_us", 50_000))
            t = ts + np.arange(len(vals), dtype=np.int64) * hop
            inside = (t >= g.start_us) & (t < g.end_us)
            bins = np.clip((t - g.start_us) // g.tick_us, 0, T - 1)
            np.add.at(sums, bins[inside], vals[inside])
            np.add.at(ns, bins[inside], 1)
        out[name] = [float(s / n) if n else None for s, n in zip(sums, ns, strict=True)]
    return out


def text_grid(captions: list[Timed], g: GridSpec) -> dict[str, Any]:
    """Caption presence per tick over its duration; tokens and terms at its start tick. A
    caption's time is its aligned time (on its own speech, ``app.align.captions``); one
    whose aligned time lies before the window (it joined the oldest open window after its
    own was emitted) sits at the first tick."""
    T = g.ticks
    caption = [0.0] * T
    tokens: list[list[str]] = [[] for _ in range(T)]
    terms: list[list[str]] = [[] for _ in range(T)]
    for ts, rec in captions:
        k0 = g.tick_of(ts)
        k1 = g.tick_of(ts + max(rec.dur, g.tick_us) - 1)
        for k in range(k0, k1 + 1):
            caption[k] = max(caption[k], float(rec.feats.get("caption", 1.0)))
        tokens[k0].extend(rec.feats.get("tokens", ()))
        terms[k0].extend(rec.feats.get("terms", ()))
    return {"caption": caption, "tokens": tokens, "terms": terms,
            "emb": mean_embedding(r for _, r in captions)}


def build_window(stream_id: str, g: GridSpec, records: list[Timed], *, rate_hz: float,
                 modalities: tuple[str, ...], hold: dict[str, float],
                 offsets_ms: dict[str, float], confidence: dict[str, float],
                 emitted_at: int) -> tuple[AlignedWindow, dict[str, float]]:
    """The AlignedWindow of ``records`` (each with its corrected ts) and the image
    values held after it."""
    by_mod: dict[str, list[Timed]] = {m: [] for m in modalities}
    counts = dict.fromkeys(modalities, 0)
    stages: dict[str, float] = {}
    trace_ids: list[str] = []
    sources: list[list[Any]] = []
    nsfw: list[float] = []
    terms: set[str] = set()
    for ts, rec in records:
        by_mod.setdefault(rec.modality, []).append((ts, rec))
        counts[rec.modality] = counts.get(rec.modality, 0) + 1
        if rec.trace_id:
            trace_ids.append(rec.trace_id)
        sources.append([rec.modality, rec.src_partition, rec.src_offset])
        for stage, secs in rec.stages.items():
            stages[stage] = stages.get(stage, 0.0) + float(secs)
        if "nsfw" in rec.feats:
            nsfw.append(float(rec.feats["nsfw"]))
        terms.update(rec.feats.get("terms", ()))
    image, held = image_grid(by_mod.get("image", []), g, hold)
    grid = {"image": image, "audio": audio_grid(by_mod.get("audio", []), g),
            "text": text_grid(by_mod.get("text", []), g)}
    win = AlignedWindow(
        stream_id=stream_id, window_start=g.start_us, window_end=g.end_us, rate_hz=rate_hz,
        offsets_ms=offsets_ms, confidence=confidence, counts=counts, grid=grid,
        moderation={"nsfw_max": max(nsfw) if nsfw else None, "terms": sorted(terms)},
        trace_ids=trace_ids, emitted_at=emitted_at, stages=stages, sources=sources,
    )
    return win, held
