#!/usr/bin/env bash
# GPU check for the model runtime, for a machine with CUDA. Creates .venv the
# way the Makefile does when it is absent, then verifies that CUDA really runs
# the image models (onnxruntime-gpu falls back to the CPU silently), compares
# FP16 with FP32 outputs and times batches of 1, 8 and 32.
#   scripts/gpu_check.sh               # on the GPU machine
#   scripts/gpu_check.sh --cpu-dry-run # here: same Python path on the CPU
set -euo pipefail
cd "$(dirname "$0")/.."
MODE="${1:-gpu}"
if [ ! -x .venv/bin/python ]; then make install; fi
export MMSYNC_MODELS_DIR="${MMSYNC_MODELS_DIR:-/tmp/mmsync-models}"
.venv/bin/python - "$MODE" <<'PY'
import sys, time
import numpy as np
import onnxruntime as ort
from PIL import Image
from app.features.image import effnet_input, nsfw_input, export_efficientnet, nsfw_model_path
from app.features.onnx import CUDA, ModelRuntime
from pathlib import Path
import os

dry = sys.argv[1] == "--cpu-dry-run"
print("onnxruntime", ort.__version__, "available:", ort.get_available_providers())
models = Path(os.environ["MMSYNC_MODELS_DIR"])
eff = models / "efficientnet_lite0_emb.onnx"
if not eff.exists():
    export_efficientnet(eff)
gpu_rt = ModelRuntime(device="cpu" if dry else "cuda", models_dir=models, tensorrt=False)
cpu_rt = ModelRuntime(device="cpu", models_dir=models)
rng = np.random.default_rng(0)
rgbs = [rng.integers(0, 255, (256, 256, 3), dtype=np.uint8) for _ in range(32)]
ok = True
print(f"{'model':<18} {'provider':<22} {'fp16':>5} {'maxabs':>9} {'cos':>8} "
      f"{'b1 it/s':>8} {'b8 it/s':>8} {'b32 it/s':>9}")
for name, path, prep in (("efficientnet_lite0", eff, effnet_input),
                         ("open_nsfw", nsfw_model_path(), nsfw_input)):
    g = gpu_rt.session(name, path)
    c = cpu_rt.session(name, path)
    if not dry and g.sess.get_providers()[0] != CUDA:
        print(f"FAIL: {name} runs on {g.sess.get_providers()}")
        ok = False
    x = prep(rgbs[:8])
    a, b = g.run(x)[0].astype(np.float32), c.run(x)[0].astype(np.float32)
    maxabs = float(np.abs(a - b).max())
    cos = float(np.mean(np.sum(a * b, 1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))))
    rates = []
    for n in (1, 8, 32):
        xb = prep(rgbs[:n])
        g.run(xb)
        reps = 3 if dry else 20
        t0 = time.perf_counter()
        for _ in range(reps):
            g.run(xb)
        rates.append(n * reps / (time.perf_counter() - t0))
    if cos < 0.999:
        print(f"FAIL: {name} FP16 vs FP32 cosine {cos:.5f}")
        ok = False
    print(f"{name:<18} {g.provider:<22} {str(g.fp16):>5} {maxabs:>9.2e} {cos:>8.5f} "
          f"{rates[0]:>8.1f} {rates[1]:>8.1f} {rates[2]:>9.1f}")
print("OK" if ok else "FAILED")
sys.exit(0 if ok else 1)
PY
