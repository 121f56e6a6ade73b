"""Compile the CPU kernels into Numba's cache ahead of time.

Numba compiles each kernel at its first call and keeps the machine code in its cache
(``NUMBA_CACHE_DIR``, else beside the sources). A process that finds the cache empty spends
about 4 s compiling on its first model (2 vCPUs): in a service, inside the first create or
restore, before ``/readyz``. A container whose cache lives in the container starts empty every
time, so the images run this while they are built:

    NUMBA_CACHE_DIR=/var/cache/gln/numba python -m gln.precompile

A kernel that has a one-thread twin (``gln.kernels.cpu.ThreadedKernel``) runs one or the other
by the size of a call; each twin is compiled for every signature either was called with, so a
model of another size finds both in the cache.

Numba keys cached code by the CPU it was compiled for: an image built on one CPU model and run
on another compiles again at its first call (and caches that, where the directory is
writable), as it would have without this.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from gln.family import GLNFamily
from gln.kernels import cpu, cpu_family, cpu_gating, cpu_int16_gating, cpu_scaling
from gln.model import GLN

KERNEL_MODULES = (cpu, cpu_family, cpu_gating, cpu_int16_gating, cpu_scaling)


def compiled_kernels() -> dict[str, int]:
    """Every Numba kernel of the CPU path, by qualified name, with how many signatures it has
    been compiled (or loaded from the cache) for in this process."""
    return {
        f"{kernel.py_func.__module__}.{kernel.py_func.__qualname__}": len(kernel.signatures)
        for kernel in cached_kernels()
    }


def cached_kernels() -> list:
    """The Numba dispatchers of the CPU path whose machine code Numba caches (both twins of
    each ``ThreadedKernel``)."""
    return [
        kernel
        for value in _kernel_module_values()
        for kernel in (value.dispatchers if isinstance(value, cpu.ThreadedKernel) else (value,))
        if getattr(getattr(kernel, "stats", None), "cache_path", None)
    ]


def _threaded_kernels() -> list[cpu.ThreadedKernel]:
    return [value for value in _kernel_module_values() if isinstance(value, cpu.ThreadedKernel)]


def _kernel_module_values() -> list:
    """What the kernel modules define or import, each object once (a kernel one module imports
    from another is in both)."""
    return list({id(value): value for module in KERNEL_MODULES
                 for value in vars(module).values()}.values())


def compile_cpu_kernels() -> dict[str, int]:
    """Call every cached CPU kernel with the argument types the library gives it, so that each
    is compiled (or loaded) and saved in the cache; ``compiled_kernels()`` afterwards."""
    model = GLN(num_features=8, num_classes=3, layer_sizes=(4, 2, 1), context_dim=2, seed=0)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(cpu_gating.INT16_MAX_ROWS + 8, 8)).astype(np.float32)
    y = rng.integers(0, 3, len(X))
    model.learn(X[:1], y[:1])  # a short call: the 16-bit copy of the normals
    model.learn(X, y)  # a long call: the float32 product, decided in one pass
    model.predict_proba(X[:1])
    model.predict_proba(X)
    family = GLNFamily(2, **model.config)  # the family's kernels (a server's many tenants)
    members = np.arange(len(X)) % 2
    family.learn(X, y, members)
    family.predict_proba(X[:2], members[:2])
    # The re-checks of close margins of a short call whose rows are too large for the 16-bit
    # products (which data meets rarely), with the index arrays np.nonzero gives them:
    # contiguous for one margin, strided views for several.
    for close in (np.ones((1, 1), dtype=bool), np.ones((2, 2), dtype=bool)):
        cpu.cpu_exact_dots(X, model.normals, *np.nonzero(close))
    for kernel in _threaded_kernels():  # what a call of the other size would run
        signatures = {sig for twin in kernel.dispatchers for sig in twin.signatures}
        for twin in kernel.dispatchers:
            for signature in signatures - set(twin.signatures):
                twin.compile(signature)
    return compiled_kernels()


def main() -> None:
    """Print which kernels are in the cache now, as one JSON line."""
    start = time.perf_counter()
    kernels = compile_cpu_kernels()
    json.dump({"kernels": kernels, "seconds": round(time.perf_counter() - start, 2)},
              sys.stdout)
    print()


if __name__ == "__main__":
    main()
