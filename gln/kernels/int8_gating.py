"""The gating products of a long chunk from int8 slices on integer tensor cores.

``gln.kernels.cuda.GATING_PRODUCT = "int8"`` replaces the float32 GEMM and its rounding bound:
each row of z and each hyperplane normal is cut into ``SLICES`` int8 slices
(``gln_int8_slices`` in ``gating.cu``, which says how), cuBLAS sums the slices' products of
each order in int32 (exactly: integer tensor cores round nothing), and
``gln_int8_row_tolerances`` makes a per-row bound of the error of their float32 estimate,
proved from the slices' norms. ``gln_int8_contexts``, the contexts kernel of the float32
products, then decides on each estimate as it makes it from the orders' sums, and on that
bound: a margin beyond the bound has the exact sign, the rest are re-checked in float64, so the
contexts are the same bits either way.

Three int8 GEMMs (three slices, one GEMM per order, the order's slice pairs side by side along
the summed dimension, so each int32 result is written once and never read back to be added to)
in place of one float32 GEMM: on an H100 the int8 rate is many times the float32 one, and the
bound is tighter than float32's (``tests/support/int8_gating.py`` is the array code the kernels
are tested against). The default for chunks of at least ``INT8_GATING_MIN_ROWS`` rows: on an
H200 it halved a 4,096-row chunk's gating time and re-checked a tenth as many margins.

A model's hyperplanes never change (a restore brings other arrays), so their slices and the
largest factors every row's bound takes (``Int8Planes``) are cut once and kept by the model's
``Int8PlanesCache``: a long chunk then cuts only its rows, two launches and six allocations
fewer on the host and the planes' pass over memory (32 MB for MNIST's 10,280 planes) fewer on
the device, for about 25 MB kept beside MNIST's 75 MB of weights.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from gln.backend import import_cupy as _cupy
from gln.kernels.cuda_modules import GATING_THREADS, WARP, function

SLICES = 3  # GLN_INT8_SLICES in gating.cu
# Warps that share the planes' largest factors (gln_int8_plane_terms), each leaving partial
# maxima that every row's tolerance takes the maxima of; a multiple of GATING_THREADS / WARP.
PLANE_TERM_WARPS = 64
# cuBLAS's and CUDA's enumerations (stable values of their C headers): operations, data types,
# the int32 compute type, the default algorithm.
_OP_N, _OP_T, _R_8I, _R_32I, _COMPUTE_32I, _GEMM_DEFAULT = 0, 1, 3, 10, 72, -1
_ONE, _ZERO = np.ones(1, np.int32), np.zeros(1, np.int32)  # alpha and beta, on the host


@dataclass(frozen=True)
class Int8Slices:
    """Rows cut by ``gln_int8_slices``: the slices side by side, (rows, K * stride) int8
    (slice k at columns ``k * stride`` on, or ``(K - 1 - k) * stride`` on for ``reversed``
    rows), and per row its scale, each slice's norm (K, rows), the L1 norm of the slices' sum
    and ``||x||_2``."""

    slices: Any
    scale: Any
    norms: Any
    kept_l1: Any
    length: Any


@dataclass(frozen=True)
class Int8Products:
    """The gating products ``z @ normals.T`` (n, P) as the three orders' int32 sums and the
    rows' and planes' scales, of which ``gln_int8_contexts`` makes each float32 estimate where
    it reads it (``contexts_kernel`` and ``contexts_arguments`` say how to launch it), or
    ``as_float32`` all of them at once (checks and benchmarks)."""

    orders: tuple[Any, Any, Any]
    row_scale: Any
    plane_scale: Any

    contexts_kernel = "gln_int8_contexts"

    @property
    def contexts_arguments(self) -> tuple[Any, ...]:
        return (*self.orders, self.row_scale, self.plane_scale)

    def as_float32(self) -> Any:
        """Every estimate, (n, P) float32: the values ``gln_int8_contexts`` decides on."""
        cp = _cupy()
        n, planes = self.orders[0].shape
        products = cp.empty((n, planes), dtype=cp.float32)
        _kernel("gln_int8_estimates")(
            (-(-n * planes // GATING_THREADS),), (GATING_THREADS,),
            (*self.contexts_arguments, np.int32(n), np.int32(planes), products))
        return products


@dataclass(frozen=True)
class Int8Planes:
    """Hyperplanes cut for ``int8_products``: their slices (the last first, ``reversed``), the
    slices' columns a slice (``stride``), and the partial maxima of the planes' factors that
    every row's bound takes (``gln_int8_plane_terms``)."""

    cut: Int8Slices
    stride: int
    terms: Any

    @property
    def nbytes(self) -> int:
        cut = self.cut
        return int(sum(a.nbytes for a in (cut.slices, cut.scale, cut.norms, cut.kept_l1,
                                          cut.length, self.terms)))


def int8_planes(normals: Any, offsets: Any) -> Int8Planes:
    """``normals`` (P, d) float32 and their ``offsets`` (P,) cut for ``int8_products``."""
    cp = _cupy()
    planes, d = normals.shape
    stride = -(-d // 16) * 16  # lengths of 4 for the tensor cores, 16-byte aligned slices
    cut = sliced(normals, stride, reversed=True)
    terms = cp.empty((PLANE_TERM_WARPS, SLICES + 3), dtype=cp.float64)  # partial maxima
    _kernel("gln_int8_plane_terms")(
        (PLANE_TERM_WARPS * WARP // GATING_THREADS,), (GATING_THREADS,),
        (cut.scale, cut.norms, cut.kept_l1, offsets, np.int32(planes), terms))
    return Int8Planes(cut, stride, terms)


class Int8PlanesCache:
    """One model's ``Int8Planes``, cut on its first long chunk and again whenever its normals or
    offsets are other arrays (a restore)."""

    def __init__(self) -> None:
        # (weak references to the normals and offsets they were cut from, the cut): replaced
        # in one assignment, so threads that call at once see one triple or the other.
        self._cut: tuple[weakref.ref, weakref.ref, Int8Planes] | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of the cut (0 until a long chunk makes it)."""
        return self._cut[2].nbytes if self._cut else 0

    def planes(self, normals: Any, offsets: Any) -> Int8Planes:
        """``int8_planes(normals, offsets)`` (as contiguous float32), cut again only for other
        arrays than last time."""
        cut = self._cut
        if cut is None or cut[0]() is not normals or cut[1]() is not offsets:
            cp = _cupy()
            planes = int8_planes(cp.ascontiguousarray(normals, dtype=cp.float32),
                                 cp.ascontiguousarray(offsets, dtype=cp.float32))
            cut = (weakref.ref(normals), weakref.ref(offsets), planes)
            self._cut = cut
        return cut[2]


def int8_products(
    z: Any, normals: Any, offsets: Any, pending_count: Any = None,
    planes: Int8Planes | None = None,
) -> tuple[Int8Products, Any]:
    """The products of ``z @ normals.T`` (n, P) from int8 slices, and each row's bound of their
    float32 estimates' margins' error (n,), for ``gln_int8_contexts``; ``pending_count`` (a
    ``RecheckList``'s count) zeroed when given. ``planes``: ``normals`` and ``offsets``
    already cut (``int8_planes``), else they are cut here."""
    cp = _cupy()
    n, d = z.shape
    plane = planes if planes is not None else int8_planes(normals, offsets)
    stride = plane.stride
    rows = sliced(z, stride)
    tolerance = cp.empty(n, dtype=cp.float32)
    _kernel("gln_int8_row_tolerances")(
        (-(-n // GATING_THREADS),), (GATING_THREADS,),
        (rows.scale, rows.norms, rows.kept_l1, rows.length, plane.terms,
         np.int32(PLANE_TERM_WARPS), np.int32(n), np.int32(d), tolerance, pending_count))
    orders = tuple(cp.empty((n, normals.shape[0]), dtype=cp.int32) for _ in range(SLICES))
    for order, out in enumerate(orders):
        # A_0 .. A_order against B_order .. B_0: the rows' first slices, the planes' last.
        width = (order + 1) * stride
        int8_product(rows.slices[:, :width], plane.cut.slices[:, SLICES * stride - width:],
                     out, accumulate=False)
    return Int8Products(orders, rows.scale, plane.cut.scale), tolerance


def sliced(x: Any, stride: int, reversed: bool = False) -> Int8Slices:
    """``x`` (rows, d) float32 cut into ``SLICES`` int8 slices of ``stride`` columns, side by
    side, the last slice first where ``reversed``."""
    cp = _cupy()
    rows, d = x.shape
    cut = Int8Slices(cp.empty((rows, SLICES * stride), dtype=cp.int8),
                     cp.empty(rows, dtype=cp.float64), cp.empty((SLICES, rows), cp.float64),
                     cp.empty(rows, dtype=cp.float64), cp.empty(rows, dtype=cp.float64))
    _kernel("gln_int8_slices")(
        (-(-rows * WARP // GATING_THREADS),), (GATING_THREADS,),
        (x, np.int32(rows), np.int32(d), np.int32(stride), np.int32(reversed), cut.slices,
         cut.scale, cut.norms, cut.kept_l1, cut.length))
    return cut


def int8_product(a: Any, b: Any, out: Any, accumulate: bool) -> None:
    """``a @ b.T`` of int8 (n, k) and (P, k) into int32 ``out`` (n, P), or added to it:
    cuBLAS's ``gemmEx`` with int32 sums. The row-major ``a @ b.T`` is the column-major
    (P, n) ``b @ a.T``, ``b`` transposed and ``a`` not (the "TN" layout integer tensor cores
    take). ``a`` and ``b`` may be column ranges of wider arrays: each is read from its first
    element with its rows' stride as the leading dimension."""
    cp = _cupy()
    (n, k), planes = a.shape, b.shape[0]
    if k % 4:
        raise ValueError(f"int8 tensor cores need the length ({k}) a multiple of 4")
    if a.strides[1] != 1 or b.strides[1] != 1 or not out.flags.c_contiguous:
        raise ValueError("int8_product reads rows of contiguous columns into a contiguous out")
    lda, ldb = a.strides[0], b.strides[0]  # int8: a stride in bytes is one in elements
    beta = _ONE if accumulate else _ZERO
    cp.cuda.cublas.gemmEx(cp.cuda.device.get_cublas_handle(), _OP_T, _OP_N, planes, n, k,
                          _ONE.ctypes.data, b.data.ptr, _R_8I, ldb, a.data.ptr, _R_8I, lda,
                          beta.ctypes.data, out.data.ptr, _R_32I, planes, _COMPUTE_32I,
                          _GEMM_DEFAULT)


def _kernel(name: str) -> Any:
    return function("gating.cu", name)
