"""Gating of short calls on the CPU from a 16-bit copy of the normals.

A call of a few rows reads every normal for a few multiply-adds each: one MNIST example reads
32 MB of float32 normals (10,280 hyperplanes of 784 inputs), so its gating is bound by memory,
not by arithmetic. Such calls read a copy of the normals in half the bytes instead: each
normal as int16 values times a power of two of its own (``Int16Normals``). The products run in
a Numba kernel on the layer pass's threads, not on BLAS, whose threads keep spinning after a
product and take the cores from the layer pass that follows.

The copy is not the normals: ``v16 = v - r`` with a residual ``r`` whose norm is known per
hyperplane. That norm widens the margin within which a float32 decision cannot be trusted
(``Int16Normals``), and those margins are re-checked in float64 against the float32 normals,
as every decision in ``gln.gating`` is. So the contexts are exactly
``gln.gating.halfspace_contexts``, bit for bit, whatever the call size.

A short call's gating is one compiled pass over the neurons (``int16_layer_contexts``): the
products of a neuron's hyperplanes, their decisions and re-checks, and its context index
written straight into its layer's array. The array code's dozen NumPy calls on a few rows
(product, subtraction, tolerances, comparisons, ``nonzero``, folding the bits, one copy per
layer) cost more than the arithmetic of a small network's gating.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numba
import numpy as np

from gln.gating import dot_rounding_bound, halfspace_contexts, split_by_layer
from gln.kernels.cpu import cpu_exact_dots, exact_dot, threaded_kernel

_INT16_MAX = 32767
# Below float32's largest value (3.4e38), whatever the rounding of the partial sums.
_NO_OVERFLOW = 1e38


class Int16Normals(NamedTuple):
    """Normals (P, d) as ``values * scales[:, None]``, within ``residual_norms`` of float32.

    The tolerance of a margin: beyond ``2 (gamma_d ||z|| ||v16|| + ||z|| ||r||)`` the sign of
    ``z . (values * scale) - b`` in float32 (any summation order) is that of the float64
    re-check against the float32 normals, since ``|fl32(z . v16) - z . v| <= gamma_d ||z||
    ||v16|| + ||z|| ||r||`` (Cauchy-Schwarz); doubled, as ``gln.gating.rounding_tolerances``
    is, to cover the subtraction of the offset and the float64 re-check.
    """

    values: np.ndarray  # (P, d) int16
    scales: np.ndarray  # (P,) float32, powers of two, so values * scale is exact in float32
    # (P,) float64: an upper bound of the 2-norm of each normal's v - values * scale.
    residual_norms: np.ndarray
    # (P,) float64: an upper bound of the 2-norm of each values * scale.
    norms: np.ndarray

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self)


def int16_normals(normals: np.ndarray) -> Int16Normals:
    """The 16-bit copy of float32 ``normals`` (P, d): each row's largest entry near 2^15."""
    count, dim = normals.shape
    copy = Int16Normals(np.empty((count, dim), dtype=np.int16), np.empty(count, np.float32),
                        np.empty(count, np.float64), np.empty(count, np.float64))
    # The float64 sums of squares are each within d ulps; this covers them and the square root.
    slack = 1.0 + 4.0 * (dim + 2) * 2.0**-53
    _quantize(count * dim, np.ascontiguousarray(normals, dtype=np.float32), slack, *copy)
    return copy


@threaded_kernel(nogil=True, cache=True)
def _quantize(normals, slack, values, scales, residual_norms, norms):
    for p in numba.prange(normals.shape[0]):
        row = normals[p]
        largest = 0.0
        for v in row:
            largest = max(largest, abs(np.float64(v)))
        # The smallest power of two that keeps every |v / scale| <= 32767 (1 for a zero row).
        scale = 1.0
        if largest > 0.0:
            scale = 2.0 ** np.ceil(np.log2(largest / _INT16_MAX))
            while largest / scale > _INT16_MAX:  # log2's rounding, at an exact power
                scale *= 2.0
        residual = 0.0
        norm = 0.0
        for i in range(row.shape[0]):
            v = np.float64(row[i])
            q = np.rint(v / scale)  # v / scale is exact: a power of two
            values[p, i] = np.int16(q)
            rebuilt = q * scale  # exact: 16 bits times a power of two
            residual += (v - rebuilt) * (v - rebuilt)  # v - rebuilt is exact in float64
            norm += rebuilt * rebuilt
        scales[p] = np.float32(scale)
        residual_norms[p] = np.sqrt(residual) * slack
        norms[p] = np.sqrt(norm) * slack


@numba.njit(nogil=True, fastmath={"reassoc", "contract", "nsz", "arcp"})
def _plane_products(z, values, scales, first, last, products):
    # The products of planes first..last-1, one call per neuron: not inlined into the
    # decisions, which must not be reordered, so that its fast-math flags stay its own, and a
    # call passes every array's shape and strides. A normal's 16-bit row is read from memory
    # once and widened once per four rows of z, which share it (four accumulators), so a few
    # rows cost about one row's memory traffic. The sum's order does not matter: the
    # tolerance holds for any order.
    n, d = z.shape
    for p in range(first, last):
        scale = scales[p]
        t = 0
        while t + 4 <= n:
            a0 = np.float32(0.0)
            a1 = np.float32(0.0)
            a2 = np.float32(0.0)
            a3 = np.float32(0.0)
            for i in range(d):
                v = np.float32(values[p, i]) * scale
                a0 += z[t, i] * v
                a1 += z[t + 1, i] * v
                a2 += z[t + 2, i] * v
                a3 += z[t + 3, i] * v
            products[p, t] = a0
            products[p, t + 1] = a1
            products[p, t + 2] = a2
            products[p, t + 3] = a3
            t += 4
        while t < n:
            acc = np.float32(0.0)
            for i in range(d):
                acc += z[t, i] * (np.float32(values[p, i]) * scale)
            products[p, t] = acc
            t += 1


# No fastmath: each margin is float32 ``product - offset`` and compared as the array code does.
@threaded_kernel(nogil=True, cache=True)
def _int16_contexts(z, values, scales, residual_norms, norms, normals, offsets, gamma,
                    context_dim, layout, contexts):
    n, d = z.shape
    row_norms = np.empty(n)
    largest = 0.0
    for t in range(n):
        total = 0.0
        for i in range(d):
            v = np.float64(z[t, i])
            total += v * v
            largest = max(largest, abs(v))
        row_norms[t] = np.sqrt(total)
    if largest * _INT16_MAX * d >= _NO_OVERFLOW:
        return False
    products = np.empty((values.shape[0], n), dtype=np.float32)
    for neuron in numba.prange(values.shape[0] // context_dim):
        first = neuron * context_dim
        _plane_products(z, values, scales, first, first + context_dim, products)
        out = layout[0, neuron] * n + layout[1, neuron]
        for t in range(n):
            index = np.int32(0)
            for j in range(context_dim):
                p = first + j
                margin = products[p, t] - offsets[p]
                above = margin >= 0
                # Int16Normals' bound: beyond it, the sign is that of the float64 re-check.
                tolerance = 2.0 * row_norms[t] * (gamma * norms[p] + residual_norms[p]) + 1e-30
                if abs(margin) <= tolerance:  # decided in float64, as gln.gating does
                    above = exact_dot(z[t], normals[p]) >= np.float64(offsets[p])
                index |= np.int32(above) << j
            contexts[out + t * layout[2, neuron]] = index
    return True


def context_layout(num_glns: int, layer_sizes: Sequence[int]) -> np.ndarray:
    """Where each neuron's contexts go when every layer's (n, G, K_l) array is a piece of one
    flat buffer, layer after layer: (3, G * sum K) int64, for neuron q (GLN by GLN, layer by
    layer) the start of its layer's piece per row of the call, its place in a row of that
    piece, and the length of such a row (t's index is ``start * n + place + t * length``)."""
    layout = np.empty((3, num_glns, sum(layer_sizes)), dtype=np.int64)
    first = 0
    for size in layer_sizes:
        neurons = slice(first, first + size)
        layout[0, :, neurons] = num_glns * first
        layout[1, :, neurons] = np.arange(num_glns * size).reshape(num_glns, size)
        layout[2, :, neurons] = num_glns * size
        first += size
    return layout.reshape(3, -1)


def int16_layer_contexts(
    z: np.ndarray, normals: np.ndarray, offsets: np.ndarray, context_dim: int,
    num_glns: int, layer_sizes: Sequence[int], normals16: Int16Normals, layout: np.ndarray,
) -> list[np.ndarray]:
    """``gln.gating.layer_contexts`` with the products from ``normals16``, the 16-bit copy of
    ``normals``, in one compiled pass over the neurons (``layout``: ``context_layout``): the
    products, every decision (the close ones re-checked in float64 against ``normals``
    themselves), the context indices, and each layer's (n, G, K_l) array.

    The kernel may multiply a row by the int16 values before their scale (the order of the
    factors is free under its fast-math flags), so rows large enough for that to overflow
    float32 take the float32 normals instead.
    """
    z = np.ascontiguousarray(z, dtype=np.float32)
    n, d = z.shape
    contexts = np.empty(n * layout.shape[1], dtype=np.int32)
    if not _int16_contexts(n * normals.shape[0] * d, z, *normals16, normals, offsets,
                           dot_rounding_bound(d), context_dim, layout, contexts):
        indices = halfspace_contexts(np, z, normals, offsets, context_dim, dots=cpu_exact_dots)
        return split_by_layer(np, indices, num_glns, layer_sizes)
    layers, first = [], 0
    for size in layer_sizes:
        piece = n * num_glns * size
        layers.append(contexts[first:first + piece].reshape(n, num_glns, size))
        first += piece
    return layers
