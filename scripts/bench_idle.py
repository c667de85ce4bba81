"""Idle CPU of one worker and its embedded broker per fetch wait (issue 26).

Tansu answers an empty fetch only after half the consumer's wait
(docs/broker.md, fault 2), so ``MMSYNC_EMBEDDED_FETCH_WAIT_MS`` bounds how long a
new record can sit in the broker unseen: a shorter wait brings captions' alerts
sooner and costs more empty fetches while nothing comes. This measures that
cost: for each wait, a fresh Tansu, the topics, one worker (light models: the
consumers are the same as with the full ones) that had ``--settle-s`` to join its
group, then the worker's and the broker's CPU (utime + stime from /proc) over
``--seconds`` of no input at all.

    .venv/bin/python scripts/bench_idle.py                      # 100, 50, 20, 10 ms
    .venv/bin/python scripts/bench_idle.py --waits 100,20 --seconds 60
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.kafka.clients import wait_for_broker  # noqa: E402
from app.kafka.embedded import EmbeddedBroker  # noqa: E402
from app.kafka.topics import ensure_topics  # noqa: E402
from app.runtime.process import spawn_worker, stop_process, worker_env  # noqa: E402
from app.settings import Settings  # noqa: E402

#: clock ticks per second of /proc/PID/stat's utime and stime
_HZ = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """utime + stime of ``pid``, s (its reaped children's too: none here)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / _HZ


def _one(wait_ms: int, seconds: float, settle_s: float) -> tuple[float, float]:
    """(worker cores, broker cores) at idle with this fetch wait."""
    with tempfile.TemporaryDirectory(prefix="mmsync-idle-") as tmp_s:
        tmp = Path(tmp_s)
        with EmbeddedBroker(log_path=tmp / "broker.log") as node:
            s = Settings(broker=node.url, broker_embedded=True, topic_prefix="idle",
                         partitions=8, data_dir=tmp / "data", models="light",
                         embedded_fetch_wait_ms=wait_ms)
            asyncio.run(wait_for_broker(s, timeout_s=20))
            asyncio.run(ensure_topics(s))
            proc = spawn_worker(worker_env(s), tmp / "worker.log")
            try:
                time.sleep(settle_s)  # the worker joins its group (7 to 10 s: docs/broker.md)
                assert node.pid is not None
                w0, b0, t0 = _cpu_s(proc.pid), _cpu_s(node.pid), time.monotonic()
                time.sleep(seconds)
                w1, b1, t1 = _cpu_s(proc.pid), _cpu_s(node.pid), time.monotonic()
            finally:
                stop_process(proc)
    return (w1 - w0) / (t1 - t0), (b1 - b0) / (t1 - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--waits", default="100,50,20,10", help="fetch waits to try, ms")
    ap.add_argument("--seconds", type=float, default=30.0, help="idle time measured per wait")
    ap.add_argument("--settle-s", type=float, default=15.0,
                    help="time a fresh worker gets before the measurement, s")
    args = ap.parse_args()
    print(f"{'fetch wait ms':>14}{'worker cores':>14}{'broker cores':>14}{'total':>8}")
    for wait in (int(w) for w in args.waits.split(",") if w.strip()):
        worker, broker = _one(wait, args.seconds, args.settle_s)
        print(f"{wait:>14}{worker:>14.3f}{broker:>14.3f}{worker + broker:>8.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
