"""The gating product from int8 slices on integer tensor cores, with a bound proved for it.

An int8 product accumulated in int32 is exact, so the only error of a product built from int8
slices is the slicing's, and it can be bounded row by row and plane by plane. Each row of z and
each hyperplane normal v is scaled by a power of two s (so that ``x / s`` is exact and at most
127 in magnitude) and cut into K slices of signed integers:

    x / s = A_0 + A_1 / 128 + ... + A_{K-1} / 128^(K-1) + R / 128^(K-1),   |R| <= 1/2,

``A_0`` in [-127, 127] and the others in [-64, 64]. ``z . v / (s_z s_v)`` is then the sum of
``A_i . B_j / 128^(i+j)`` over all i, j, plus the remainders' terms; the int8 products keep the
pairs with i + j < K, summed per order ``i + j`` in int32 (``128 ** 2 * d`` at most per term
and order, so no overflow below about 40,000 features). The dropped pairs are bounded by
Cauchy-Schwarz on the slices' norms, the remainders by the slices' L1 norms (``bound``), so
that a margin's sign is certain wherever its distance from the offset exceeds the bound, as
with the float32 bound ``2 gamma_d ||z||`` the library uses now.

Array code for NumPy or CuPy (``xp``), the analysis behind ``gln.kernels.int8_gating`` (whose
kernels cut the slices and bound the error per row, as ``sliced`` and ``row_bound`` do here,
which ``tests/gln/test_int8_gating.py`` checks); the int8 product itself is passed in
(``gln.kernels.int8_gating.int8_product`` on CuPy, an integer product on NumPy).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

BASE = 128.0  # one slice's step: 7 bits below the one before
_ROUNDING_MARGIN = 1.0 + 2.0 ** -40  # the float64 arithmetic of the bound itself
_SUM_ROUNDING = 2.0 ** -50  # of the float64 sum in ``combined``, relative to its terms' sizes


@dataclass
class Sliced:
    """Rows cut into int8 slices: ``rows / scale[:, None]`` is the slices' weighted sum plus
    a remainder of at most 1/2 in units of the last slice."""

    slices: list[Any]  # K (rows, d) int8 arrays, C-contiguous
    scale: Any  # (rows,) float64 powers of two
    slice_norms: Any  # (K, rows) float64: each slice's Euclidean norm
    kept_l1: Any  # (rows,) float64: the L1 norm of the slices' weighted sum


def sliced(xp: ModuleType, rows: Any, count: int) -> Sliced:
    """``rows`` (float32 or float64, (n, d)) cut into ``count`` int8 slices."""
    x = rows.astype(xp.float64)
    largest = xp.abs(x).max(axis=1)
    exponent = xp.ceil(xp.log2(xp.where(largest > 0, largest, 127.0) / 127.0))  # 0: scale 1
    scale = xp.ldexp(xp.ones_like(largest), exponent.astype(xp.int32))
    # The least power of two with largest <= 127 scale (the logarithm may round either way).
    scale = xp.where(largest > 127.0 * scale, 2.0 * scale, scale)
    scale = xp.where((largest > 0) & (largest <= 63.5 * scale), 0.5 * scale, scale)
    rest = x / scale[:, None]  # exact: a power of two
    slices, kept = [], xp.zeros_like(x)
    for k in range(count):
        part = xp.rint(rest)
        slices.append(xp.ascontiguousarray(part.astype(xp.int8)))
        kept += part / BASE ** k
        rest = (rest - part) * BASE  # exact: fewer bits than float64 holds
    norms = xp.stack([xp.sqrt((s.astype(xp.float64) ** 2).sum(axis=1)) for s in slices])
    return Sliced(slices, scale, norms, xp.abs(kept).sum(axis=1))


def products_by_order(xp: ModuleType, z: Sliced, v: Sliced,
                      int8_product: Callable[[Any, Any, Any, bool], None]) -> list[Any]:
    """``sum of A_i . B_j`` for each order ``i + j < K`` as (n, P) int32 arrays;
    ``int8_product(a, b, out, accumulate)`` writes (or adds) ``a @ b.T`` into ``out``."""
    count = len(z.slices)
    orders = []
    for order in range(count):
        out = xp.empty((z.slices[0].shape[0], v.slices[0].shape[0]), dtype=xp.int32)
        for i in range(order + 1):
            int8_product(z.slices[i], v.slices[order - i], out, i > 0)
        orders.append(out)
    return orders


def combined(xp: ModuleType, orders: list[Any], z: Sliced, v: Sliced) -> Any:
    """The products' estimate of ``z . v`` in float64, (n, P)."""
    total = xp.zeros(orders[0].shape, dtype=xp.float64)
    for order, part in enumerate(orders):
        total += part.astype(xp.float64) / BASE ** order
    return total * z.scale[:, None] * v.scale[None, :]


def bound(xp: ModuleType, orders: list[Any], z: Sliced, v: Sliced) -> Any:
    """An upper bound of ``|z . v - combined(xp, orders, z, v)|`` for every row and plane,
    (n, P): the dropped slice pairs, the remainders' terms, and the float64 arithmetic."""
    count, features = len(z.slices), z.slices[0].shape[1]
    dropped = xp.zeros((z.scale.shape[0], v.scale.shape[0]), dtype=xp.float64)
    for i in range(count):
        for j in range(count):
            if i + j >= count:
                dropped += xp.outer(z.slice_norms[i], v.slice_norms[j]) / BASE ** (i + j)
    last = 0.5 / BASE ** (count - 1)  # the largest remainder, in units of the scale
    remainders = last * (z.kept_l1[:, None] + v.kept_l1[None, :]) + features * last * last
    sizes = sum(xp.abs(part.astype(xp.float64)) / BASE ** order
                for order, part in enumerate(orders))
    return ((dropped + remainders) * _ROUNDING_MARGIN + _SUM_ROUNDING * sizes) \
        * z.scale[:, None] * v.scale[None, :]


def row_bound(xp: ModuleType, z: Sliced, v: Sliced) -> Any:
    """``bound``'s largest value over the planes, for each row, (n,): a tolerance per row, as
    the library's float32 one is, so that the contexts kernel could take the int8 products'
    estimate (as float32, whose rounding the kernel's caller would add) with no other change.
    Each plane's factor is replaced by its largest over the planes, and the float64 sum's
    terms by the slices' norms."""
    count, features = len(z.slices), z.slices[0].shape[1]
    largest = [(v.scale * v.slice_norms[j]).max() for j in range(count)]
    dropped, sizes = xp.zeros_like(z.scale), xp.zeros_like(z.scale)
    for i in range(count):
        for j in range(count):
            term = z.slice_norms[i] * largest[j] / BASE ** (i + j)
            if i + j >= count:
                dropped += term
            else:
                sizes += term
    last = 0.5 / BASE ** (count - 1)
    plane_scale = v.scale.max()
    remainders = last * (z.kept_l1 * plane_scale + (v.scale * v.kept_l1).max()) \
        + features * last * last * plane_scale
    return ((dropped + remainders) * _ROUNDING_MARGIN + _SUM_ROUNDING * sizes) * z.scale


def integer_product(xp: ModuleType) -> Callable[[Any, Any, Any, bool], None]:
    """``int8_product`` as plain integer array code: the same integers, exactly."""
    def product(a: Any, b: Any, out: Any, accumulate: bool) -> None:
        result = (a.astype(xp.int64) @ b.astype(xp.int64).T).astype(xp.int32)
        if accumulate:
            out += result
        else:
            out[...] = result

    return product
