"""Offsets a tailing consumer skips while several producers write one partition, with
mmsync's fetch guard (``app/kafka/gapguard.py``) and without it (aiokafka as it is, the
baseline), runs alternating on one fresh broker.

Tansu 0.6.0 can answer a fetch with a batch past the one asked while another producer's
batch is being appended; aiokafka takes that as a hole in the log and moves past it
(docs/broker.md). Each run: ``--producers`` producers send batches of 1 to 8 records to
partition 0 of a fresh topic for ``--seconds`` while one consumer tails it from offset
0; every offset the tail stepped over is in the log (it has no holes of its own).

    .venv/bin/python scripts/bench_fetch_gaps.py                    # Tansu, 3 runs each
    .venv/bin/python scripts/bench_fetch_gaps.py --broker kafka     # Apache Kafka
    .venv/bin/python scripts/bench_fetch_gaps.py --producers 1 --runs 1
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.kafka.clients import wait_for_broker  # noqa: E402
from app.kafka.embedded import EmbeddedBroker  # noqa: E402
from app.kafka.topics import ensure_topics  # noqa: E402
from app.settings import Settings  # noqa: E402
from scripts.benchlib.gaps import TailRun, tail_run  # noqa: E402
from scripts.benchlib.worker import BROKERS, fresh_broker  # noqa: E402


async def _runs(s: Settings, args: argparse.Namespace) -> list[tuple[str, int, TailRun]]:
    await wait_for_broker(s, timeout_s=30)
    out: list[tuple[str, int, TailRun]] = []
    for k in range(args.runs):
        for mode in ("unguarded", "guarded"):  # alternating: the machine's drift hits both
            prefix = f"gaps-{mode}-{k}"
            rs = s.model_copy(update={"topic_prefix": prefix})
            await ensure_topics(rs, ["features"])
            run = await tail_run(rs, rs.topic("features"), producers=args.producers,
                                 seconds=args.seconds, guard=mode == "guarded")
            out.append((mode, k, run))
            print(f"{mode:>9} run {k + 1}: {run.sent:6d} records, skipped "
                  f"{len(run.skipped):3d}, fetched again {run.refetched:3d}, holes taken "
                  f"as real {run.accepted}", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--broker", choices=BROKERS, default="tansu")
    ap.add_argument("--producers", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--runs", type=int, default=3, help="runs of each mode")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mmsync-gaps-") as tmp:
        node = fresh_broker(args.broker, Path(tmp) / "broker.log")
        with node:
            s = Settings(broker=node.url, broker_embedded=isinstance(node, EmbeddedBroker),
                         partitions=1, data_dir=Path(tmp) / "data")
            rows = asyncio.run(_runs(s, args))
    print(f"\n{args.broker}: {args.producers} producers x {args.seconds:g} s to one "
          f"partition, {args.runs} runs of each mode")
    print(f"{'mode':>9} | {'records':>8} | {'skipped per run':>22} | {'share':>9} | "
          f"{'fetched again (median)':>22} | holes taken")
    share: dict[str, float] = {}
    for mode in ("unguarded", "guarded"):
        runs = [r for m, _, r in rows if m == mode]
        sent = sum(r.sent for r in runs)
        skipped = [len(r.skipped) for r in runs]
        share[mode] = sum(skipped) / max(sent, 1)
        print(f"{mode:>9} | {sent:8d} | {', '.join(map(str, skipped)):>22} | "
              f"{share[mode]:9.2e} | {statistics.median(r.refetched for r in runs):22g} | "
              f"{sum(r.accepted for r in runs)}")
    base = share["unguarded"]
    print("skipped, guarded against unguarded: "
          + ("none either way" if base == 0 and share["guarded"] == 0 else
             f"{share['guarded'] / base:.2f}x" if base else "only guarded (!)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
