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
