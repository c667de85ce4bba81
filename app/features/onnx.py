"""ONNX Runtime sessions: provider and precision choice, padded batches, OOM fallback.

Pure (no Faust). One :class:`ModelRuntime` per worker process builds every
session; each :class:`ModelSession` knows which provider really runs it
(``onnxruntime-gpu`` falls back to the CPU silently when CUDA does not load,
so we read ``session.get_providers()`` after creating it and log the truth).
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from app.errors import TransientError

if TYPE_CHECKING:
    from app.features.quantize import Calibration

__all__ = [
    "CPU",
    "CUDA",
    "TRT",
    "ModelRuntime",
    "ModelSession",
    "Precision",
    "atomic_write",
    "default_threads",
    "is_oom",
]

log = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TRT = "TensorrtExecutionProvider"
#: Batches on the GPU are padded to a multiple of this (tensor-core friendly,
#: and fewer distinct shapes for TensorRT to build engines for).
GPU_BATCH_MULTIPLE = 8
_OOM_MARKERS = ("out of memory", "failed to allocate", "alloc_failed", "cudaerrormemoryallocation",
                "bfc_arena", "oom")


def default_threads() -> int:
    """Intra-op threads per session: 1 on a box of 1 or 2 cores (three modality
    threads share them; more threads only thrash), else a third of the cores, at most 4."""
    n = os.cpu_count() or 1
    return 1 if n <= 2 else min(4, n // 3)


def is_oom(exc: BaseException) -> bool:
    """Whether an ONNX Runtime error is a (CUDA) out-of-memory failure."""
    msg = str(exc).lower()
    return any(m in msg for m in _OOM_MARKERS)


def atomic_write(path: Path, write: Callable[[Path], None]) -> Path:
    """Write ``path`` through a temporary file and a rename: several worker
    processes may export the same model at once, and none may read half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


class _Session(Protocol):
    def run(self, output_names: Sequence[str] | None, feeds: dict[str, Any]) -> list[Any]: ...
    def get_providers(self) -> list[str]: ...


class ModelSession:
    """A batch-first model with one input: pads on the GPU, halves on OOM.

    ``run(x)`` returns the model's outputs for ``x`` (batch on axis 0). On a
    CUDA out-of-memory error the batch is split in two and each half retried;
    a single item that still fails runs on a CPU session built on demand by
    ``cpu_factory``: slower, but no message is lost.
    """

    def __init__(self, name: str, sess: _Session, input_name: str,
                 cpu_factory: Callable[[], _Session] | None = None, precision: str = "fp32",
                 model_file: str = "") -> None:
        self.name = name
        self.sess = sess
        self.input_name = input_name
        self.providers = list(sess.get_providers())
        self.provider = self.providers[0] if self.providers else CPU
        #: "fp32", "fp16" (CUDA) or "int8" (CPU): what really runs
        self.precision = precision
        #: the ONNX file's name (derived files carry a digest of what built them)
        self.model_file = model_file
        self._cpu_factory = cpu_factory
        self._cpu: _Session | None = None
        #: items that had to run on the CPU fallback (for metrics and tests).
        self.cpu_fallbacks = 0
        self.oom_splits = 0

    @property
    def fp16(self) -> bool:
        return self.precision == "fp16"

    @property
    def on_gpu(self) -> bool:
        return self.provider in (CUDA, TRT)

    def run(self, x: np.ndarray) -> list[np.ndarray]:
        if len(x) == 0:
            raise ValueError(f"{self.name}: empty batch")
        return self._run_split(x, pad=True)

    def _run_split(self, x: np.ndarray, pad: bool) -> list[np.ndarray]:
        try:
            return self._run_padded(x, pad)
        except Exception as exc:
            if not is_oom(exc):
                raise
            if len(x) > 1:
                half = len(x) // 2
                self.oom_splits += 1
                log.warning("%s: out of memory at batch %d, halving", self.name, len(x))
                # Halves run unpadded: padding them back to 8 would undo the split.
                a, b = self._run_split(x[:half], False), self._run_split(x[half:], False)
                return [np.concatenate([p, q]) for p, q in zip(a, b, strict=True)]
            if self._cpu_factory is None:
                # retriable: the pipeline retries this record, then dead-letters it
                raise TransientError(f"{self.name}: out of memory on one item") from exc
            log.warning("%s: out of memory on one item, running it on the CPU", self.name)
            if self._cpu is None:
                self._cpu = self._cpu_factory()
            self.cpu_fallbacks += 1
            return [np.asarray(o) for o in self._cpu.run(None, {self.input_name: x})]

    def _run_padded(self, x: np.ndarray, pad: bool) -> list[np.ndarray]:
        n = len(x)
        if pad and self.on_gpu and n % GPU_BATCH_MULTIPLE:
            extra = GPU_BATCH_MULTIPLE - n % GPU_BATCH_MULTIPLE
            x = np.concatenate([x, np.repeat(x[-1:], extra, axis=0)])
        outs = self.sess.run(None, {self.input_name: np.ascontiguousarray(x)})
        return [np.asarray(o)[:n] for o in outs]


Precision = Literal["auto", "fp32", "int8", "fp16"]


class ModelRuntime:
    """Builds sessions for one worker process from the device and precision settings.

    Precision per session, from ``precision`` and where the session runs:

    ========= ========================= ==========================================
    setting   on CUDA                   on the CPU
    ========= ========================= ==========================================
    auto      FP16                      INT8 where the CPU has VNNI or a dot product
    fp32      FP32                      FP32
    fp16      FP16                      FP32 (no fast FP16 CPU kernels)
    int8      FP16 (INT8 is CPU-only)   INT8
    ========= ========================= ==========================================

    A model without a :class:`~app.features.quantize.Calibration` (the VAD) stays FP32.
    """

    def __init__(self, device: Literal["auto", "cpu", "cuda"] = "auto", gpu_mem_limit_mb: int = 0,
                 models_dir: Path | None = None, threads: int = 0, tensorrt: bool = True,
                 precision: Precision = "auto") -> None:
        self.device = device
        self.gpu_mem_limit_mb = gpu_mem_limit_mb
        self.models_dir = models_dir or Path(".mmsync/models")
        self.threads = threads or default_threads()
        self.tensorrt = tensorrt
        self.precision = precision
        self._lock = threading.Lock()
        #: None until the first GPU session tells us whether CUDA really loads.
        self._cuda_works: bool | None = None
        #: model name -> (provider, precision) of every session built (the model_info metric)
        self.models: dict[str, tuple[str, str]] = {}

    @classmethod
    def from_settings(cls, s: Any) -> ModelRuntime:
        """From an :class:`app.settings.Settings` (typed Any: settings import nothing of app)."""
        return cls(s.device, s.gpu_mem_limit_mb, s.models_path, s.model_threads, s.tensorrt,
                   s.precision)

    # -- providers -------------------------------------------------------
    def gpu_wanted(self) -> bool:
        """Whether to ask for CUDA: only when its libraries load and it finds a device, so
        that a CPU-only machine never sees ONNX Runtime's provider errors."""
        if self.device == "cpu" or self._cuda_works is False:
            return False
        import onnxruntime as ort

        if CUDA not in ort.get_available_providers():
            return False
        from app.features.cudalibs import cuda_problem

        problem = cuda_problem()
        if problem is not None:
            if self._cuda_works is None:
                log.info("models run on the CPU: %s", problem)
            self._cuda_works = False
            return False
        return True

    def _gpu_providers(self) -> list[Any]:
        import onnxruntime as ort

        from app.features.cudalibs import tensorrt_problem

        cuda_opts: dict[str, Any] = {"arena_extend_strategy": "kSameAsRequested"}
        if self.gpu_mem_limit_mb:
            cuda_opts["gpu_mem_limit"] = self.gpu_mem_limit_mb * 1024 * 1024
        providers: list[Any] = []
        if (self.tensorrt and TRT in ort.get_available_providers()
                and tensorrt_problem() is None):
            trt_cache = self.models_dir / "trt"
            trt_cache.mkdir(parents=True, exist_ok=True)
            providers.append((TRT, {"trt_fp16_enable": self.precision != "fp32",
                                    "trt_engine_cache_enable": True,
                                    "trt_engine_cache_path": str(trt_cache)}))
        providers += [(CUDA, cuda_opts), CPU]
        return providers

    def _options(self) -> Any:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # Idle threads spinning on a 2-core box steal the other modalities' core.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.log_severity_level = 3
        return so

    def cpu_session(self, path: Path) -> Any:
        import onnxruntime as ort

        return ort.InferenceSession(str(path), self._options(), providers=[CPU])

    # -- sessions --------------------------------------------------------
    def session(self, name: str, path: Path, *, gpu: bool = True,
                calibration: Calibration | None = None) -> ModelSession:
        """A session for the ONNX file ``path``: on the GPU when wanted and it really
        loads there (FP16 unless ``fp32``), else on the CPU at the precision the table in
        the class doc gives (``calibration`` makes INT8 possible)."""
        import onnxruntime as ort

        with self._lock:
            use_gpu = gpu and self.gpu_wanted()
            if not use_gpu:
                if gpu and self.device == "cuda":
                    from app.features.cudalibs import cuda_problem

                    raise RuntimeError(f"{name}: MMSYNC_DEVICE=cuda but CUDA cannot run: "
                                       f"{cuda_problem() or 'onnxruntime has no CUDA provider'}")
                return self._cpu(name, path, calibration)
            # FP32 first: whether CUDA really loads is known only from a session,
            # and converting to FP16 for a CPU fallback would be wasted seconds.
            sess = ort.InferenceSession(str(path), self._options(),
                                        providers=self._gpu_providers())
            real = sess.get_providers()
            if CUDA not in real and TRT not in real:
                self._cuda_works = False
                msg = f"{name}: CUDA provider did not load (runs on {real})"
                if self.device == "cuda":
                    raise RuntimeError(msg)
                log.warning("%s: falling back to the CPU", msg)
                return self._cpu(name, path, calibration)
            self._cuda_works = True
            model_path, fp16 = (path, False) if self.precision == "fp32" else \
                self.fp16_model(name, path)
            if fp16:
                sess = ort.InferenceSession(str(model_path), self._options(),
                                            providers=self._gpu_providers())
            why = "int8 is a CPU precision" if self.precision == "int8" else ""
            return self._wrap(name, sess, path, model_path, "fp16" if fp16 else "fp32", why)

    def _cpu(self, name: str, path: Path, calibration: Calibration | None) -> ModelSession:
        from app.features.quantize import cpu_model, int8_instruction, int8_model

        want, why = self.precision, ""
        if want == "fp16":
            want, why = "fp32", "fp16 needs CUDA"
        if want in ("auto", "int8") and calibration is None:
            want, why = "fp32", "no calibration set for this model"
        if want == "auto":
            isa = int8_instruction()
            want = "int8" if isa else "fp32"
            why = (f"auto: int8, the CPU has {isa}" if isa else
                   "auto: fp32, the CPU has no VNNI or dot-product instruction for int8")
        try:
            fp32 = cpu_model(path, self.models_dir)
        except Exception as exc:  # noqa: BLE001 - the source file still runs
            log.warning("%s: FP32 CPU graph not built (%s); running the source file", name, exc)
            return self._wrap(name, self.cpu_session(path), path, path, "fp32", why)
        if want == "fp32" or calibration is None:
            return self._wrap(name, self.cpu_session(fp32), path, fp32, "fp32", why)
        try:
            int8 = int8_model(path, self.models_dir, calibration)
        except Exception as exc:  # noqa: BLE001 - FP32 still runs
            log.warning("%s: INT8 model not built (%s); running FP32", name, exc)
            return self._wrap(name, self.cpu_session(fp32), path, fp32, "fp32", "INT8 build failed")
        return self._wrap(name, self.cpu_session(int8), path, int8, "int8", why)

    def int8_twin(self, name: str, path: Path, calibration: Calibration) -> ModelSession | None:
        """An INT8 CPU session of ``path`` beside the FP32 one this runtime runs (the
        scoring fallback of a batch behind its records: ``ImageExtractor``), or None where
        INT8 would not pay (no VNNI or dot-product instruction: ``auto`` runs FP32 there
        too) or does not build."""
        from app.features.quantize import int8_instruction, int8_model

        isa = int8_instruction()
        if isa is None:
            return None
        with self._lock:  # as session(): one build of a file at a time
            try:
                int8 = int8_model(path, self.models_dir, calibration)
                sess = self.cpu_session(int8)
            except Exception as exc:  # noqa: BLE001 - the FP32 session still runs them all
                log.warning("%s: INT8 fallback not built (%s); behind batches run FP32",
                            name, exc)
                return None
        # listed apart from the FP32 session in mmsync_model_info
        return self._wrap(name, sess, int8, int8, "int8", key=f"{name}_int8_fallback",
                          why=f"the fallback for batches behind their records; the CPU has"
                              f" {isa}")

    def _wrap(self, name: str, sess: Any, src: Path, model: Path, precision: str,
              why: str = "", key: str | None = None) -> ModelSession:
        """``name``'s session, registered under ``key`` (default ``name``) for
        mmsync_model_info."""
        ms = ModelSession(name, sess, sess.get_inputs()[0].name,
                          cpu_factory=lambda: self.cpu_session(src), precision=precision,
                          model_file=model.name)
        self.models[key or name] = (ms.provider, precision)
        log.info("%s: %s, %s%s, %d intra-op thread(s), %s", name, ms.provider, precision,
                 f" ({why})" if why else "", self.threads, model.name)
        return ms

    def fp16_model(self, name: str, path: Path) -> tuple[Path, bool]:
        """The FP16 twin of ``path`` under models_dir (converted once, atomically), made
        from its cleaned FP32 graph; FP32 (and a log line saying why) when
        onnxconverter-common is absent or the conversion does not load.

        From the cleaned graph, not the source: Open-NSFW as shipped carries 309 Cast
        nodes, and onnxconverter-common turned them into a model ONNX Runtime refuses
        ("Type (tensor(float16)) of output arg (/Cast_1_output_0) ... does not match";
        seen on the H200, docs/benchmarks.md), while blocking Cast from the conversion
        ran for over 5 minutes. The cleaned graph has none, and folded batch norms."""
        try:
            import onnx
            from onnxconverter_common import float16
        except ImportError:
            log.warning("%s: onnxconverter-common not installed; keeping FP32 on the GPU", name)
            return path, False
        from app.features.quantize import cpu_model

        try:
            src = cpu_model(path, self.models_dir)
        except Exception as exc:  # noqa: BLE001 - the source file still converts
            log.warning("%s: FP32 graph not cleaned (%s); converting the source", name, exc)
            src = path
        out = self.models_dir / f"{src.stem}.fp16.onnx"
        if out.exists():
            return out, True
        with warnings.catch_warnings():  # "value truncated to 1e-7": expected in FP16
            warnings.simplefilter("ignore", UserWarning)
            model = float16.convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
        try:  # a conversion ONNX Runtime cannot load is no model: say so, keep FP32
            import onnxruntime as ort

            ort.InferenceSession(model.SerializeToString(), self._options(), providers=[CPU])
        except Exception as exc:  # noqa: BLE001 - any load failure means the same
            log.warning("%s: FP16 conversion does not load (%s); keeping FP32 on the GPU",
                        name, str(exc)[:200])
            return path, False
        atomic_write(out, lambda tmp: onnx.save(model, str(tmp)))
        return out, True
