"""The int8-slice gating product and its bound, on NumPy: the slices rebuild the rows, the
products are the exact integer sums, and the bound holds, also on rows built to strain it."""

from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks import int8_gating as int8


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


class _ColumnMajorBlas:
    """cuBLAS's ``gemmEx`` as BLAS defines it, column-major, on host arrays found by address:
    what ``cublas_int8_product`` asks of the GPU's library, checked without one."""

    def __init__(self, *arrays: np.ndarray) -> None:
        self.arrays = {a.ctypes.data: a for a in arrays}

    def matrix(self, pointer: int, rows: int, columns: int, lead: int) -> np.ndarray:
        flat = self.arrays[pointer].reshape(-1)
        return flat[:lead * columns].reshape(columns, lead).T[:rows]

    def gemmEx(self, handle, transa, transb, m, n, k, alpha, a, atype, lda, b, btype, ldb,
               beta, c, ctype, ldc, compute, algo):  # noqa: N802 - cuBLAS's name
        assert (atype, btype, ctype, compute) == (3, 3, 10, 72)  # int8 in, int32 out and sums
        op_a = self.matrix(a, k, m, lda).T if transa == 1 else self.matrix(a, m, k, lda)
        op_b = self.matrix(b, k, n, ldb) if transb == 0 else self.matrix(b, n, k, ldb).T
        target = self.matrix(c, m, n, ldc)
        target[...] = _host_int32(alpha) * (op_a.astype(np.int64) @ op_b.astype(np.int64)) \
            + _host_int32(beta) * target


def _host_int32(address: int) -> int:
    """The int32 at a host address (cuBLAS's alpha and beta, passed by pointer)."""
    return int(np.ctypeslib.as_array((np.ctypeslib.ctypes.c_int32 * 1).from_address(address))[0])


def _device_view(x: np.ndarray) -> SimpleNamespace:
    """What ``cublas_int8_product`` reads of a CuPy array: its shape and address."""
    return SimpleNamespace(shape=x.shape, data=SimpleNamespace(ptr=x.ctypes.data))


def test_the_cublas_call_asks_for_the_row_major_product():
    rng = np.random.default_rng(5)
    a = rng.integers(-127, 128, (6, 8)).astype(np.int8)
    b = rng.integers(-127, 128, (5, 8)).astype(np.int8)
    out = np.full((6, 5), 7, dtype=np.int32)
    blas = _ColumnMajorBlas(a, b, out)
    cp = SimpleNamespace(cuda=SimpleNamespace(cublas=blas, device=SimpleNamespace(
        get_cublas_handle=lambda: 0)))
    product = int8.cublas_int8_product(cp)
    product(_device_view(a), _device_view(b), _device_view(out), False)
    expected = a.astype(np.int64) @ b.astype(np.int64).T
    np.testing.assert_array_equal(out, expected)
    product(_device_view(a), _device_view(b), _device_view(out), True)  # beta = 1: added
    np.testing.assert_array_equal(out, 2 * expected)
    with pytest.raises(ValueError, match="multiple of 4"):
        product(_device_view(a[:, :7]), _device_view(b[:, :7]), _device_view(out), False)
