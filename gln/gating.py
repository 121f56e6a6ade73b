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


def halfspace_bits(xp: ModuleType, z: Any, normals: Any, offsets: Any) -> Any:
    """``[z_t . v_p >= b_p]`` for every row t and hyperplane p, decided exactly: (n, P) bool."""
    margin = z @ normals.T
    margin -= offsets
    bits = margin >= 0
    dim = z.shape[1]
    # Rounding bound of a float32 dot product of length dim in any summation order:
    # |error| <= gamma_dim * sum_i |z_i v_i| <= gamma_dim * ||z||_2 (unit normals).
    gamma = dim * _FLOAT32_UNIT_ROUNDOFF / (1.0 - dim * _FLOAT32_UNIT_ROUNDOFF)
    z64 = z.astype(xp.float64)
    tolerance = (2.0 * gamma * xp.sqrt((z64 * z64).sum(axis=1)) + 1e-30).astype(xp.float32)
    xp.abs(margin, out=margin)
    rows, planes = xp.nonzero(margin <= tolerance[:, None])
    if rows.size:
        exact = (z64[rows] * normals[planes].astype(xp.float64)).sum(axis=1)
        bits[rows, planes] = exact >= offsets[planes].astype(xp.float64)
    return bits


def context_indices(xp: ModuleType, bits: Any, context_dim: int) -> Any:
    """Fold groups of ``context_dim`` consecutive bits (..., K * m) into indices (..., K)."""
    grouped = bits.reshape(*bits.shape[:-1], -1, context_dim)
    indices = grouped[..., 0].astype(xp.int32)
    for j in range(1, context_dim):
        indices |= grouped[..., j].astype(xp.int32) << j
    return indices
