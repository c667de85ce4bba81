"""Skew-correction accuracy and sync latency, through a real worker on a broker of its own.

Streams whose content co-occurs across modalities (scene cuts, voiced bursts,
captions) get audio skews from -500 to +500 ms with drift, text skews,
timestamp jitter and dropouts; they are published at a real-time pace (times
``--speed``) to a worker, and every aligned window's ``offsets_ms`` is
compared with the injected truth at that window's time. The baseline in the
same run is no correction at all (offset 0), whose error is the skew itself.

    .venv/bin/python scripts/bench_align.py            # 8 streams x 40 s
    .venv/bin/python scripts/bench_align.py --quick    # 4 streams x 20 s
    .venv/bin/python scripts/bench_align.py --broker kafka   # on Apache Kafka (make kafka once)

The evaluation corpus (issue 14), offline through FeaturePipeline(light) and the
pure Aligner on a simulated clock, scored per kind against each case's truth:

    .venv/bin/python scripts/bench_align.py --corpus                 # the tune set
    .venv/bin/python scripts/bench_align.py --corpus --set heldout --kind talking
    .venv/bin/python scripts/bench_align.py --corpus --set all --plots docs/img/
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.clients.collect import Outputs, collect  # noqa: E402
from app.clients.synth import SynthSpec, synth_records  # noqa: E402
from app.kafka.clients import make_producer  # noqa: E402
from app.settings import Settings  # noqa: E402
from schemas.codec import decode_map  # noqa: E402
from scripts.benchlib.corpus.cli import add_args, corpus_main  # noqa: E402
from scripts.benchlib.worker import light_worker  # noqa: E402


def _specs(n: int, seconds: float) -> list[SynthSpec]:
    skews = np.linspace(-500_000, 500_000, n).astype(int)
    return [SynthSpec(stream_id=f"bench-{i}", seconds=seconds, fps=25, audio_chunk_ms=100,
                      audio_skew_us=int(sk), audio_drift_us_per_min=20_000,
                      text_skew_us=int(-sk // 2), jitter_us=20_000, dropout=0.02, seed=11 + i)
            for i, sk in enumerate(skews)]


async def _publish_paced(s: Settings, specs: list[SynthSpec], speed: float) -> int:
    """Publish in media-time order, sleeping so media advances ``speed`` x wall time."""
    by_id = {sp.stream_id: sp for sp in specs}
    producer = make_producer(s)
    await producer.start()
    n, t0 = 0, time.monotonic()
    try:
        for modality, key, value in synth_records(specs):
            ts = decode_map(value)["ts"] - by_id[key.decode()].start_us
            ahead = ts / 1e6 / speed - (time.monotonic() - t0)
            if ahead > 0.005:
                await producer.flush()
                await asyncio.sleep(ahead)
            await producer.send(s.topic(modality), value=value, key=key)
            n += 1
        await producer.flush()
    finally:
        await producer.stop()
    return n


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--speed", type=float, default=1.0, help="media seconds per wall second")
    ap.add_argument("--warmup", type=float, default=10.0,
                    help="media seconds before errors count (the estimate's context fills)")
    ap.add_argument("--quick", action="store_true")
    add_args(ap)
    args = ap.parse_args()
    if args.corpus:
        return corpus_main(args)
    if args.quick:
        args.streams, args.seconds = 4, 20.0
    specs = _specs(args.streams, args.seconds)
    truth = {sp.stream_id: sp for sp in specs}
    with light_worker("bench", broker=args.broker) as s:
        sent = asyncio.run(_publish_paced(s, specs, args.speed))

        def done(o: Outputs) -> bool:
            return o.accounted >= sent
        out = asyncio.run(collect(s, until=done, timeout_s=120))

    err: dict[str, list[float]] = {"audio": [], "text": []}
    base: dict[str, list[float]] = {"audio": [], "text": []}
    sync_ms = [w["stages"]["sync"] * 1000 for w in out.windows if "sync" in w.get("stages", {})]
    for w in out.windows:
        sp = truth[w["stream_id"]]
        t = (w["window_start"] - sp.start_us) / 1e6
        if t < args.warmup:
            continue
        true_ms = {"audio": (sp.audio_skew_us + sp.audio_drift_us_per_min * t / 60) / 1000,
                   "text": sp.text_skew_us / 1000}
        for m in err:
            err[m].append(abs(w["offsets_ms"][m] - true_ms[m]))
            base[m].append(abs(true_ms[m]))
    late = Counter(str(x.get("modality")) for x in out.late)
    print(f"{len(specs)} streams x {args.seconds:.0f} s at 25 fps, audio skew -500..+500 ms, "
          f"drift 20 ms/min, text skew -skew/2, jitter +-20 ms, dropout 2%; "
          f"{sent} events, {len(out.windows)} windows, accounted {out.accounted}/{sent}, "
          f"late {len(out.late)}"
          + (f" ({', '.join(f'{m} {n}' for m, n in sorted(late.items()))})" if late else ""))
    print(f"\n|offset error| ms over windows after {args.warmup:.0f} s of media")
    print(f"{'modality':10}{'windows':>9}{'median':>9}{'p95':>9}{'max':>9}"
          f"{'base med':>10}{'base p95':>10}{'med ratio':>11}")
    for m in err:
        e, b = err[m], base[m]
        ratio = statistics.median(b) / max(statistics.median(e), 1e-9) if e else float("nan")
        print(f"{m:10}{len(e):>9}{_pct(e, 50):>9.1f}{_pct(e, 95):>9.1f}{max(e, default=0):>9.1f}"
              f"{_pct(b, 50):>10.1f}{_pct(b, 95):>10.1f}{ratio:>10.1f}x")
    print(f"\nsync latency (closing record's arrival to the window's send), ms: "
          f"p50 {_pct(sync_ms, 50):.2f}  p99 {_pct(sync_ms, 99):.2f}  "
          f"max {max(sync_ms, default=0):.2f}  over {len(sync_ms)} windows")
    ok = out.accounted == sent
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
