"""Feature extraction throughput per modality: raw model vs the pipeline, batched or not.

Prints, per modality: raw model items/s (session.run on pre-decoded tensors,
batch 1 and 8), items/s through FeaturePipeline.process with batches of 8 and
of 1, and the batched/unbatched ratio. Inputs: 640x360 JPEG charts, 100 ms
chunks of 48 kHz stereo audio, zh/en caption sentences (all distinct, so no
memo or duplicate reuse flatters the numbers).

A second table puts FP32 and INT8 side by side for the image models, in one run
(``MMSYNC_PRECISION=fp32`` and ``int8``, the CPU files the worker builds; the
source graph as shipped too): raw frames/s per model and for both, as the worker
runs them (``ImageExtractor.embed_nsfw``: the two at once), and the pipeline's
frames/s in batches of 8, each measured in alternating rounds (medians).

A third table runs the pipeline on a repeated-content trace (a pool of
distinct inputs drawn with a Zipf(1.0) skew, spread over 8 streams so the
per-stream near-duplicate test does not catch them) with the feature cache
and without it, and prints items/s, the hit ratio and the ratio.

    .venv/bin/python scripts/bench_extract.py [--quick] [--device cpu|auto|cuda]
        [--precision auto|fp32|int8|fp16] [--threads N]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import simplejpeg
from PIL import Image, ImageDraw

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.cache.features import FeatureMemo, open_worker_cache  # noqa: E402
from app.consumed import RawMsg  # noqa: E402
from app.features.image import effnet_input, nsfw_input  # noqa: E402
from app.features.pipeline import FeaturePipeline  # noqa: E402
from app.runtime.metrics import Metrics  # noqa: E402
from app.settings import Settings  # noqa: E402
from schemas.events import AudioChunk, FrameEvent, TextEvent, encode_event  # noqa: E402

_ZH = ["今天的新闻发布会介绍了新产品", "警方提醒市民注意电话诈骗", "我们明天早上八点出发去机场",
       "这部电影的音乐非常好听", "天气预报说下午会有大雨"]
_EN = ["The quarterly results beat expectations", "Please keep your tickets ready",
       "A new bridge opens downtown next week", "The match ended in a draw after extra time",
       "Scientists found water on a distant moon"]


def _chart(i: int) -> np.ndarray:
    rng = np.random.default_rng(i)
    img = Image.new("RGB", (640, 360), tuple(int(c) for c in rng.integers(150, 255, 3)))
    d = ImageDraw.Draw(img)
    for k in range(10):
        h = int(rng.integers(20, 320))
        d.rectangle([20 + k * 60, 350 - h, 60 + k * 60, 350],
                    fill=tuple(int(c) for c in rng.integers(0, 255, 3)))
    return np.asarray(img)


def _events(modality: str, n: int) -> list:
    if modality == "image":
        return [FrameEvent(stream_id="b", ts=i * 40_000,
                           data=simplejpeg.encode_jpeg(_chart(i), quality=85), fmt="jpeg")
                for i in range(n)]
    if modality == "audio":
        rng = np.random.default_rng(0)
        sr, out = 48000, []
        for i in range(n):
            t = (np.arange(sr // 10) + i * sr // 10) / sr
            x = 0.3 * np.sin(2 * np.pi * 220 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t))
            x = x + 0.01 * rng.standard_normal(len(t))
            pcm = (np.repeat(x[:, None], 2, axis=1) * 32767).astype("<i2")
            out.append(AudioChunk(stream_id="b", ts=i * 100_000, data=pcm.tobytes(), sr=sr, ch=2))
        return out
    texts = [f"{s} {i}" for i in range(n) for s in (_ZH + _EN)][:n]
    return [TextEvent(stream_id="b", ts=i * 1_000_000, text=t) for i, t in enumerate(texts)]


def _rate(fn, items: int, repeat: int) -> float:
    fn()  # warm
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    return items * repeat / (time.perf_counter() - t0)


def _raw_rates(p: FeaturePipeline, modality: str, repeat: int) -> tuple[float, float]:
    ex = p.extractor(modality)
    if modality == "image":
        rgbs = [np.asarray(Image.fromarray(_chart(i)).resize((256, 256))) for i in range(8)]
        e1, e8 = effnet_input(rgbs[:1]), effnet_input(rgbs)
        n1, n8 = nsfw_input(rgbs[:1]), nsfw_input(rgbs)

        def one() -> None:
            ex.effnet.sess.run(None, {ex.effnet.input_name: e1})
            ex.nsfw.sess.run(None, {ex.nsfw.input_name: n1})

        def eight() -> None:
            ex.effnet.sess.run(None, {ex.effnet.input_name: e8})
            ex.nsfw.sess.run(None, {ex.nsfw.input_name: n8})

        return _rate(one, 1, repeat * 4), _rate(eight, 8, repeat)
    if modality == "audio":
        # 100 ms at 16 kHz = 3.1 windows of 512; batch 8 = 25 windows in one call.
        def vad(frames: int):
            x = np.zeros((frames, 576), np.float32)
            x[:, 64:] = np.random.default_rng(0).standard_normal((frames, 512)) * 0.1
            h = np.zeros((1, 1, 128), np.float32)
            return lambda: ex._vad.run(None, {"input": x, "h": h, "c": h})

        return _rate(vad(3), 1, repeat * 4), _rate(vad(25), 8, repeat)
    texts = [f"{s} x" for s in (_ZH + _EN)][:8]
    return (_rate(lambda: ex._e5.passage(texts[:1]), 1, repeat * 4),
            _rate(lambda: ex._e5.passage(texts), 8, repeat))


def _concurrency_ab(p: FeaturePipeline, reps: int) -> tuple[float, float]:
    """Frames/s of the two image models one after the other vs at once (embed_nsfw),
    batch 8, alternating so both see the same machine; medians."""
    im = p.extractor("image")
    rgbs = [np.asarray(Image.fromarray(_chart(i)).resize((256, 256))) for i in range(8)]

    def serial() -> None:
        im.effnet.run(effnet_input(rgbs))
        im.nsfw.run(nsfw_input(rgbs))

    res: dict[str, list[float]] = {"serial": [], "concurrent": []}
    for _ in range(reps):
        for name, fn in (("serial", serial), ("concurrent", lambda: im.embed_nsfw(rgbs))):
            t0 = time.perf_counter()
            fn()
            fn()
            res[name].append(16 / (time.perf_counter() - t0))
    return float(np.median(res["serial"])), float(np.median(res["concurrent"]))


def _precision_ab(s: Settings, n: int, rounds: int) -> None:
    """FP32 against INT8 (and the shipped graph) for the image models: raw and pipeline."""
    from app.features.image import ImageExtractor, nsfw_model_path
    from app.features.onnx import ModelRuntime

    rgbs = [np.asarray(Image.fromarray(_chart(i)).resize((256, 256))) for i in range(8)]
    xe, xn = effnet_input(rgbs), nsfw_input(rgbs)
    ex = {}
    for prec in ("fp32", "int8"):
        e = ImageExtractor(ModelRuntime("cpu", models_dir=s.models_path, threads=s.model_threads,
                                        precision=prec))
        e.load()
        ex[prec] = e
    rt = ModelRuntime("cpu", models_dir=s.models_path, threads=s.model_threads)
    shipped = rt.cpu_session(nsfw_model_path())
    eff_src = rt.cpu_session(s.models_path / "efficientnet_lite0_emb.onnx")
    pipes = {prec: FeaturePipeline(s.model_copy(update={"precision": prec})) for prec in ex}
    evs = _events("image", n + 8)
    msgs = [RawMsg("t", 0, i, b"b", encode_event(e), 0) for i, e in enumerate(evs)]
    for p in pipes.values():
        p.warm("image")
        p.process("image", msgs[:8])
    for e in ex.values():  # let embed_nsfw learn the two models' cost ratio (EWMA)
        for _ in range(5):
            e.embed_nsfw(rgbs)

    def timed(fn, items: int) -> float:
        t0 = time.perf_counter()
        fn()
        return items / (time.perf_counter() - t0)

    def pipe(p: FeaturePipeline) -> None:
        for i in range(8, len(msgs), 8):
            p.process("image", msgs[i:i + 8])

    rows: dict[str, dict[str, list[float]]] = {}
    for _ in range(rounds):
        for prec, e in ex.items():
            eff, nsf = e.effnet, e.nsfw
            r = rows.setdefault(prec, {})
            r.setdefault("EfficientNet-Lite0", []).append(
                timed(lambda eff=eff: eff.run(xe), 8))
            r.setdefault("Open-NSFW", []).append(timed(lambda nsf=nsf: nsf.run(xn), 8))
            r.setdefault("both, one after the other", []).append(
                timed(lambda eff=eff, nsf=nsf: (eff.run(xe), nsf.run(xn)), 8))
            r.setdefault("+ preprocessing, in turn", []).append(timed(
                lambda eff=eff, nsf=nsf: (eff.run(effnet_input(rgbs)), nsf.run(nsfw_input(rgbs))),
                8))
            r.setdefault("+ preprocessing, at once", []).append(
                timed(lambda e=e: e.embed_nsfw(rgbs), 8))
            r.setdefault("pipeline, batches of 8", []).append(
                timed(lambda p=pipes[prec]: pipe(p), len(msgs) - 8))
        src = rows.setdefault("shipped", {})
        src.setdefault("EfficientNet-Lite0", []).append(
            timed(lambda: eff_src.run(None, {"image": xe}), 8))
        src.setdefault("Open-NSFW", []).append(
            timed(lambda: shipped.run(None, {shipped.get_inputs()[0].name: xn}), 8))
        src.setdefault("both, one after the other", []).append(timed(lambda: (
            eff_src.run(None, {"image": xe}),
            shipped.run(None, {shipped.get_inputs()[0].name: xn})), 8))
    med = {k: {m: float(np.median(v)) for m, v in r.items()} for k, r in rows.items()}
    print(f"\nimage models, frames/s, FP32 vs INT8 (CPU, {ex['int8'].nsfw.sess.get_providers()[0]},"
          f" {rounds} alternating rounds, medians; batch 8)")
    print(f"{'':28} {'shipped':>8} {'fp32':>8} {'int8':>8} {'int8/fp32':>10}")
    for m in med["fp32"]:
        sh = med["shipped"].get(m)
        print(f"{m:28} {sh if sh is not None else float('nan'):>8.1f} {med['fp32'][m]:>8.1f} "
              f"{med['int8'][m]:>8.1f} {med['int8'][m] / med['fp32'][m]:>10.2f}")
    print("(tensors in, except: + preprocessing = effnet_input and nsfw_input too, the two\n"
          " models in turn or at once as ImageExtractor.embed_nsfw runs them; pipeline =\n"
          " FeaturePipeline.process on 640x360 JPEGs. shipped: the packaged source graphs)")
    for prec, e in ex.items():
        print(f"{prec}: {e.version}")


def _pipeline_rate(s: Settings, modality: str, n: int, batch: int) -> float:
    p = FeaturePipeline(s)
    p.warm(modality)
    evs = _events(modality, n + 8)
    msgs = [RawMsg("t", 0, i, b"b", encode_event(e), 0) for i, e in enumerate(evs)]
    p.process(modality, msgs[:8])  # warm
    rest = msgs[8:]
    t0 = time.perf_counter()
    for i in range(0, len(rest), batch):
        p.process(modality, rest[i:i + batch])
    return len(rest) / (time.perf_counter() - t0)


def _zipf_trace(modality: str, pool: int, n: int, seed: int = 7) -> list[RawMsg]:
    """``n`` records drawn from ``pool`` distinct inputs with P(rank k) ~ 1/k."""
    base = _events(modality, pool)
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, pool + 1)
    picks = rng.choice(pool, size=n, p=w / w.sum())
    msgs = []
    for i, k in enumerate(picks):
        ev = base[int(k)]
        ev = dataclasses.replace(ev, stream_id=f"z{i % 8}", ts=i * 100_000)
        msgs.append(RawMsg("t", 0, i, ev.stream_id.encode(), encode_event(ev), 0))
    return msgs


def _cached_rate(s: Settings, modality: str, msgs: list[RawMsg], cache: bool
                 ) -> tuple[float, float]:
    m = Metrics()
    memo = FeatureMemo(open_worker_cache(s, m)) if cache else None
    try:
        p = FeaturePipeline(s, memo)
        p.warm(modality)
        t0 = time.perf_counter()
        for i in range(0, len(msgs), 8):
            p.process(modality, msgs[i:i + 8])
        rate = len(msgs) / (time.perf_counter() - t0)
        hits = m.cache_requests.labels(modality, "hit")._value.get()
        asked = sum(m.cache_requests.labels(modality, r)._value.get()
                    for r in ("hit", "miss", "expired", "corrupt"))
        return rate, (hits / asked if asked else 0.0)
    finally:
        if memo is not None:
            memo.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer items (about 20 s)")
    ap.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: auto)")
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "int8", "fp16"],
                    help="of the first and third tables (the second shows fp32 and int8)")
    args = ap.parse_args()
    n, repeat = (32, 3) if args.quick else (96, 10)
    with tempfile.TemporaryDirectory() as tmp:
        # The models directory of MMSYNC_MODELS_DIR (or a temporary one): INT8 builds once.
        s = Settings(data_dir=Path(tmp), device=args.device, model_threads=args.threads,
                     precision=args.precision)
        p = FeaturePipeline(s)
        p.warm("image")
        im = p.extractor("image")
        print(f"device={args.device} threads={p.runtime.threads} items={n} "
              f"precision={args.precision}: {im.version}")
        print(f"{'modality':<8} {'load s':>7} {'raw b1/s':>9} {'raw b8/s':>9} "
              f"{'pipe b8/s':>10} {'pipe b1/s':>10} {'b8/b1':>6}")
        for modality in ("image", "audio", "text"):
            loads = p.warm(modality)
            r1, r8 = _raw_rates(p, modality, repeat)
            b8 = _pipeline_rate(s, modality, n, 8)
            b1 = _pipeline_rate(s, modality, n, 1)
            print(f"{modality:<8} {sum(loads.values()):>7.2f} {r1:>9.1f} {r8:>9.1f} "
                  f"{b8:>10.1f} {b1:>10.1f} {b8 / b1:>6.2f}")
        ser, conc = _concurrency_ab(p, 3 if args.quick else 8)
        print(f"\nimage models, batch 8: one after the other {ser:.1f} frames/s, at once"
              f" {conc:.1f} frames/s, ratio {conc / ser:.2f}")
        if args.device == "cpu" or not p.runtime.gpu_wanted():
            _precision_ab(s, n, 3 if args.quick else 7)
        pool, count = (24, 96) if args.quick else (48, 384)
        print(f"\nrepeated content: {count} records from {pool} distinct, Zipf 1.0, 8 streams,"
              " batches of 8")
        print(f"{'modality':<8} {'no cache/s':>11} {'cache/s':>9} {'hit %':>6} {'ratio':>6}")
        for modality in ("image", "audio", "text"):
            msgs = _zipf_trace(modality, pool, count)
            cold, _ = _cached_rate(s.model_copy(update={"data_dir": Path(tmp) / "off"}),
                                   modality, msgs, cache=False)
            hot, ratio = _cached_rate(s.model_copy(update={"data_dir": Path(tmp) / modality}),
                                      modality, msgs, cache=True)
            print(f"{modality:<8} {cold:>11.1f} {hot:>9.1f} {100 * ratio:>6.1f} "
                  f"{hot / cold:>6.2f}")


if __name__ == "__main__":
    main()
