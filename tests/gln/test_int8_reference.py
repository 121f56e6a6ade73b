"""The int8-slice gating product and its bound, on NumPy: the slices rebuild the rows, the
products are the exact integer sums, and the bound holds, also on rows built to strain it."""

import numpy as np
import pytest

from tests.support import int8_gating as int8


def rows_and_planes(rng: np.random.Generator, n: int = 40, planes: int = 30, d: int = 52):
    z = rng.standard_normal((n, d)) * rng.lognormal(0, 2, (n, 1))  # rows of any scale
    z[0] = 0.0  # a row of zeros
    z[1, :] = 1e-3
    z[1, 0] = 1e3  # one large value: the rest falls to the last slices
    z[2] = np.where(rng.random(d) < 0.5, 127.0, -127.0) * 2.0 ** -7  # on the slices' edges
    v = rng.standard_normal((planes, d))
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return z.astype(np.float32), v.astype(np.float32)


@pytest.mark.parametrize("count", [1, 2, 3])
def test_slices_rebuild_the_rows_within_half_a_last_slice(count):
    z, _ = rows_and_planes(np.random.default_rng(0))
    cut = int8.sliced(np, z, count)
    assert all(s.dtype == np.int8 and s.flags.c_contiguous for s in cut.slices)
    assert np.abs(cut.slices[0]).max() <= 127
    assert all(np.abs(s).max() <= 64 for s in cut.slices[1:])
    assert np.all(np.log2(cut.scale) == np.round(np.log2(cut.scale)))  # powers of two
    rebuilt = sum(s.astype(np.float64) / int8.BASE ** k for k, s in enumerate(cut.slices))
    remainder = z.astype(np.float64) / cut.scale[:, None] - rebuilt
    assert np.abs(remainder).max() <= 0.5 / int8.BASE ** (count - 1)


@pytest.mark.parametrize("count", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_bound_holds_for_every_row_and_plane(count, seed):
    z, v = rows_and_planes(np.random.default_rng(seed))
    rows, planes = int8.sliced(np, z, count), int8.sliced(np, v, count)
    orders = int8.products_by_order(np, rows, planes, int8.integer_product(np))
    estimate = int8.combined(np, orders, rows, planes)
    exact = z.astype(np.float64) @ v.astype(np.float64).T
    error = np.abs(estimate - exact)
    pairs = int8.bound(np, orders, rows, planes)
    assert np.all(error <= pairs)
    assert np.all(pairs <= int8.row_bound(np, rows, planes)[:, None])  # the rows' largest
    assert np.all(error[0] == 0)  # a row of zeros is exact


def test_more_slices_bound_tighter_and_the_orders_are_integer_sums():
    z, v = rows_and_planes(np.random.default_rng(3))
    bounds = []
    for count in (2, 3):
        rows, planes = int8.sliced(np, z, count), int8.sliced(np, v, count)
        orders = int8.products_by_order(np, rows, planes, int8.integer_product(np))
        a, b = rows.slices, planes.slices
        wide = [x.astype(np.int64) for x in (*a, *b)]
        first = wide[0] @ wide[count].T
        assert np.array_equal(orders[0], first)
        assert np.array_equal(orders[1], wide[0] @ wide[count + 1].T + wide[1] @ wide[count].T)
        bounds.append(np.median(int8.bound(np, orders, rows, planes)))
    assert bounds[1] < bounds[0] / 16  # 7 bits more a slice, less the remainders' share


def test_the_dropped_slice_pairs_are_bounded_too():
    """A row the two slices hold exactly and a plane of its direction, whose error is nearly
    all in the dropped pair A_1 . B_1: a bound without the dropped pairs fails here."""
    d = 52
    row = np.full(d, 0.5, dtype=np.float32)  # rint(0.5) = 0: the halves go to the second slice
    row[0] = 127.0
    z, v = row[None, :], row[None, :] / np.float32(np.linalg.norm(row))
    rows, planes = int8.sliced(np, z, 2), int8.sliced(np, v, 2)
    assert np.count_nonzero(rows.slices[1]) == d - 1
    orders = int8.products_by_order(np, rows, planes, int8.integer_product(np))
    error = np.abs(int8.combined(np, orders, rows, planes) - z.astype(np.float64) @ v.T)
    assert np.all(error <= int8.bound(np, orders, rows, planes))
