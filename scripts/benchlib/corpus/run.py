"""Run cases offline (build, replay, oracle, score) and print the corpus table."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.align.aligner import AlignerConfig
from scripts.benchlib.corpus.build import build
from scripts.benchlib.corpus.cases import Case
from scripts.benchlib.corpus.oracle import oracle
from scripts.benchlib.corpus.replay import Replay, replay
from scripts.benchlib.corpus.score import (
    CAPTION_GOALS,
    GOALS,
    QUIET_GRACE_S,
    WARMUP_S,
    CapScore,
    Scored,
    format_caption_table,
    format_table,
    score_captions,
    score_windows,
)

__all__ = ["CaseResult", "print_report", "run_case", "run_cases"]


@dataclass
class CaseResult:
    case: Case
    replay: Replay
    scored: list[Scored]
    #: every caption merged, scored on its own (issue 25)
    captions: list[CapScore]
    #: stream_id -> modality -> the oracle's lag, ms
    oracle: dict[str, dict[str, float | None]]
    wall_s: float


def run_case(case: Case, cfg: AlignerConfig | None = None, *, with_oracle: bool = True
             ) -> CaseResult:
    t0 = time.perf_counter()
    streams = build(case)
    rep = replay(streams, cfg)
    lags: dict[str, dict[str, float | None]] = {}
    scored: list[Scored] = []
    caps: list[CapScore] = []
    for st in streams:
        tr = st.truth
        if with_oracle:
            style = tr.offsets["text"].style if "text" in tr.offsets else None
            lags[tr.stream_id] = oracle(st.events, tr.start_us, tr.seconds, text_style=style)
        wins = [(w.start_us, w.end_us, w.offsets_ms, w.confidence)
                for w in rep.windows if w.stream_id == tr.stream_id]
        scored += score_windows(case, tr, wins, lags.get(tr.stream_id))
        caps += score_captions(case, tr, (c for w in rep.windows if w.stream_id == tr.stream_id
                                          for c in w.captions))
    return CaseResult(case, rep, scored, caps, lags, time.perf_counter() - t0)


def run_cases(cases: Sequence[Case], cfg: AlignerConfig | None = None, *,
              with_oracle: bool = True, on_case: Callable[[CaseResult], None] | None = None
              ) -> list[CaseResult]:
    out = []
    for case in cases:
        r = run_case(case, cfg, with_oracle=with_oracle)
        out.append(r)
        if on_case is not None:
            on_case(r)
    return out


def case_line(r: CaseResult) -> str:
    """One line per case: its set, per-stream true offsets, oracle and median |error| after 10 s."""
    parts = [f"{r.case.name:24}{r.case.set:8}"]
    for s in r.scored:
        errs = sorted(w.err for w in s.wins if w.informative and w.t_s >= WARMUP_S)
        med = errs[len(errs) // 2] if errs else float("nan")
        tr = r.replay.truths[s.stream_id]
        true = tr.offsets[s.modality].mean(0.0, tr.seconds)
        lag = r.oracle.get(s.stream_id, {}).get(s.modality)
        parts.append(f"{s.label}: true {true:+.0f} oracle "
                     f"{'-' if lag is None else format(lag, '+.0f')} med err {med:.0f}")
    o = r.replay.outcomes
    parts.append(f"late {o['late']} dead {o['dead']} ({r.wall_s:.1f} s)")
    return "  ".join(parts)


def print_report(results: Sequence[CaseResult], which: str, cfg: AlignerConfig,
                 out: Callable[[str], None] = print) -> None:
    cases = [r.case for r in results]
    sets = sorted({c.set for c in cases})
    n_streams = sum(len(r.replay.truths) for r in results)
    out(f"set: {which} ({len(cases)} cases, {n_streams} streams; sets in it: {', '.join(sets)})")
    out(f"aligner: window {cfg.window_us // 1000} ms, {cfg.rate_hz:g} Hz, max skew "
        f"{cfg.max_skew_us // 1000} ms (captions {cfg.max_text_skew_us // 1000} ms), skew segment "
        f"{cfg.skew_segment_us // 1000} ms, "
        f"correction {'on' if cfg.correct_skew else 'off'}")
    out(f"|offset error| ms over windows wholly in informative stretches after {WARMUP_S:.0f} s "
        f"of media; c>=.5: share of those windows with confidence >= 0.5, c-p95: their p95; "
        f"base: no correction (median); orc/orcmx: oracle |error| median/max per stream; "
        f"first/worst: first good estimate (3 windows <= 50 ms in a row), media s, median/worst "
        f"stream; q-conf/q-move: non-informative stretches, highest confidence from "
        f"{QUIET_GRACE_S:.0f} s in, largest move of the offset from the last one before, ms")
    # with both sets in the run, each gets its own table before the two together
    parts = [(x, [r for r in results if r.case.set == x]) for x in sets] if len(sets) > 1 else []
    for name, rs in [*parts, (which if len(sets) > 1 else sets[0], list(results))]:
        out(f"-- set {name}: {len(rs)} cases")
        for line in format_table([s for r in rs for s in r.scored]):
            out(line)
        out(f"-- set {name}: per caption, |aligned_ts - the start of its speech| ms; c>=.5: "
            f"share at conf >= 0.5, c-p95 their p95; 1-off: ts less the window's text offset "
            f"(one offset per window, as before issue 25)")
        for line in format_caption_table([c for r in rs for c in r.captions]):
            out(line)
    out(GOALS)
    out(CAPTION_GOALS)
    lost = sum(r.replay.outcomes["late"] + r.replay.outcomes["dead"] for r in results)
    total = sum(r.replay.events for r in results)
    cpu = sum(r.replay.cpu_s for r in results)
    out(f"{total} events, {lost} late or dead-lettered"
        + (f"; replay cpu {cpu:.1f} s" if cpu else ""))
