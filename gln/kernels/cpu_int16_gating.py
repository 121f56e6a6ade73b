"""Gating of short calls on the CPU from a 16-bit copy of the normals.

A call of a few rows reads every normal for a few multiply-adds each: one MNIST example reads
32 MB of float32 normals (10,280 hyperplanes of 784 inputs), so its gating is bound by memory,
not by arithmetic. Such calls read a copy of the normals in half the bytes instead: each
normal as int16 values times a power of two of its own (``Int16Normals``). The products run in
a Numba kernel on the layer pass's threads, not on BLAS, whose threads keep spinning after a
product and take the cores from the layer pass that follows.

The copy is not the normals: ``v16 = v - r`` with a residual ``r`` whose norm is known per
hyperplane. That norm widens the margin within which a float32 decision cannot be trusted
(``Int16Normals.tolerances``), and those margins are re-checked in float64 against the float32
normals, as every decision in ``gln.gating`` is. So the contexts are exactly
``gln.gating.halfspace_contexts``, bit for bit, whatever the call size.
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

from gln.gating import dot_rounding_bound, halfspace_contexts, row_norms
from gln.kernels.cpu import cpu_exact_dots, threaded_kernel

_INT16_MAX = 32767
# Below float32's largest value (3.4e38), whatever the rounding of the partial sums.
_NO_OVERFLOW = 1e38


class Int16Normals(NamedTuple):
    """Normals (P, d) as ``values * scales[:, None]``, within ``residual_norms`` of float32."""

    values: np.ndarray  # (P, d) int16
    scales: np.ndarray  # (P,) float32, powers of two, so values * scale is exact in float32
    # (P,) float64: an upper bound of the 2-norm of each normal's v - values * scale.
    residual_norms: np.ndarray
    # (P,) float64: an upper bound of the 2-norm of each values * scale.
    norms: np.ndarray

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self)

    def tolerances(self, z: np.ndarray) -> np.ndarray:
        """(n, P) margins beyond which the sign of ``z . (values * scale) - b`` in float32 (any
        summation order) is that of the float64 re-check against the float32 normals.

        ``|fl32(z . v16) - z . v| <= gamma_d ||z|| ||v16|| + ||z|| ||r||`` (Cauchy-Schwarz);
        doubled, as ``gln.gating.rounding_tolerances`` is, to cover the subtraction of the
        offset and the float64 re-check.
        """
        per_norm = dot_rounding_bound(z.shape[1]) * self.norms + self.residual_norms
        return 2.0 * row_norms(np, z)[:, None] * per_norm[None, :] + 1e-30


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


@threaded_kernel(nogil=True, cache=True, fastmath={"reassoc", "contract", "nsz", "arcp"})
def _int16_products(z, values, scales, out):
    # Hyperplane-major: a normal's 16-bit row is read from memory once and widened once per
    # four rows of z, which share it (four accumulators), so a few rows cost about one row's
    # memory traffic. The sum's order does not matter: the tolerance holds for any order.
    n, d = z.shape
    for p in numba.prange(values.shape[0]):
        row = values[p]
        scale = scales[p]
        t = 0
        while t + 4 <= n:
            a0 = np.float32(0.0)
            a1 = np.float32(0.0)
            a2 = np.float32(0.0)
            a3 = np.float32(0.0)
            for i in range(d):
                v = np.float32(row[i]) * scale
                a0 += z[t, i] * v
                a1 += z[t + 1, i] * v
                a2 += z[t + 2, i] * v
                a3 += z[t + 3, i] * v
            out[t, p] = a0
            out[t + 1, p] = a1
            out[t + 2, p] = a2
            out[t + 3, p] = a3
            t += 4
        while t < n:
            acc = np.float32(0.0)
            for i in range(d):
                acc += z[t, i] * (np.float32(row[i]) * scale)
            out[t, p] = acc
            t += 1


def int16_products(z: np.ndarray, normals16: Int16Normals) -> np.ndarray:
    """``z @ (values * scales).T`` in float32, (n, P), on the kernel threads."""
    n, d = z.shape
    out = np.empty((n, normals16.values.shape[0]), dtype=np.float32)
    _int16_products(n * normals16.values.shape[0] * d, np.ascontiguousarray(z, dtype=np.float32),
                    normals16.values, normals16.scales, out)
    return out


def int16_halfspace_contexts(
    z: np.ndarray, normals: np.ndarray, offsets: np.ndarray, context_dim: int,
    normals16: Int16Normals,
) -> np.ndarray:
    """``gln.gating.halfspace_contexts`` with the products from ``normals16``, the 16-bit copy
    of ``normals``; the re-checks read ``normals`` themselves.

    The kernel may multiply a row by the int16 values before their scale (the order of the
    factors is free under its fast-math flags), so rows large enough for that to overflow
    float32 take the float32 normals instead.
    """
    if z.size and float(np.abs(z).max()) * _INT16_MAX * z.shape[1] >= _NO_OVERFLOW:
        return halfspace_contexts(np, z, normals, offsets, context_dim, dots=cpu_exact_dots)
    return halfspace_contexts(
        np, z, normals, offsets, context_dim, dots=cpu_exact_dots,
        products=lambda rows, _: int16_products(rows, normals16),
        tolerances=normals16.tolerances,
    )
