"""Choosing the array module (NumPy or CuPy) once per model.

Everything in ``gln`` is written against an array module ``xp``; this is the only place that
decides which one. CuPy is imported lazily and only when a GPU device is asked for, so the CPU
path never imports it.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import numpy as np

DEVICES = ("cpu", "cuda", "auto")


def _cupy_or_none() -> ModuleType | None:
    try:
        import cupy  # noqa: PLC0415 - optional dependency, imported only on request

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return cupy
    except Exception:  # ImportError, or a CUDA driver that is missing or broken
        return None
    return None


def resolve_device(device: str) -> str:
    """Turn ``"cpu" | "cuda" | "auto"`` into the concrete device a model will run on.

    ``"auto"`` picks ``"cuda"`` when CuPy imports and sees a GPU, else ``"cpu"``; ``"cuda"``
    without a usable GPU is an error rather than a silent fallback.
    """
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    if device == "cpu":
        return "cpu"
    if _cupy_or_none() is not None:
        return "cuda"
    if device == "auto":
        return "cpu"
    raise ValueError(
        "device='cuda' needs CuPy and a CUDA GPU (pip install 'gln-service[gpu]', or "
        "'gln-service[gpu-cuda13]' for CUDA 13); "
        "use device='cpu' or 'auto'"
    )


def array_module(device: str) -> ModuleType:
    """The array module for a resolved device: ``numpy`` for ``"cpu"``, ``cupy`` for ``"cuda"``."""
    if device == "cpu":
        return np
    cupy = _cupy_or_none()
    if cupy is None:
        raise ValueError("CuPy with a CUDA GPU is not available")
    return cupy


def import_cupy() -> ModuleType:
    """CuPy, imported when the GPU path first needs it (never by the CPU path)."""
    import cupy  # noqa: PLC0415 - optional dependency, imported only on request

    return cupy


@functools.cache
def side_stream(cp: ModuleType, device_id: int, purpose: str) -> Any:
    """A non-blocking stream of the device kept for one ``purpose`` (captures, copies): the
    legacy default stream neither waits for it nor makes it wait, so whatever must be ordered
    against other streams is ordered by events."""
    with cp.cuda.Device(device_id):
        return cp.cuda.Stream(non_blocking=True)


def is_device_array(value: Any) -> bool:
    """Whether ``value`` is a GPU array (CuPy's, or any with the CUDA array interface), which
    must be copied to the host with ``get``; a pandas object has a ``get`` of another kind."""
    return hasattr(value, "__cuda_array_interface__")


def to_numpy(array: Any) -> np.ndarray:
    """A host (NumPy) copy of an array from either module."""
    if isinstance(array, np.ndarray):
        return array
    return array.get()


def copy_to_host(array: Any, out: np.ndarray) -> None:
    """Copy an array of either module into the host array ``out`` of the same shape, with no
    host copy in between (byte order converted where ``out``'s differs)."""
    if isinstance(array, np.ndarray):
        np.copyto(out, array)
    else:
        array.get(out=out)
