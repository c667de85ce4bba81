#!/usr/bin/env bash
# GPU check for the model runtime, for a machine with CUDA. Creates .venv the
# way the Makefile does when it is absent, then verifies that CUDA really runs
# the image models (onnxruntime-gpu falls back to the CPU silently), that the
# CUDA library check (app/features/cudalibs.py) passes, compares FP16 with FP32
# outputs, times batches of 1, 8 and 32, and puts the choice MMSYNC_PRECISION=auto
# makes (FP16 on CUDA) beside the CPU paths (FP32, INT8) on the same frames.
#   scripts/gpu_check.sh               # on the GPU machine
#   scripts/gpu_check.sh --cpu-dry-run # here: same Python path on the CPU
set -euo pipefail
cd "$(dirname "$0")/.."
MODE="${1:-gpu}"
if [ ! -x .venv/bin/python ]; then make install; fi
export MMSYNC_MODELS_DIR="${MMSYNC_MODELS_DIR:-/tmp/mmsync-models}"
.venv/bin/python - "$MODE" <<'PY'
import os, sys, time
from pathlib import Path
import numpy as np
import onnxruntime as ort
from app.features.cudalibs import cuda_problem, tensorrt_problem
from app.features.frames import accuracy_frames
from app.features.image import ImageExtractor, effnet_input, export_efficientnet, nsfw_input
from app.features.onnx import CUDA, ModelRuntime

dry = sys.argv[1] == "--cpu-dry-run"
print("onnxruntime", ort.__version__, "available:", ort.get_available_providers())
print("CUDA check:", cuda_problem() or "libraries load, a device answers")
print("TensorRT check:", tensorrt_problem() or "libraries load")
models = Path(os.environ["MMSYNC_MODELS_DIR"])
eff = models / "efficientnet_lite0_emb.onnx"
if not eff.exists():
    export_efficientnet(eff)
# tensorrt=False: TensorRT builds an engine per batch shape (minutes); CUDA FP16 is checked.
runs = {"auto": ModelRuntime(device="cpu" if dry else "auto", models_dir=models, tensorrt=False),
        "gpu fp32": ModelRuntime(device="cpu" if dry else "cuda", models_dir=models,
                                 tensorrt=False, precision="fp32"),
        "cpu fp32": ModelRuntime(device="cpu", models_dir=models, precision="fp32"),
        "cpu int8": ModelRuntime(device="cpu", models_dir=models, precision="int8")}
ex = {}
for name, rt in runs.items():
    e = ImageExtractor(rt)
    e.load()
    ex[name] = e
ok = True
auto = ex["auto"]
if not dry and (auto.effnet.provider != CUDA or auto.nsfw.precision != "fp16"):
    print(f"FAIL: auto runs {auto.effnet.provider} {auto.nsfw.precision}, not CUDA fp16")
    ok = False
rgbs = accuracy_frames(32)
ref = ex["cpu fp32"]
print(f"\n{'run':<10} {'model':<18} {'provider':<22} {'prec':>5} {'cos/|d|':>9} "
      f"{'b1 it/s':>8} {'b8 it/s':>8} {'b32 it/s':>9}")
for name, e in ex.items():
    for model, ms, prep in (("efficientnet_lite0", e.effnet, effnet_input),
                            ("open_nsfw", e.nsfw, nsfw_input)):
        base = ref.effnet if model == "efficientnet_lite0" else ref.nsfw
        x = prep(rgbs[:8])
        a, b = ms.run(x)[0].astype(np.float32), base.run(x)[0].astype(np.float32)
        if model == "open_nsfw":
            err = float(np.abs(a[:, 1] - b[:, 1]).max())  # P(nsfw), max |difference|
        else:
            err = float(np.mean(np.sum(a * b, 1) /
                                (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))))
        rates = []
        for n in (1, 8, 32):
            xb = prep(rgbs[:n])
            ms.run(xb)
            reps = 3 if (dry or not ms.on_gpu) else 20
            t0 = time.perf_counter()
            for _ in range(reps):
                ms.run(xb)
            rates.append(n * reps / (time.perf_counter() - t0))
        if ms.fp16 and ((model == "efficientnet_lite0" and err < 0.999) or
                        (model == "open_nsfw" and err > 0.02)):
            print(f"FAIL: {name} {model} FP16 vs CPU FP32: {err:.5f}")
            ok = False
        print(f"{name:<10} {model:<18} {ms.provider:<22} {ms.precision:>5} {err:>9.5f} "
              f"{rates[0]:>8.1f} {rates[1]:>8.1f} {rates[2]:>9.1f}")
print("(cos/|d|: mean embedding cosine, or max |P(nsfw) difference|, against CPU FP32)")
print("OK" if ok else "FAILED")
sys.exit(0 if ok else 1)
PY
