"""CPU model files: a cleaned FP32 graph and its static INT8 (QDQ) twin, built once.

Both are derived from a source ONNX file and cached in the models directory
under names that carry a digest of everything they depend on (the source's
bytes, the recipe, the calibration set, ONNX Runtime's minor version), so a
new source model or recipe builds new files and the stale ones are removed.
Builds are atomic (:func:`app.features.onnx.atomic_write`) and serialised by
a lock file: workers starting together build once, the others wait.

* FP32 (:func:`cpu_model`): ONNX Runtime's pre-processing (shape inference,
  basic graph optimisation), then per-channel affine ops that follow a Conv
  (Open-NSFW's batch norms, exported as Sub/Mul/Add) folded into its weights.
  Exact to float rounding; Open-NSFW runs about 1.4x faster on the CPU.
* INT8 (:func:`int8_model`): ``quantize_static`` in QDQ format, weights int8
  per channel, activations uint8 per tensor (u8 x s8 is what AVX-512 VNNI
  multiplies), MinMax ranges over the calibration batches. The first
  ``fp32_head_convs`` convolutions and everything after the last one stay
  FP32: measured on EfficientNet-Lite0, its stem and first two blocks carry
  most of the INT8 error (docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.features.onnx import atomic_write

__all__ = ["INT8_INSTRUCTIONS", "Calibration", "CalibrationReader", "cpu_flags", "cpu_model",
           "file_digest", "fold_conv_affine", "int8_instruction", "int8_model"]

log = logging.getLogger(__name__)

#: Bump when the FP32 clean-up or the quantization recipe changes: new file names.
FP32_RECIPE = "cpu1:preprocess+fold"
INT8_RECIPE = "int8-1:qdq,w-s8-per-channel,a-u8-minmax"


@dataclass(frozen=True)
class Calibration:
    """What the INT8 build of one model needs from its owner.

    ``recipe`` names the calibration inputs (generator, seed, count, the model's
    preprocessing): change it whenever they change. ``batches`` yields float32
    input batches for the model's single input.
    """
    recipe: str
    batches: Callable[[], Iterable[np.ndarray]]
    fp32_head_convs: int = 0


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _tag(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


@contextlib.contextmanager
def _build_lock(models_dir: Path, stem: str) -> Iterator[None]:
    models_dir.mkdir(parents=True, exist_ok=True)
    with (models_dir / f".{stem}.lock").open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file closes
        yield


def _drop_stale(models_dir: Path, stem: str, kind: str, keep: Path) -> None:
    for old in models_dir.glob(f"{stem}.{kind}-*.onnx"):
        if old != keep:
            old.unlink(missing_ok=True)  # a worker still using it keeps its open copy


def _ort_minor() -> str:
    import onnxruntime as ort

    return ".".join(ort.__version__.split(".")[:2])


def fold_conv_affine(model: Any) -> int:
    """Fold ``Conv -> Add/Sub/Mul/Div(constant per channel)`` into the Conv; returns
    how many ops were folded. Only when the Conv's output feeds that op alone."""
    from onnx import numpy_helper as nh

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    outputs = {o.name for o in g.output}
    folded = 0
    while True:
        users: dict[str, list[Any]] = {}
        for n in g.node:
            for name in n.input:
                users.setdefault(name, []).append(n)
        hit = None
        for conv in g.node:
            if conv.op_type != "Conv" or conv.output[0] in outputs or conv.input[1] not in inits:
                continue
            nxt = users.get(conv.output[0], [])
            if (len(nxt) != 1 or nxt[0].op_type not in ("Add", "Sub", "Mul", "Div")
                    or list(nxt[0].input[:1]) != [conv.output[0]] or nxt[0].input[1] not in inits):
                continue
            w = nh.to_array(inits[conv.input[1]]).astype(np.float32)
            c = nh.to_array(inits[nxt[0].input[1]]).astype(np.float32)
            if c.size == 1:
                c = np.full(w.shape[0], c.reshape(-1)[0], np.float32)
            elif c.size == w.shape[0] and c.ndim in (3, 4) and c.shape[-2:] == (1, 1):
                c = c.reshape(-1)
            else:
                continue
            hit = (conv, nxt[0], w, c)
            break
        if hit is None:
            return folded
        conv, op, w, c = hit
        b = (nh.to_array(inits[conv.input[2]]).astype(np.float32)
             if len(conv.input) > 2 and conv.input[2] else np.zeros(w.shape[0], np.float32))
        if op.op_type in ("Add", "Sub"):
            b = b + c if op.op_type == "Add" else b - c
        else:
            k = c if op.op_type == "Mul" else 1.0 / c
            w, b = w * k[:, None, None, None], b * k
        names = (f"{op.output[0]}__w", f"{op.output[0]}__b")
        for arr, name in zip((w, b), names, strict=True):
            t = nh.from_array(arr.astype(np.float32), name)
            g.initializer.append(t)
            inits[name] = t
        x = conv.input[0]
        del conv.input[:]
        conv.input.extend([x, *names])
        conv.output[0] = op.output[0]
        g.node.remove(op)
        folded += 1


def _drop_unused_initializers(model: Any) -> None:
    used = {i for n in model.graph.node for i in n.input}
    keep = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)


def _build_once(models_dir: Path, stem: str, kind: str, out: Path,
                write: Callable[[Path], None]) -> Path:
    """``out``, made by ``write(tmp)`` unless it exists: one builder at a time (a worker
    that waited on the lock finds it built), by rename; older builds of the kind go."""
    if not out.exists():
        with _build_lock(models_dir, stem):
            if not out.exists():
                atomic_write(out, write)
                _drop_stale(models_dir, stem, kind, out)
    return out


def cpu_model(src: Path, models_dir: Path) -> Path:
    """The cleaned FP32 graph of ``src`` for the CPU (built once, see the module doc)."""
    out = models_dir / f"{src.stem}.cpu-{_tag(file_digest(src), FP32_RECIPE, _ort_minor())}.onnx"

    def write(tmp: Path) -> None:
        import onnx
        from onnxruntime.quantization.shape_inference import quant_pre_process

        quant_pre_process(str(src), str(tmp))
        model = onnx.load(str(tmp))
        n = fold_conv_affine(model)
        _drop_unused_initializers(model)
        onnx.save(model, str(tmp))
        log.info("%s: FP32 CPU graph built (%d affine ops folded into convs)", src.stem, n)

    return _build_once(models_dir, src.stem, "cpu", out, write)


class CalibrationReader:
    """onnxruntime.quantization.CalibrationDataReader over a Calibration's batches."""

    def __init__(self, input_name: str, batches: Iterable[np.ndarray]) -> None:
        self._it = iter(batches)
        self._name = input_name

    def get_next(self) -> dict[str, np.ndarray] | None:
        x = next(self._it, None)
        return None if x is None else {self._name: np.ascontiguousarray(x, dtype=np.float32)}


def _fp32_nodes(model: Any, head_convs: int) -> list[str]:
    """Names of the first ``head_convs`` convolutions (and what precedes them) and of
    every node after the last convolution: these stay FP32."""
    nodes = list(model.graph.node)
    convs = [i for i, n in enumerate(nodes) if n.op_type == "Conv"]
    if not convs:
        return []
    keep = nodes[:convs[head_convs - 1] + 1] if head_convs else []
    return [n.name for n in keep + nodes[convs[-1] + 1:] if n.name]


def int8_model(src: Path, models_dir: Path, calib: Calibration) -> Path:
    """The static INT8 (QDQ) twin of ``src`` (built once from :func:`cpu_model`'s graph)."""
    fp32 = cpu_model(src, models_dir)
    tag = _tag(fp32.name, INT8_RECIPE, calib.recipe, str(calib.fp32_head_convs), _ort_minor())
    out = models_dir / f"{src.stem}.int8-{tag}.onnx"

    def write(tmp: Path) -> None:
        import onnx
        import onnxruntime as ort
        from onnxruntime.quantization import (
            CalibrationMethod,
            QuantFormat,
            QuantType,
            quantize_static,
        )

        model = onnx.load(str(fp32))
        input_name = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"]
                                          ).get_inputs()[0].name
        quantize_static(str(fp32), str(tmp), CalibrationReader(input_name, calib.batches()),
                        quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        calibrate_method=CalibrationMethod.MinMax,
                        nodes_to_exclude=_fp32_nodes(model, calib.fp32_head_convs))
        log.info("%s: INT8 model built (%s)", src.stem, out.name)

    return _build_once(models_dir, src.stem, "int8", out, write)


# -- auto: INT8 where the CPU multiplies 8-bit integers natively ----------------------

#: Instructions that multiply 8-bit integers into 32-bit sums in one step (x86 VNNI and
#: AMX, Arm's dot product and matrix multiply), best first. With one of them INT8
#: convolutions ran 1.9-2.8x FP32 (AVX-512 VNNI, docs/benchmarks.md); without (AVX2 alone,
#: where ONNX Runtime's u8 x s8 kernel needs two instructions and saturating adds) they
#: ran 1.11-1.18x, and a start-up timing against a 1.15x threshold flipped between runs
#: and workers on one machine (issue 29). So ``auto`` decides by the instruction set: one
#: answer per CPU model, the same on every start and every worker, and no INT8 build (about
#: 20 s) where it would not run.
INT8_INSTRUCTIONS = ("amx_int8", "avx512_vnni", "avx_vnni", "avxvnni", "i8mm", "asimddp")


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU's feature flags (x86 ``flags``, Arm ``Features`` in /proc/cpuinfo); empty
    where they cannot be read."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def int8_instruction(flags: frozenset[str] | None = None) -> str | None:
    """The instruction that makes INT8 pay on this CPU, or None (``auto`` runs FP32)."""
    have = cpu_flags() if flags is None else flags
    return next((f for f in INT8_INSTRUCTIONS if f in have), None)
