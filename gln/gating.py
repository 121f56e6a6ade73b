"""Halfspace gating: random hyperplanes and the m-bit context signature of each neuron.

Paper, section "Random halfspace sampling": a normal is an i.i.d. N(0, 1) vector divided by its
2-norm (uniform on the unit sphere), the offset is N(0, 1) (``offset_scale`` scales it; DeepMind's
implementation uses 0.05). A neuron's context is the m-bit signature
``c(z) = sum_j [z . v_j >= b_j] 2^j`` over its m hyperplanes.

Contexts depend only on the side information, never on the weights, so a whole chunk of
examples is gated by one matrix product. That product runs in float32 for speed; because BLAS
may round differently for different chunk sizes, every comparison that the float32 rounding
bound cannot settle is redone in float64 (a few per example). The decisions are therefore the
same whether a row is gated alone or in a chunk, which keeps ``learn`` exactly sequential.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

_FLOAT32_UNIT_ROUNDOFF = 2.0**-24


def sample_halfspaces(
    rng: np.random.Generator, count: int, dim: int, offset_scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """``count`` hyperplanes in ``dim`` dimensions: unit normals (count, dim), offsets (count,)."""
    normals = rng.standard_normal((count, dim))
    normals /= np.linalg.norm(normals, axis=1, keepdims=True)
    offsets = rng.standard_normal(count) * offset_scale
    return normals.astype(np.float32), offsets.astype(np.float32)


def rounding_tolerances(xp: ModuleType, z: Any) -> Any:
    """Per row, a margin beyond which a float32 ``z . v - b`` has the sign of the exact value.

    Rounding bound of a float32 dot product of length d in any summation order:
    ``|error| <= gamma_d * sum_i |z_i v_i| <= gamma_d * ||z||_2`` for unit normals; doubled to
    cover the subtraction of the offset and the float64 re-check. Returns (n,) float32.
    """
    dim = z.shape[1]
    gamma = dim * _FLOAT32_UNIT_ROUNDOFF / (1.0 - dim * _FLOAT32_UNIT_ROUNDOFF)
    z64 = z.astype(xp.float64)
    return (2.0 * gamma * xp.sqrt((z64 * z64).sum(axis=1)) + 1e-30).astype(xp.float32)


def exact_dots(xp: ModuleType, z: Any, normals: Any, rows: Any, planes: Any) -> Any:
    """``z[rows[k]] . normals[planes[k]]`` in float64 for each k (the plain-array version)."""
    return (z[rows].astype(xp.float64) * normals[planes].astype(xp.float64)).sum(axis=1)


def halfspace_bits(
    xp: ModuleType, z: Any, normals: Any, offsets: Any, dots: Callable[..., Any] | None = None
) -> Any:
    """``[z_t . v_p >= b_p]`` for every row t and hyperplane p, decided exactly: (n, P) bool.

    ``dots(z, normals, rows, planes)`` computes the float64 re-checks (default: ``exact_dots``).
    """
    margin = z @ normals.T
    margin -= offsets
    bits = margin >= 0
    tolerance = rounding_tolerances(xp, z)
    xp.abs(margin, out=margin)
    rows, planes = xp.nonzero(margin <= tolerance[:, None])
    if rows.size:
        exact = dots(z, normals, rows, planes) if dots else exact_dots(xp, z, normals, rows, planes)
        bits[rows, planes] = exact >= offsets[planes].astype(xp.float64)
    return bits


def halfspace_contexts(
    xp: ModuleType, z: Any, normals: Any, offsets: Any, context_dim: int,
    dots: Callable[..., Any] | None = None,
) -> Any:
    """Every neuron's context index for every row: (n, P / m) int32."""
    return context_indices(xp, halfspace_bits(xp, z, normals, offsets, dots), context_dim)


def context_indices(xp: ModuleType, bits: Any, context_dim: int) -> Any:
    """Fold groups of ``context_dim`` consecutive bits (..., K * m) into indices (..., K)."""
    grouped = bits.reshape(*bits.shape[:-1], -1, context_dim)
    indices = grouped[..., 0].astype(xp.int32)
    for j in range(1, context_dim):
        indices |= grouped[..., j].astype(xp.int32) << j
    return indices
