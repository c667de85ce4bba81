"""INT8 formats against FP32 for the image models on this CPU (issue 29's open question).

``auto`` runs INT8 only where the CPU multiplies 8-bit integers in one instruction
(AVX-512 VNNI, AMX, Arm dot product: ``app.features.quantize.int8_instruction``); on
AVX2 alone the worker's recipe (QDQ, u8 activations x s8 weights per channel) ran
about as fast as FP32. This asks whether another format would pay there: each image
model is quantized here in the worker's recipe and in three others, with the worker's
calibration frames, and every file is timed in alternating rounds (batch 8, one
intra-op thread, as a worker's image thread runs them; medians), against the cleaned
FP32 graph the worker runs.

Formats: ``worker`` (the file the worker builds: QDQ, u8 x s8 per channel, the
EfficientNet's first convolutions kept FP32), ``u8u8`` (QDQ, u8 x u8 per channel),
``reduce_range`` (QDQ, u8 x s8 with 7-bit weights, which AVX2's saturating
multiply-add cannot overflow) and ``qoperator`` (QLinearConv nodes in the file instead
of QDQ pairs, u8 x s8). The variants are built under a temporary directory, never in
the models directory a worker reads.

    .venv/bin/python scripts/bench_int8_formats.py [--rounds 3] [--models-dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.settings import Settings  # noqa: E402

#: variant -> quantize_static keywords beyond the model, the reader and per_channel
_VARIANTS: dict[str, dict[str, Any]] = {
    "u8u8": {"weight_type": "QUInt8"},
    "reduce_range": {"weight_type": "QInt8", "reduce_range": True},
    "qoperator": {"weight_type": "QInt8", "quant_format": "QOperator"},
}


def _session(path: Path) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = 1, 1
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _variant(fp32: Path, out: Path, calib: Any, kw: dict[str, Any]) -> Path:
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    from app.features.quantize import CalibrationReader

    name = _session(fp32).get_inputs()[0].name
    with contextlib.redirect_stdout(io.StringIO()):  # it prints tensor protos for u8u8
        quantize_static(str(fp32), str(out), CalibrationReader(name, calib.batches()),
                        quant_format=QuantFormat[kw.get("quant_format", "QDQ")],
                        per_channel=True, activation_type=QuantType.QUInt8,
                        weight_type=QuantType[kw["weight_type"]],
                        reduce_range=kw.get("reduce_range", False),
                        calibrate_method=CalibrationMethod.MinMax)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=5, help="timed batches per file and round")
    ap.add_argument("--models-dir", type=Path, default=None,
                    help="where the worker's FP32 and INT8 files are (or are built); default: "
                         "MMSYNC_MODELS_DIR")
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # the quantizer's per-bias range warnings

    from app.features.frames import calibration_frames
    from app.features.image import (
        effnet_input,
        export_efficientnet,
        image_calibration,
        nsfw_input,
        nsfw_model_path,
    )
    from app.features.quantize import (
        Calibration,
        cpu_flags,
        cpu_model,
        int8_instruction,
        int8_model,
    )

    models = args.models_dir or Settings().models_path
    models.mkdir(parents=True, exist_ok=True)
    eff_src = models / "efficientnet_lite0_emb.onnx"
    if not eff_src.exists():
        export_efficientnet(eff_src)
    plan: dict[str, tuple[Path, Calibration, Callable[[list[np.ndarray]], np.ndarray]]] = {
        "EfficientNet-Lite0": (eff_src, image_calibration("effnet"), effnet_input),
        "Open-NSFW": (nsfw_model_path(), image_calibration("nsfw"), nsfw_input)}
    frames = list(calibration_frames(8, seed=7))  # not the calibration seed's frames
    flags = cpu_flags()
    print(f"CPU: avx2 {'avx2' in flags}, avx512f {'avx512f' in flags}, INT8 instruction "
          f"{int8_instruction(flags)}; frames/s, batch 8, 1 intra-op thread, "
          f"{args.rounds} alternating rounds of {args.runs} batches (medians)")
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="mmsync-int8-formats-") as tmp_s:
        tmp = Path(tmp_s)
        for model, (src, calib, prep) in plan.items():
            fp32 = cpu_model(src, models)
            files = {"fp32": fp32, "worker": int8_model(src, models, calib)}
            for v, kw in _VARIANTS.items():
                files[v] = _variant(fp32, tmp / f"{src.stem}.{v}.onnx", calib, kw)
            sessions = {k: _session(p) for k, p in files.items()}
            x = prep(frames)
            feeds = {k: {s.get_inputs()[0].name: x} for k, s in sessions.items()}
            times: dict[str, list[float]] = {k: [] for k in sessions}
            for s_k, s in sessions.items():
                s.run(None, feeds[s_k])  # warm-up
            for _ in range(args.rounds):
                for k, s in sessions.items():
                    for _ in range(args.runs):
                        t0 = time.perf_counter()
                        s.run(None, feeds[k])
                        times[k].append(time.perf_counter() - t0)
            rows[model] = {k: len(frames) / statistics.median(v) for k, v in times.items()}
    cols = ["fp32", "worker", *_VARIANTS]
    print(f"{'model':<20}" + "".join(f"{c:>14}" for c in cols))
    for model, r in rows.items():
        print(f"{model:<20}" + "".join(f"{r[c]:>14.1f}" for c in cols))
    print(f"{'x fp32':<20}" + "".join(
        f"{statistics.median(r[c] / r['fp32'] for r in rows.values()):>14.2f}" for c in cols)
        + "  (median of the two models)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
