"""Halfspace gating: random hyperplanes and the m-bit context signature of each neuron.

Paper, section "Random halfspace sampling": a normal is an i.i.d. N(0, 1) vector divided by its
2-norm (uniform on the unit sphere), the offset is N(0, 1) (``offset_scale`` scales it; DeepMind's
implementation uses 0.05). A neuron's context is the m-bit signature
``c(z) = sum_j [z . v_j >= b_j] 2^j`` over its m hyperplanes.

For images, ``restrict_to_windows`` keeps each normal on a random square window of the image
(``GLN(gating_window=...)``): a departure from the paper's sphere-wide normals that makes each
hyperplane test a local part of the image (measured better on MNIST, docs/benchmarks.md).

Contexts depend only on the side information, never on the weights, so a whole chunk of
examples is gated by one matrix product. That product runs in float32 for speed; because BLAS
may round differently for different chunk sizes, every comparison that the float32 rounding
bound cannot settle is redone in float64 (a few per example). The decisions are therefore the
same whether a row is gated alone or in a chunk, which keeps ``learn`` exactly sequential.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


def restrict_to_windows(
    rng: np.random.Generator, normals: np.ndarray, image_shape: tuple[int, int], window: int
) -> np.ndarray:
    """Each normal kept on a random ``window`` x ``window`` square of the image, renormalised.

    The square's corner is uniform over the positions that keep it inside the image; inside it
    the normal's entries stay i.i.d. N(0, 1) before the division, so it is uniform on the unit
    sphere of the square's pixels. The hyperplane then tests a local part of the image.
    """
    height, width = image_shape
    count = normals.shape[0]
    tops = rng.integers(0, height - window + 1, count)
    lefts = rng.integers(0, width - window + 1, count)
    rows = np.arange(height)[None, :, None]
    cols = np.arange(width)[None, None, :]
    inside = ((rows >= tops[:, None, None]) & (rows < tops[:, None, None] + window)
              & (cols >= lefts[:, None, None]) & (cols < lefts[:, None, None] + window))
    kept = normals.astype(np.float64) * inside.reshape(count, height * width)
    kept /= np.linalg.norm(kept, axis=1, keepdims=True)
    return kept.astype(np.float32)


def rounding_tolerances(xp: ModuleType, z: Any) -> Any:
    """Per row, a margin beyond which a float32 ``z . v - b`` has the sign of the exact value.

    Rounding bound of a float32 dot product of length d in any summation order:
    ``|error| <= gamma_d * sum_i |z_i v_i| <= gamma_d * ||z||_2`` for unit normals; doubled to
    cover the subtraction of the offset and the float64 re-check. Returns (n,) float32.
    """
    return (2.0 * dot_rounding_bound(z.shape[1]) * row_norms(xp, z) + 1e-30).astype(xp.float32)


def row_norms(xp: ModuleType, z: Any) -> Any:
    """Each row's 2-norm, summed in float64: (n,) float64."""
    z64 = z.astype(xp.float64)
    return xp.sqrt((z64 * z64).sum(axis=1))


def dot_rounding_bound(dim: int) -> float:
    """gamma_d: the relative rounding error bound of a float32 dot product of length d."""
    return dim * _FLOAT32_UNIT_ROUNDOFF / (1.0 - dim * _FLOAT32_UNIT_ROUNDOFF)


def exact_dots(xp: ModuleType, z: Any, normals: Any, rows: Any, planes: Any) -> Any:
    """``z[rows[k]] . normals[planes[k]]`` in float64 for each k (the plain-array version)."""
    return (z[rows].astype(xp.float64) * normals[planes].astype(xp.float64)).sum(axis=1)


def halfspace_bits(
    xp: ModuleType, z: Any, normals: Any, offsets: Any, dots: Callable[..., Any] | None = None,
    products: Callable[..., Any] | None = None, tolerances: Callable[..., Any] | None = None,
) -> Any:
    """``[z_t . v_p >= b_p]`` for every row t and hyperplane p, decided exactly: (n, P) bool.

    ``dots(z, normals, rows, planes)`` computes the float64 re-checks (default: ``exact_dots``);
    ``products(z, normals)`` the float32 ``z @ normals.T`` (a new array; default: that product);
    ``tolerances(z)`` the margins, broadcastable to (n, P), within which the products' signs
    are re-checked (default: ``rounding_tolerances``, which holds for any float32 product).
    """
    margin = products(z, normals) if products else z @ normals.T
    margin -= offsets
    bits = margin >= 0
    tolerance = tolerances(z) if tolerances else rounding_tolerances(xp, z)[:, None]
    xp.abs(margin, out=margin)
    rows, planes = xp.nonzero(margin <= tolerance)
    if rows.size:
        exact = dots(z, normals, rows, planes) if dots else exact_dots(xp, z, normals, rows, planes)
        bits[rows, planes] = exact >= offsets[planes].astype(xp.float64)
    return bits


def halfspace_contexts(
    xp: ModuleType, z: Any, normals: Any, offsets: Any, context_dim: int,
    dots: Callable[..., Any] | None = None, products: Callable[..., Any] | None = None,
    tolerances: Callable[..., Any] | None = None,
) -> Any:
    """Every neuron's context index for every row: (n, P / m) int32."""
    bits = halfspace_bits(xp, z, normals, offsets, dots, products, tolerances)
    return context_indices(xp, bits, context_dim)


def layer_contexts(
    xp: ModuleType, z: Any, normals: Any, offsets: Any, context_dim: int, num_glns: int,
    layer_sizes: Sequence[int], dots: Callable[..., Any] | None = None,
) -> list[Any]:
    """Each layer's context indices, (n, G, K_l) int32 and C-contiguous: the layer pass's input.

    Hyperplanes are ordered GLN by GLN, each GLN's neurons layer by layer, ``context_dim``
    planes per neuron.
    """
    indices = halfspace_contexts(xp, z, normals, offsets, context_dim, dots)
    return split_by_layer(xp, indices, num_glns, layer_sizes)


def split_by_layer(
    xp: ModuleType, indices: Any, num_glns: int, layer_sizes: Sequence[int]
) -> list[Any]:
    """(n, G * sum K) context indices -> one C-contiguous (n, G, K_l) array per layer."""
    indices = indices.reshape(indices.shape[0], num_glns, sum(layer_sizes))
    bounds = np.cumsum([0, *layer_sizes])
    layers = zip(bounds[:-1], bounds[1:], strict=True)
    return [xp.ascontiguousarray(indices[:, :, a:b]) for a, b in layers]


def context_indices(xp: ModuleType, bits: Any, context_dim: int) -> Any:
    """Fold groups of ``context_dim`` consecutive bits (..., K * m) into indices (..., K)."""
    grouped = bits.reshape(*bits.shape[:-1], bits.shape[-1] // context_dim, context_dim)
    indices = grouped[..., 0].astype(xp.int32)
    for j in range(1, context_dim):
        indices |= grouped[..., j].astype(xp.int32) << j
    return indices
