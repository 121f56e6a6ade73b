"""The int8 gating's cuBLAS call, on the emulated device, whose gemmEx is BLAS's column-major
definition read from the operands' addresses: the library must ask it for the row-major
``a @ b.T`` (a swapped operation or leading dimension fails here, as it would on a GPU)."""

import numpy as np
import pytest

from tests.gln.emulated_cupy import GXX, emulated_cupy_installed

pytestmark = pytest.mark.skipif(GXX is None, reason="the emulated device needs g++ on PATH")


def test_the_int8_product_is_the_row_major_product_and_beta_adds():
    from gln.kernels.int8_gating import int8_product  # noqa: PLC0415

    rng = np.random.default_rng(5)
    a = rng.integers(-127, 128, (6, 8)).astype(np.int8)
    b = rng.integers(-127, 128, (5, 8)).astype(np.int8)
    expected = a.astype(np.int64) @ b.astype(np.int64).T
    with emulated_cupy_installed() as cp:
        out = cp.full((6, 5), 7, dtype=cp.int32)
        int8_product(cp.asarray(a), cp.asarray(b), out, accumulate=False)
        np.testing.assert_array_equal(out.get(), expected)
        int8_product(cp.asarray(a), cp.asarray(b), out, accumulate=True)
        np.testing.assert_array_equal(out.get(), 2 * expected)
        assert cp.operations["cublas gemmEx"] == 2
        with pytest.raises(ValueError, match="multiple of 4"):
            int8_product(cp.asarray(a[:, :7].copy()), cp.asarray(b[:, :7].copy()), out, False)


def test_the_int8_product_reads_column_ranges_of_wider_arrays():
    """The int8 gating pairs slices as column ranges of side-by-side layouts: the first
    columns of one array, the last of another, each read with its rows' stride."""
    from gln.kernels.int8_gating import int8_product  # noqa: PLC0415

    rng = np.random.default_rng(6)
    a = rng.integers(-127, 128, (6, 24)).astype(np.int8)
    b = rng.integers(-127, 128, (5, 24)).astype(np.int8)
    expected = a[:, :16].astype(np.int64) @ b[:, 8:].astype(np.int64).T
    with emulated_cupy_installed() as cp:
        out = cp.full((6, 5), 7, dtype=cp.int32)
        int8_product(cp.asarray(a)[:, :16], cp.asarray(b)[:, 8:], out, accumulate=False)
        np.testing.assert_array_equal(out.get(), expected)
        with pytest.raises(ValueError, match="contiguous"):
            int8_product(cp.asarray(a)[:, ::2], cp.asarray(b)[:, ::2], out, False)


def test_the_slicing_kernel_cuts_rows_as_the_array_code_does():
    """``gln_int8_slices`` against ``tests.support.int8_gating.sliced`` (the array code the bound
    was proved on): the same scales and slices, zeros in the padding, the same norms."""
    from gln.kernels.int8_gating import SLICES, sliced  # noqa: PLC0415
    from tests.support import int8_gating as spec  # noqa: PLC0415

    rng = np.random.default_rng(9)
    x = (rng.standard_normal((7, 45)) * rng.lognormal(0, 3, (7, 1))).astype(np.float32)
    x[0] = 0.0
    x[1] = 127.0 * 2.0 ** -3  # exactly on a scale's edge
    x[2, 5] = -3e30
    expected = spec.sliced(np, x, SLICES)
    for reversed_ in (False, True):
        with emulated_cupy_installed() as cp:
            got = sliced(cp.asarray(x), 48, reversed=reversed_)
            slices, scale = got.slices.get(), got.scale.get()
            norms, kept_l1, length = got.norms.get(), got.kept_l1.get(), got.length.get()
        np.testing.assert_array_equal(scale, expected.scale)
        side_by_side = slices.reshape(7, SLICES, 48)
        for k in range(SLICES):
            column = SLICES - 1 - k if reversed_ else k
            np.testing.assert_array_equal(side_by_side[:, column, :45], expected.slices[k])
        assert not side_by_side[:, :, 45:].any()
        np.testing.assert_array_equal(norms, expected.slice_norms)
        np.testing.assert_allclose(kept_l1, expected.kept_l1, rtol=1e-13)
        np.testing.assert_allclose(length, np.linalg.norm(x.astype(np.float64), axis=1),
                                   rtol=1e-13)


def test_the_row_tolerances_take_every_planes_largest_factors():
    """3,000 planes, several turns for each warp that shares them out, the largest of every
    factor on the last one: each row's tolerance is the array code's row bound with the
    float32 rounding the kernel adds (``gln_int8_row_tolerances``), so no plane was missed."""
    from gln.kernels.int8_gating import SLICES, int8_products  # noqa: PLC0415
    from tests.support import int8_gating as spec  # noqa: PLC0415

    rng = np.random.default_rng(11)
    z = rng.standard_normal((5, 40)).astype(np.float32)
    normals = rng.standard_normal((3000, 40))
    normals = (normals / np.linalg.norm(normals, axis=1, keepdims=True)).astype(np.float32)
    normals[-1] *= 4.0  # a power of two: the same slices, four times the scale
    offsets = rng.normal(0, 0.1, 3000).astype(np.float32)
    offsets[-1] = 3.0
    with emulated_cupy_installed() as cp:
        _, tolerance = int8_products(cp.asarray(z), cp.asarray(normals), cp.asarray(offsets))
        tolerance = tolerance.get()
    bound = spec.row_bound(np, spec.sliced(np, z, SLICES), spec.sliced(np, normals, SLICES))
    length = np.linalg.norm(z.astype(np.float64), axis=1)
    estimate = 1.001 * length + bound
    expected = (bound + 2.0 ** -23 * (estimate + 3.0)) * 1.001
    np.testing.assert_allclose(tolerance, expected, rtol=1e-6)
    assert np.all(tolerance >= expected * (1 - 1e-7))  # rounded up, never down
