"""The CUDA sources beside this file, compiled by CuPy's ``RawModule`` (NVRTC) on first use and
cached on disk by CuPy, and their kernels, each looked up once.

Shared by the modules that launch them (``gln.kernels.cuda``, ``gln.kernels.int8_gating``),
with the constants their launches agree on. CuPy is imported only when a module is compiled.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from gln.backend import import_cupy
from gln.scaling import Z_LIMIT

WARP = 32
GATING_THREADS = 128  # __launch_bounds__ of the kernels in gating.cu
# No fused multiply-adds beyond the sources' own fmaf; scaling.cu takes gln.scaling's bound.
COMPILE_OPTIONS = ("--fmad=false", f"-DGLN_Z_LIMIT={Z_LIMIT!r}")
SOURCES = Path(__file__).resolve().parent


@functools.cache
def source(name: str) -> str:
    """The text of the CUDA source ``name`` beside this file."""
    return (SOURCES / name).read_text()


@functools.cache
def compiled(name: str, defines: tuple[str, ...] = ()) -> Any:
    """The source ``name`` compiled with ``COMPILE_OPTIONS`` and ``defines`` ("-DNAME=VALUE")."""
    return import_cupy().RawModule(code=source(name), options=(*COMPILE_OPTIONS, *defines))


@functools.cache
def function(name: str, kernel: str, defines: tuple[str, ...] = ()) -> Any:
    """Kernel ``kernel`` of the source ``name`` compiled with ``defines``."""
    return compiled(name, defines).get_function(kernel)
