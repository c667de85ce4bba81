"""Where a window's latency goes: the aligner alone, on the end-to-end benchmark's load.

The load of ``scripts/bench.py`` (``scripts/benchlib/loadgen.py``: streams of 5 fps
frames, 100 ms audio chunks, a caption about every 2 s, 3x bursts) is turned into
feature records by the light pipeline (the aligner's signals; the models add nothing
the watermark reads), then replayed through :class:`app.align.runner.AlignRunner` in
simulated wall time: an input is published at its media time, reaches the aligner
after its modality's processing delay (``--delay-ms``), the aligner ticks every 50 ms
as the agent does, and each feature agent's progress mark (every 500 ms) says whether
its input was processed to its end then. No broker, no models, no noise from the
machine: the figures repeat exactly for a seed, so a change to the watermark shows
in them alone.

Per window: its latency (emission minus each input's publication, as bench.py
measures it end to end) and what held it: for each modality, how far its
watermark mark lay behind the window's end when it closed.

``--policy`` replays the same records under each margin policy in the same run
(``confidence``: the margin ``max_skew x (1 - confidence)`` of the code before issue
26, kept here as the baseline; ``uncertainty``: today's ``Aligner.margin_us``).

    .venv/bin/python scripts/bench_watermark.py                 # 8 streams, 60 s
    .venv/bin/python scripts/bench_watermark.py --streams 3 --seconds 120
"""

from __future__ import annotations

import argparse
import heapq
import math
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.align.aligner import Aligner, AlignerConfig, StreamState  # noqa: E402
from app.align.runner import AlignRunner  # noqa: E402
from app.consumed import RawMsg  # noqa: E402
from app.features.pipeline import FeaturePipeline  # noqa: E402
from app.kafka.clients import default_partition  # noqa: E402
from app.settings import MODALITIES, Settings  # noqa: E402
from schemas.features import FeatureRecord  # noqa: E402
from scripts.benchlib.loadgen import MixSpec, mix  # noqa: E402

_TICK_S = 0.05
_MARK_S = 0.5
_PARTITIONS = 4
#: Media seconds left out at the end (bench.py's ``_EDGE_S``).
_EDGE_S = 3.0


class _WhyAligner(Aligner):
    """Remembers, per stream, which mark bounded its watermark at the last two polls: the
    one before the poll that closes a window is what held that window last."""

    def __init__(self, *a: object, **k: object) -> None:
        super().__init__(*a, **k)  # type: ignore[arg-type]
        self.why: dict[int, tuple[str, str]] = {}

    def marks(self, st: StreamState, now: float) -> dict[str, float] | None:
        marks = super().marks(st, now)
        label = "no-marks" if not marks else min(marks, key=marks.__getitem__)
        self.why[id(st)] = (self.why.get(id(st), ("", ""))[1], label)
        return marks


class _BaselineAligner(_WhyAligner):
    """The margin before issue 26: ``max_skew x (1 - confidence)`` whatever the estimate
    knows."""

    def margin_us(self, st: StreamState, modality: str) -> int:
        if modality == self.cfg.reference or not self.cfg.correct_skew:
            return 0
        return round(self.cfg.max_skew_us * (1.0 - st.skew.confidence(modality)))


@dataclass(frozen=True, slots=True)
class _Input:
    publish_s: float
    arrive_s: float
    modality: str
    partition: int
    value: bytes
    trace_id: str


class _SimMarks:
    """Progress marks as the feature agents send them: at each mark time, a modality's
    input partition is drained if every input published by then was processed by then."""

    def __init__(self, inputs: list[_Input]) -> None:
        #: (modality, partition) -> sorted publish times, and arrival times in that order
        self._by: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}
        groups: dict[tuple[str, int], list[_Input]] = defaultdict(list)
        for it in inputs:
            groups[(it.modality, it.partition)].append(it)
        for key, its in groups.items():
            its.sort(key=lambda i: i.publish_s)
            pub = np.array([i.publish_s for i in its])
            # an agent processes its partition in order: done by the latest arrival so far
            done = np.maximum.accumulate(np.array([i.arrive_s for i in its]))
            self._by[key] = (pub, done)

    def drained(self, modality: str, partition: int, now: float, since: float,
                via: int | None = None) -> bool:
        got = self._by.get((modality, partition))
        if got is None:
            return True
        mark = math.floor(now / _MARK_S) * _MARK_S
        pub, done = got
        k = int(np.searchsorted(pub, mark, side="right"))
        return k == 0 or bool(done[k - 1] <= mark)

    def covered(self, modality: str, partition: int, now: float, via: int | None = None
                ) -> float | None:
        """A mark's end is fetched when the mark is made: it vouches up to the newest."""
        return math.floor(now / _MARK_S) * _MARK_S


def _features(spec: MixSpec, delays_ms: dict[str, float], seed: int) -> list[_Input]:
    items = mix(spec)
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        pipe = FeaturePipeline(Settings(models="light", data_dir=Path(tmp)))
        offsets: dict[tuple[str, int], int] = defaultdict(int)
        out: list[_Input] = []
        for it in items:
            part = default_partition(it.key, _PARTITIONS)  # as a worker's producer
            off = offsets[(it.modality, part)]
            offsets[(it.modality, part)] += 1
            pub = it.t
            msg = RawMsg(topic=f"mm.{it.modality}", partition=part, offset=off, key=it.key,
                         value=it.value, timestamp_ms=round(pub * 1000))
            rec = pipe.process(it.modality, [msg])[0]
            assert isinstance(rec, FeatureRecord)
            # processing delay: the modality's figure, +-50% (batches, the image thread)
            d = delays_ms[it.modality] / 1000 * float(rng.uniform(0.5, 1.5))
            out.append(_Input(pub, pub + d, it.modality, part, rec.encode(), it.trace_id))
    return out


def _per_modality() -> dict[str, list[float]]:
    return defaultdict(list)


@dataclass
class _Result:
    #: each input's latency (emission minus publication), s
    lat: list[float] = field(default_factory=list)
    late: int = 0
    merged: int = 0
    #: emission minus window end (media s = simulated wall s), s
    close: list[float] = field(default_factory=list)
    # per modality, when a window closed: how far its mark lay behind the window end, its
    # margin, offset, confidence and uncertainty (s)
    held: dict[str, list[float]] = field(default_factory=_per_modality)
    margin: dict[str, list[float]] = field(default_factory=_per_modality)
    offset: dict[str, list[float]] = field(default_factory=_per_modality)
    conf: dict[str, list[float]] = field(default_factory=_per_modality)
    unc: dict[str, list[float]] = field(default_factory=_per_modality)
    #: what held each window last (``Aligner.marks``' name) -> its close (s after its end)
    why: dict[str, list[float]] = field(default_factory=_per_modality)


def _replay(inputs: list[_Input], policy: str, cfg: AlignerConfig, skip_s: float) -> _Result:
    marks = _SimMarks(inputs)
    runner = AlignRunner(cfg, "mm.features", clock=lambda: now)
    aligner = _BaselineAligner(cfg, marks) if policy == "confidence" else _WhyAligner(cfg, marks)
    runner.aligner = aligner
    published = {it.trace_id: it.publish_s for it in inputs}
    # as bench.py: the streams' last seconds close when their sources go idle, left out
    last_s = max(published.values()) - _EDGE_S
    res = _Result()
    queue = [(it.arrive_s, i) for i, it in enumerate(inputs)]
    heapq.heapify(queue)
    end = max(it.arrive_s for it in inputs) + 10.0
    now = 0.0
    next_tick = 0.0
    offset = 0

    def take(step: object) -> None:
        for win in step.windows:  # type: ignore[attr-defined]
            for tid in win.trace_ids:
                if skip_s <= published[tid] < last_s:
                    res.lat.append(now - published[tid])
            res.merged += len(win.trace_ids)
            res.close.append(now - win.window_end / 1e6)
            st = aligner.streams.get(win.stream_id)
            if st is None:
                continue
            res.why[aligner.why.get(id(st), ("?", "?"))[0] or "?"].append(
                now - win.window_end / 1e6)
            for m in cfg.modalities:
                if m in st.newest:
                    mark = (st.newest[m] - aligner.offset_us_of(st, m) - aligner.margin_us(st, m)
                            - cfg.lateness_us)
                    res.held[m].append((win.window_end - mark) / 1e6)
                    res.margin[m].append(aligner.margin_us(st, m) / 1e6)
                    res.offset[m].append(aligner.offset_us_of(st, m) / 1e6)
                    res.conf[m].append(aligner.confidence_of(st, m))
                    res.unc[m].append(st.skew.uncertainty_us(m) / 1e6 if m != "image" else 0.0)
        res.late += len(step.late)  # type: ignore[attr-defined]

    while now < end:
        if queue and queue[0][0] <= next_tick:
            t, i = heapq.heappop(queue)
            now = t
            it = inputs[i]
            take(runner.on_record(0, offset, None, it.value, now, round(it.publish_s * 1000)))
            offset += 1
        else:
            now = next_tick
            take(runner.on_tick(now))
            next_tick += _TICK_S
    return res


def _row(name: str, r: _Result, base: _Result | None) -> str:
    lat = np.array(r.lat)
    mean, p50, p99 = float(lat.mean()), *np.percentile(lat, [50, 99])
    ratio = ""
    if base is not None:
        b = np.array(base.lat)
        ratio = f"  mean {mean / b.mean():.2f}x  p99 {p99 / np.percentile(b, 99):.2f}x"
    return (f"{name:<12} merged {r.merged:>6} late {r.late:>4} | window latency mean {mean:5.2f}"
            f" p50 {p50:5.2f} p99 {p99:5.2f} s{ratio}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--delay-ms", default="image=60,audio=20,text=20",
                    help="each modality's mean processing delay, ms (uniform +-50%%)")
    ap.add_argument("--skip-s", type=float, default=10.0,
                    help="inputs published in the first seconds are left out (stream start)")
    ap.add_argument("--policy", default="confidence,uncertainty")
    args = ap.parse_args()
    delays = {k: float(v) for k, v in (kv.split("=") for kv in args.delay_ms.split(","))}
    spec = MixSpec(streams=args.streams, seconds=args.seconds, seed=args.seed, start_us=0)
    inputs = _features(spec, delays, args.seed)
    cfg = AlignerConfig.from_settings(Settings())
    print(f"{args.streams} streams x {args.seconds:g} s of bench.py's load, {len(inputs)} inputs;"
          f" processing delays {delays} ms; window {cfg.window_us / 1e6:g} s, lateness "
          f"{cfg.lateness_us / 1e6:g} s, max skew {cfg.max_skew_us / 1e6:g} s")
    results: dict[str, _Result] = {}
    for policy in (p.strip() for p in args.policy.split(",")):
        results[policy] = _replay(inputs, policy, cfg, args.skip_s)
    base = results.get("confidence")
    for policy, r in results.items():
        print(_row(policy, r, base if policy != "confidence" else None))
        held = "  ".join(
            f"{m} p50 {np.percentile(v, 50):+.2f} p90 {np.percentile(v, 90):+.2f}"
            for m in MODALITIES if (v := r.held.get(m)))
        print(f"{'':<12} mark behind the window end at its close, s: {held}")
        c = np.array(r.close)
        p10, p50, p90, p99 = np.percentile(c, [10, 50, 90, 99])
        print(f"{'':<12} window closed after its end, s: p10 {p10:.2f} p50 {p50:.2f} "
              f"p90 {p90:.2f} p99 {p99:.2f}")
        margin = "  ".join(
            f"{m} p50 {np.percentile(v, 50):.2f} p90 {np.percentile(v, 90):.2f}"
            for m in MODALITIES if (v := r.margin.get(m)))
        print(f"{'':<12} margin at a window's close, s: {margin}")
        offset = "  ".join(
            f"{m} p10 {np.percentile(v, 10):+.2f} p50 {np.percentile(v, 50):+.2f} p90 "
            f"{np.percentile(v, 90):+.2f}" for m in MODALITIES if (v := r.offset.get(m)))
        print(f"{'':<12} offset at a window's close, s: {offset}")
        for name, d in (("confidence", r.conf), ("uncertainty s", r.unc)):
            txt = "  ".join(
                f"{m} p10 {np.percentile(v, 10):.2f} p50 {np.percentile(v, 50):.2f} p90 "
                f"{np.percentile(v, 90):.2f}" for m in MODALITIES if (v := d.get(m)))
            print(f"{'':<12} {name} at a window's close: {txt}")
        n = sum(len(v) for v in r.why.values())
        print(f"{'':<12} what held a window last (share of windows; its close after its end, s):")
        for why, v in sorted(r.why.items(), key=lambda kv: -len(kv[1])):
            print(f"{'':<14} {why:<16} {len(v) / n:4.0%}  p50 {np.percentile(v, 50):5.2f}  "
                  f"p90 {np.percentile(v, 90):5.2f}  p99 {np.percentile(v, 99):5.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
