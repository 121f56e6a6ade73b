"""NVRTC, the compiler CuPy's ``RawModule`` calls, through ctypes: a CUDA source compiled as a
GPU machine compiles it, on a machine without a GPU (no host headers, CuPy's options); and
cuobjdump, which reads a kernel's resources off its machine code where NVRTC reports none.

NVRTC's library is ``$GLN_NVRTC``, the ``nvidia-cuda-nvrtc-cu12`` wheel's, or the system's.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path


@functools.cache
def library() -> ctypes.CDLL | None:
    """NVRTC's library: ``$GLN_NVRTC``, the nvidia-cuda-nvrtc wheel's, the system's, or None."""
    candidates = [os.environ.get("GLN_NVRTC", "")]
    try:
        spec = importlib.util.find_spec("nvidia.cuda_nvrtc")
    except ModuleNotFoundError:
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            candidates += sorted(str(p) for p in Path(folder, "lib").glob("libnvrtc.so*"))
    candidates.append(ctypes.util.find_library("nvrtc") or "")
    for candidate in filter(None, candidates):
        try:
            return ctypes.CDLL(candidate)
        except OSError:
            continue
    return None


@dataclass(frozen=True)
class Compiled:
    """NVRTC's status (0: compiled), its log (with ptxas's report) and the machine code."""

    status: int
    log: str
    cubin: bytes


def compile_source(text: str, name: str, options: list[str],
                   architecture: str = "sm_90") -> Compiled:
    """``text`` compiled for ``architecture`` (machine code, not PTX) with ``options``."""
    nvrtc = library()
    if nvrtc is None:
        raise FileNotFoundError("NVRTC's library was not found (GLN_NVRTC, "
                                "nvidia-cuda-nvrtc-cu12)")
    program = ctypes.c_void_p()
    if nvrtc.nvrtcCreateProgram(ctypes.byref(program), text.encode(), name.encode(), 0, None,
                                None) != 0:
        raise RuntimeError(f"NVRTC could not take {name}")
    try:
        arguments = [f"--gpu-architecture={architecture}", "--ptxas-options=-v", *options]
        encoded = [a.encode() for a in arguments]
        status = nvrtc.nvrtcCompileProgram(program, len(encoded),
                                           (ctypes.c_char_p * len(encoded))(*encoded))
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(program, log)
        cubin = b""
        if status == 0:
            nvrtc.nvrtcGetCUBINSize(program, ctypes.byref(size))
            code = ctypes.create_string_buffer(size.value)
            nvrtc.nvrtcGetCUBIN(program, code)
            cubin = code.raw
        return Compiled(status, log.value.decode(errors="replace"), cubin)
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(program))


def cuobjdump() -> str:
    """cuobjdump: ``$CUOBJDUMP``, on PATH, or the one NVIDIA's or Triton's wheel carries."""
    candidates = [os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump")]
    for package, folder in (("nvidia", "cu13/bin"), ("triton", "backends/nvidia/bin")):
        spec = importlib.util.find_spec(package)
        for root in (spec.submodule_search_locations or []) if spec else []:
            candidates.append(str(Path(root, folder, "cuobjdump")))
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError("no cuobjdump: set CUOBJDUMP, put the CUDA toolkit's on PATH, or "
                            "pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm")
