"""The ``cp`` fixture: the tests of the GPU path run on a GPU (marked ``gpu``; skipped where CuPy
or a GPU is missing) and on the emulated device of ``emulated_cupy.py`` (the kernel sources and
the CuPy calls on the CPU; skipped without g++). On a GPU machine: ``pytest -m gpu``.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest

from gln.backend import array_module, resolve_device
from tests.gln.emulated_cupy import GXX, emulated_cupy_installed, forget_compiled_kernels

# CuPy with a GPU, as the library itself finds it, else None.
_GPU = array_module("cuda") if resolve_device("auto") == "cuda" else None


@pytest.fixture(params=[
    pytest.param("gpu", marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(_GPU is None, reason="needs CuPy and a CUDA GPU (pip install '.[gpu]')"),
    ]),
    pytest.param("emulated", marks=pytest.mark.skipif(
        GXX is None, reason="the emulated device needs g++ on PATH")),
])
def cp(request: pytest.FixtureRequest) -> Iterator[ModuleType]:
    """The ``cupy`` the backend imports for this test: the real one, or the emulation."""
    if request.param == "gpu":
        forget_compiled_kernels()
        yield _GPU
        return
    with emulated_cupy_installed() as module:
        yield module
