"""Whether ONNX Runtime's CUDA provider can load here, asked before asking for it.

``onnxruntime-gpu`` lists the CUDA and TensorRT providers even on a machine
without CUDA; asking for one there prints red ``[E:onnxruntime ...]`` lines
and an "EP Error" banner at every session, then falls back to the CPU. So the
libraries the provider needs are looked for first, the way the dynamic linker
will: the ``DT_NEEDED`` entries of ``libonnxruntime_providers_cuda.so`` (read
from its ELF header), plus cuDNN, which it opens later. Each is opened with
``ctypes`` by name, then from the ``nvidia-*`` pip packages' ``lib`` folders
(loading it globally there is what ``onnxruntime.preload_dlls`` does). Then
``cudaGetDeviceCount`` must find a device. Linux only; elsewhere ONNX Runtime
is asked directly.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import struct
import sys
from pathlib import Path

__all__ = ["cuda_problem", "elf_needed", "tensorrt_problem"]

#: cuDNN major version ONNX Runtime >= 1.19 is built against (opened at run time,
#: so it is not in DT_NEEDED).
_CUDNN = "libcudnn.so.9"
#: Libraries of the CUDA stack (the rest of DT_NEEDED is libc, libstdc++ and friends).
_CUDA_PREFIXES = ("libcu", "libnv")


def elf_needed(path: Path) -> list[str]:
    """The ``DT_NEEDED`` names of a 64-bit little-endian ELF shared library (reads only its
    section headers, dynamic section and string table: the CUDA provider is 280 MB)."""
    with path.open("rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
        shoff, = struct.unpack_from("<Q", head, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", head, 0x3A)
        f.seek(shoff)
        table = f.read(shentsize * shnum)
        sections = [struct.unpack_from("<IIQQQQIIQQ", table, i * shentsize) for i in range(shnum)]
        out: list[str] = []
        for _name, sh_type, _f, _a, offset, size, link, _i, _al, entsize in sections:
            if sh_type != 6:  # SHT_DYNAMIC
                continue
            f.seek(offset)
            dyn = f.read(size)
            f.seek(sections[link][4])
            strtab = f.read(sections[link][5])
            for k in range(0, size, entsize or 16):
                tag, val = struct.unpack_from("<qQ", dyn, k)
                if tag == 0:  # DT_NULL
                    break
                if tag == 1:  # DT_NEEDED
                    out.append(strtab[val:strtab.index(b"\0", val)].decode())
    return out


def _pip_lib_dirs() -> list[Path]:
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return []
    return [lib for root in spec.submodule_search_locations for lib in Path(root).glob("*/lib")]


def _load(name: str) -> bool:
    try:
        ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        return True
    except OSError:
        pass
    for d in _pip_lib_dirs():
        if (d / name).exists():
            try:
                ctypes.CDLL(str(d / name), mode=ctypes.RTLD_GLOBAL)
                return True
            except OSError:
                return False
    return False


def _ort_capi() -> Path | None:
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "capi"


def _needed(provider_lib: str) -> list[str] | None:
    """The CUDA-stack libraries a provider library links; None when the check does not apply."""
    capi = _ort_capi()
    if not sys.platform.startswith("linux") or capi is None or not (capi / provider_lib).exists():
        return None
    try:
        return [n for n in elf_needed(capi / provider_lib) if n.startswith(_CUDA_PREFIXES)]
    except (OSError, ValueError, struct.error):
        return None


def _missing(needed: list[str]) -> list[str]:
    # libcuda (the driver) last: the toolkit libraries are the usual thing to be missing.
    names = sorted(dict.fromkeys(needed), key=lambda n: n == "libcuda.so.1")
    return [n for n in names if not _load(n)]


@functools.lru_cache(maxsize=1)
def cuda_problem() -> str | None:
    """None when the CUDA provider should load and find a GPU, else why not (one line)."""
    needed = _needed("libonnxruntime_providers_cuda.so")
    if needed is None:
        return None
    missing = _missing([*needed, _CUDNN])
    if missing:
        return "CUDA libraries not found: " + ", ".join(missing)
    cudart = next((n for n in needed if n.startswith("libcudart")), None)
    if cudart is None:
        return None
    count = ctypes.c_int(0)
    err = ctypes.CDLL(cudart).cudaGetDeviceCount(ctypes.byref(count))
    if err != 0 or count.value == 0:
        return f"no CUDA device (cudaGetDeviceCount: error {err}, {count.value} devices)"
    return None


@functools.lru_cache(maxsize=1)
def tensorrt_problem() -> str | None:
    """None when the TensorRT provider's libraries load (and CUDA works), else why not."""
    problem = cuda_problem()
    if problem is not None:
        return problem
    needed = _needed("libonnxruntime_providers_tensorrt.so")
    missing = _missing(needed) if needed is not None else []
    return "TensorRT libraries not found: " + ", ".join(missing) if missing else None
