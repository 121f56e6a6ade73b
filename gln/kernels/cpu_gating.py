"""Halfspace gating on the CPU: a chunk's contexts on every core, without spinning BLAS threads.

A chunk's contexts come from one float32 product, (n x d) rows by (d x P) hyperplanes
(``gln.gating.halfspace_bits``). Left to itself, a threaded BLAS runs that product on every
core and then keeps its threads spinning, waiting for more work; on a machine with few cores
they take the cores from the Numba layer pass that comes next, which then runs at about half
speed. So the hyperplanes are split into one block of whole neurons per thread instead; each
block runs its product on single-threaded BLAS, in a thread of ours (BLAS and the Numba
re-check release the GIL), together with the rest of its decisions: the float64 re-checks and
the folding into context indices. Idle threads of ours wait without spinning.

Every bit is decided exactly whatever the split (the re-checks settle each close margin in
float64), so the contexts, and everything learned from them, are the same bytes.

While a split call runs, BLAS is limited to one thread process-wide (threadpoolctl): other
threads' matrix products then run on one core too, for that long.

Calls of a few rows, whose product is bound by reading the normals, not by arithmetic, take
their products from a 16-bit copy of the normals instead (``gln.kernels.cpu_int16_gating``).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import numba
import numpy as np

from gln.gating import rounding_tolerances, split_by_layer
from gln.kernels.cpu import exact_dot
from gln.kernels.cpu_int16_gating import (
    Int16Normals,
    context_layout,
    int16_layer_contexts,
    int16_normals,
)

INT16_MAX_ROWS = 32  # calls up to it, bound by reading the normals, take the 16-bit normals
SPLIT_MIN_WORK = 1_000_000  # multiply-adds below which one thread decides: a hop costs more
# Blocks per split call; None: Numba's thread count (``numba.set_num_threads``).
SPLIT_PARTS: int | None = None


class _SingleThreadedBlas:
    """BLAS held to one thread while any caller is inside; callers may overlap and nest."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._controller: Any = None
        self._limiter: Any = None

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        with self._lock:
            if self._users == 0:
                if self._controller is None:
                    import threadpoolctl  # noqa: PLC0415 - scans the loaded libraries once

                    self._controller = threadpoolctl.ThreadpoolController()
                self._limiter = self._controller.limit(limits=1, user_api="blas")
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    self._limiter.restore_original_limits()
                    self._limiter = None


_BLAS = _SingleThreadedBlas()
_POOL_LOCK = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _POOL_LOCK:
        if _pool is None:
            _pool = ThreadPoolExecutor(max(numba.config.NUMBA_NUM_THREADS - 1, 1),
                                       thread_name_prefix="gln-gating")
        return _pool


def cpu_halfspace_contexts(
    z: np.ndarray, normals: np.ndarray, offsets: np.ndarray, context_dim: int
) -> np.ndarray:
    """``gln.gating.halfspace_contexts`` with the neurons split into ``SPLIT_PARTS`` blocks,
    each on single-threaded BLAS, the first in the calling thread."""
    n, d = z.shape
    neurons = normals.shape[0] // context_dim
    threads = SPLIT_PARTS or numba.get_num_threads()
    parts = min(threads, neurons) if n * normals.shape[0] * d >= SPLIT_MIN_WORK else 1
    if parts <= 1:
        return decided_contexts(z, normals, offsets, context_dim)
    bounds = np.linspace(0, neurons, parts + 1).astype(np.int64)
    contexts = np.empty((n, neurons), dtype=np.int32)

    def decide(first: int, last: int) -> None:
        planes = slice(first * context_dim, last * context_dim)
        contexts[:, first:last] = decided_contexts(
            z, normals[planes], offsets[planes], context_dim
        )

    blocks = list(zip(bounds[:-1], bounds[1:], strict=True))
    with _BLAS.held():
        others = [_executor().submit(decide, a, b) for a, b in blocks[1:]]
        try:
            decide(*blocks[0])
        finally:
            wait(others)
        for block in others:
            block.result()
    return contexts


def decided_contexts(
    z: np.ndarray, normals: np.ndarray, offsets: np.ndarray, context_dim: int
) -> np.ndarray:
    """``gln.gating.halfspace_contexts`` on one thread: the float32 product on BLAS, then every
    decision, re-check and context index in one pass over the margins.

    The array version makes five passes over the (n, P) margins after the product (subtract
    the offsets, sign, absolute value, compare with the tolerance, gather the close ones) and
    folds the bits in four more: for 256 MNIST rows and half the network's hyperplanes, 6.4 ms
    besides the product's 21, against 3 for this pass (1.2 of them the float64 re-checks).
    """
    z = np.ascontiguousarray(z, dtype=np.float32)
    contexts = np.empty((z.shape[0], normals.shape[0] // context_dim), dtype=np.int32)
    _decide(z @ normals.T, offsets, rounding_tolerances(np, z), z, normals, context_dim,
            contexts)
    return contexts


# No fastmath: each margin is float32 ``product - offset`` and compared as the array code does.
@numba.njit(nogil=True, cache=True)
def _decide(products, offsets, tolerances, z, normals, context_dim, contexts):
    for t in range(products.shape[0]):
        margins, tolerance = products[t], tolerances[t]
        for neuron in range(contexts.shape[1]):
            first = neuron * context_dim
            index, close = 0, False
            for j in range(context_dim):  # branch-free: the common case runs straight through
                margin = margins[first + j] - offsets[first + j]
                index |= np.int32(margin >= 0) << j
                close |= abs(margin) <= tolerance
            if close:  # float32 may have rounded a sign: those bits are decided in float64
                for j in range(context_dim):
                    p = first + j
                    if abs(margins[p] - offsets[p]) <= tolerance:
                        above = exact_dot(z[t], normals[p]) >= np.float64(offsets[p])
                        index = (index & ~(1 << j)) | (np.int32(above) << j)
            contexts[t, neuron] = index


class CpuLayerContexts:
    """``gln.gating.layer_contexts`` on the CPU, for one model.

    Calls of at most ``INT16_MAX_ROWS`` rows read a 16-bit copy of the normals, made on the
    first such call and again whenever the model's normals are another array (a restore);
    longer calls split the float32 product over the threads. Both decide every bit exactly.
    """

    def __init__(self) -> None:
        # (a weak reference to the normals it copies, the copy): replaced in one assignment,
        # so threads that call at once see one pair or the other.
        self._copy: tuple[weakref.ref, Int16Normals] | None = None
        # ((num_glns, layer_sizes), their context_layout), likewise.
        self._layout: tuple[tuple[int, tuple[int, ...]], np.ndarray] | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of the 16-bit copy of the normals (0 until a short call makes it)."""
        return self._copy[1].nbytes if self._copy else 0

    def __call__(
        self, z: np.ndarray, normals: np.ndarray, offsets: np.ndarray, context_dim: int,
        num_glns: int, layer_sizes: Sequence[int],
    ) -> list[np.ndarray]:
        if 0 < z.shape[0] <= INT16_MAX_ROWS:
            return int16_layer_contexts(z, normals, offsets, context_dim, num_glns, layer_sizes,
                                        self._normals16(normals),
                                        self._context_layout(num_glns, layer_sizes))
        indices = cpu_halfspace_contexts(z, normals, offsets, context_dim)
        return split_by_layer(np, indices, num_glns, layer_sizes)

    def _context_layout(self, num_glns: int, layer_sizes: Sequence[int]) -> np.ndarray:
        key = (num_glns, tuple(layer_sizes))
        layout = self._layout
        if layout is None or layout[0] != key:
            layout = (key, context_layout(num_glns, layer_sizes))
            self._layout = layout
        return layout[1]

    def _normals16(self, normals: np.ndarray) -> Int16Normals:
        copy = self._copy
        if copy is None or copy[0]() is not normals:
            copy = (weakref.ref(normals), int16_normals(normals))
            self._copy = copy
        return copy[1]
