"""``scripts/bench_align.py --corpus``: the offline corpus run and its table."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from scripts.benchlib.corpus.cases import SETS, select
from scripts.benchlib.corpus.replay import aligner_config
from scripts.benchlib.corpus.run import CaseResult, case_line, print_report, run_cases
from scripts.benchlib.worker import BROKERS

__all__ = ["add_args", "corpus_main"]


def add_args(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("corpus (offline: FeaturePipeline(light) and the pure Aligner)")
    g.add_argument("--corpus", action="store_true", help="replay the evaluation corpus offline")
    g.add_argument("--set", choices=SETS, default="tune",
                   help="tune (default), heldout or all; every figure says which")
    g.add_argument("--kind", help="only cases of this kind (talking, music, panning, static, clip)")
    g.add_argument("--case", action="append", help="only this case (repeatable)")
    g.add_argument("--plots", type=Path, help="write one PNG per kind into this directory")
    g.add_argument("--cases", action="store_true", help="also print one line per case")
    g.add_argument("--no-oracle", action="store_true", help="skip the oracle (faster)")
    g.add_argument("--live-clips", action="store_true",
                   help="the set's real clips (those replayed as they are) through `mmsync "
                        "produce --video --realtime` and a real worker, scored the same way")
    g.add_argument("--broker", choices=BROKERS, default="tansu",
                   help="the live runs' broker (without --corpus, or with --live-clips): the "
                        "embedded one (default) or a local Apache Kafka node as "
                        "production configures it (`make kafka` once; KAFKA_VERSION)")
    g.add_argument("--max-skew-ms", type=int,
                   help="the aligner's max skew (default: the settings', MMSYNC_MAX_SKEW_MS)")


def corpus_main(args: argparse.Namespace) -> int:
    cases = select(args.set, args.kind, args.case)
    if not cases:
        print(f"no case in set {args.set!r} with kind {args.kind!r} and names {args.case!r}")
        return 2
    cfg = aligner_config()
    if args.max_skew_ms is not None:
        cfg = dataclasses.replace(cfg, max_skew_us=args.max_skew_ms * 1000)

    def progress(r: CaseResult) -> None:
        if args.cases:
            print(case_line(r), flush=True)

    if args.live_clips:
        from scripts.benchlib.corpus.live import live_clips

        clips = [c for c in cases if c.kind == "clip" and not c.params.get("add_audio_ms")
                 and not c.params.get("add_text_ms")]
        print(f"publishing {len(clips)} clips at {args.speed:g}x real time: "
              f"{', '.join(c.name for c in clips)}", flush=True)
        results, sync = live_clips(clips, args.speed, args.broker)
        for r in results if args.cases else ():
            print(case_line(r))
        print_report(results, f"{args.set}, live through mmsync produce --video --realtime on "
                     f"{args.broker}", cfg)
        sync.sort()
        if sync:
            print(f"sync latency ms: p50 {sync[len(sync) // 2]:.1f}  "
                  f"p99 {sync[min(len(sync) - 1, int(len(sync) * 0.99))]:.1f}  "
                  f"max {sync[-1]:.1f} over {len(sync)} windows")
    else:
        results = run_cases(cases, cfg, with_oracle=not args.no_oracle, on_case=progress)
        print_report(results, args.set, cfg)
    if args.plots:
        from scripts.benchlib.corpus.plots import plot_kinds  # matplotlib: a dev dependency

        for path in plot_kinds(results, args.plots, args.set):
            print(f"wrote {path}")
    return 0
