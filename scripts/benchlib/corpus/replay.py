"""Offline harness: a case through FeaturePipeline(light) and the pure Aligner on a simulated clock.

Each event arrives at its media time (``ts`` relative to the stream's start,
the pace of ``mmsync produce --realtime``), in ts order across modalities and
streams; the wall clock given to the aligner advances with it. As in
``agents/aligner.py``, every add is followed by a poll of its stream, and a
50 ms timer polls every stream; a window's ``offsets_ms`` and ``confidence``
are read the moment it is emitted. Nothing waits on real time, so a 30 s
case replays in about a second.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from app.align.aligner import Aligner, AlignerConfig
from app.consumed import RawMsg
from app.features.pipeline import FeaturePipeline
from app.settings import Settings
from schemas.events import encode_event
from schemas.features import FeatureRecord
from scripts.benchlib.corpus.synth import StreamData
from scripts.benchlib.corpus.truth import StreamTruth

__all__ = ["Replay", "Window", "aligner_config", "features", "replay"]

#: The aligner agent's idle timer, s (agents/aligner.py ``_TICK_S``).
TICK_S = 0.05
#: Simulated wall clock at media time 0, s.
_T0 = 1000.0


@dataclass(frozen=True)
class Window:
    stream_id: str
    start_us: int
    end_us: int
    #: simulated wall time of its emission, s since the replay began.
    emitted_s: float
    offsets_ms: dict[str, float]
    confidence: dict[str, float]
    counts: dict[str, int]
    #: per caption merged: (seq, ts, aligned ts, its confidence, ts less the window's text
    #: offset: where one offset per window would put it), us on the reference clock.
    captions: tuple[tuple[int | None, int, int, float, int], ...] = ()


@dataclass
class Replay:
    truths: dict[str, StreamTruth]
    windows: list[Window] = field(default_factory=list)
    #: merged, late, duplicate (aligner) and dead (pipeline) per input event.
    outcomes: Counter[str] = field(default_factory=Counter)
    events: int = 0
    cpu_s: float = 0.0


def aligner_config(s: Settings | None = None) -> AlignerConfig:
    """The worker's AlignerConfig from settings (``agents/aligner.py`` builds it the same way)."""
    return AlignerConfig.from_settings(s or _settings())


def _settings() -> Settings:
    return Settings(models="light", data_dir=Path(".mmsync"))


def features(streams: list[StreamData], settings: Settings | None = None
             ) -> tuple[list[tuple[float, FeatureRecord]], int]:
    """(arrival s, feature record) in arrival order, and how many events were dead-lettered.

    The light pipeline keeps per-stream state only within a modality (the
    previous frame), so each modality goes through as one batch in arrival order.
    """
    pipe = FeaturePipeline(settings or _settings())
    timed = sorted(((ev.ts - st.truth.start_us) / 1e6, j, i, ev)
                   for j, st in enumerate(streams) for i, ev in enumerate(st.events))
    by_mod: dict[str, list[int]] = {}
    for k, (_, _, _, ev) in enumerate(timed):
        by_mod.setdefault(ev.modality, []).append(k)
    recs: dict[int, FeatureRecord] = {}
    dead = 0
    for mod, idx in by_mod.items():
        msgs = [RawMsg(topic=f"mm.{mod}", partition=0, offset=n, key=timed[k][3].stream_id.encode(),
                       value=encode_event(timed[k][3]), timestamp_ms=0)
                for n, k in enumerate(idx)]
        for k, out in zip(idx, pipe.process(mod, msgs), strict=True):
            if isinstance(out, FeatureRecord):
                recs[k] = out
            else:
                dead += 1
    return [(timed[k][0], recs[k]) for k in sorted(recs)], dead


def _caption_places(aligner: Aligner, sid: str, recs: list[FeatureRecord]
                    ) -> list[tuple[FeatureRecord, int, float]]:
    """Each caption's place as the aligner gives it; an aligner from before issue 25 (the
    "before" figures of docs/benchmarks.md) places it at ts less the text offset."""
    places = getattr(aligner, "caption_places", None)
    if places is not None:
        return list(places(sid, recs))
    off, conf = aligner.offset_us(sid, "text"), aligner.confidence(sid, "text")
    return [(r, r.ts - off, conf) for r in recs if r.modality == "text"]


def replay(streams: list[StreamData], cfg: AlignerConfig | None = None,
           settings: Settings | None = None) -> Replay:
    """Replay ``streams`` together; every emitted window with its offsets and confidence."""
    t_cpu = time.process_time()
    cfg = cfg or aligner_config(settings)
    recs, dead = features(streams, settings)
    out = Replay(truths={st.truth.stream_id: st.truth for st in streams},
                 events=sum(len(st.events) for st in streams))
    out.outcomes["dead"] = dead
    aligner = Aligner(cfg)
    mods = cfg.modalities

    def emit(now: float, sids: list[str] | None) -> None:
        for sid, start, win in aligner.poll(_T0 + now, sids):
            counts = Counter(r.modality for r in win)
            out.windows.append(Window(
                stream_id=sid, start_us=start, end_us=start + cfg.window_us, emitted_s=now,
                offsets_ms={m: aligner.offset_us(sid, m) / 1000.0 for m in mods},
                confidence={m: aligner.confidence(sid, m) for m in mods},
                counts=dict(counts),
                captions=tuple((r.seq, r.ts, ts, conf, r.ts - aligner.offset_us(sid, "text"))
                               for r, ts, conf in _caption_places(aligner, sid, win))))

    tick = recs[0][0] if recs else 0.0
    for arrival, rec in recs:
        while tick <= arrival:
            emit(tick, None)
            tick += TICK_S
        out.outcomes[aligner.add(rec, _T0 + arrival).outcome] += 1
        emit(arrival, [rec.stream_id])
    # the live source stops: the idle timer closes what is left
    end = tick + cfg.idle_s + 2.0
    while aligner.open_records() and tick <= end:
        emit(tick, None)
        tick += TICK_S
    out.cpu_s = time.process_time() - t_cpu
    return out
