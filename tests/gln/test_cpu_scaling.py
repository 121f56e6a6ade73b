"""The compiled scaling passes give the array code's bits (``gln.kernels.cpu_scaling``)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gln.kernels import moments_fold_for
from gln.kernels.cpu_scaling import cpu_moments_before_each_row, cpu_standardize
from gln.scaling import Z_LIMIT, RunningMoments, moments_before_each_row, standardized


def _rows(rng, n, d, kind):
    """Rows of one of the kinds a stream brings: spread and offset per feature, constant
    features, signed zeros, large means over small spreads, values near float32's range."""
    x = rng.normal(size=(n, d)) * rng.uniform(0.01, 10, d) + rng.normal(0, 3, d)
    if kind == "constant":
        x[:, ::2] = rng.normal(size=d)[::2]
    elif kind == "zeros":
        x[:, ::2] = 0.0
        x[rng.random((n, d)) < 0.5] *= -1.0  # -0.0 as well as 0.0
    elif kind == "large_mean":
        x = 1e7 + rng.normal(0, 0.05, (n, d))
    elif kind == "extreme":
        x[rng.random((n, d)) < 0.1] = 3e38 * rng.choice([-1.0, 1.0])
    return x.astype(np.float32).astype(np.float64)  # what a model's rows are: float32 values


def _moments(rng, d, count):
    if count == 0:
        return RunningMoments(0, np.zeros(d), np.zeros(d))
    return RunningMoments(count, rng.normal(0, 50, d), rng.uniform(0, 500, d))


KINDS = ["normal", "constant", "zeros", "large_mean", "extreme"]


def _same(got, want):
    for a, b in zip(got[:3], want[:3], strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    assert got[3].count == want[3].count
    assert got[3].total.tobytes() == want[3].total.tobytes()
    assert got[3].total_sq.tobytes() == want[3].total_sq.tobytes()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [0, 1, 2, 7, 256])
@pytest.mark.parametrize("count", [0, 1, 12345])
@pytest.mark.parametrize("shifted", [False, True], ids=["raw", "shifted"])
def test_the_moments_pass_equals_the_array_code_bit_for_bit(kind, n, count, shifted):
    rng = np.random.default_rng([n, count, KINDS.index(kind)])
    d = 13
    x = _rows(rng, n, d, kind)
    shift = _rows(rng, 1, d, kind)[0] if shifted else None
    moments = _moments(rng, d, count)
    want = moments_before_each_row(np, moments, x, shift)
    _same(cpu_moments_before_each_row(moments, x, shift), want)
    _same(moments_fold_for(np)(moments, x, None, shift), want)  # the model's pick on the CPU
    assert not np.shares_memory(want[3].total, moments.total)


@pytest.mark.filterwarnings("ignore:overflow")  # z beyond float64 at min_std 1e-300: clipped
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [0, 1, 2, 7, 256])
@pytest.mark.parametrize("count", [0, 1, 12345])
@pytest.mark.parametrize("frozen", [False, True], ids=["learning", "frozen"])
@pytest.mark.parametrize("shifted", [False, True], ids=["raw", "shifted"])
def test_the_standardize_pass_equals_the_array_code_bit_for_bit(kind, n, count, frozen, shifted):
    """Statistics per row (learning) or one set for every row (predicting), before any row
    (z = 0), constant features (the std floor), logits beyond the cap, z beyond Z_LIMIT."""
    rng = np.random.default_rng([n, count, KINDS.index(kind), frozen])
    d = 11
    x = _rows(rng, n, d, kind)
    shift = x[0].copy() if shifted and n else (rng.normal(0, 3, d) if shifted else None)
    counts, sums, sums_sq, after = moments_before_each_row(
        np, _moments(rng, d, count), x, shift)
    if frozen:
        counts, sums, sums_sq = (np.full((1, 1), float(after.count)), after.total[None],
                                 after.total_sq[None])
    for min_std, logit_cap in ((1e-9, 4.59), (0.3, 8.1), (1e-300, 1e3)):
        want = standardized(np, x, counts, sums, sums_sq, min_std, logit_cap, shift)
        got = cpu_standardize(x, counts, sums, sums_sq, min_std, logit_cap, shift)
        for a, b in zip(got, want, strict=True):
            assert a.dtype == b.dtype == np.float32 and a.shape == b.shape
            assert a.tobytes() == b.tobytes()  # signed zeros included


def test_the_edges_are_met():
    """The cases above reach z = 0 before any row, -0.0, the Z_LIMIT bound and the cap."""
    rng = np.random.default_rng(0)
    x = _rows(rng, 64, 11, "extreme")
    counts, sums, sums_sq, _ = moments_before_each_row(np, _moments(rng, 11, 0), x)
    z, logits = cpu_standardize(x, counts, sums, sums_sq, 1e-300, 1e3)
    assert (z[0] == 0).all() and (np.abs(z) == np.float32(Z_LIMIT)).any()
    assert (np.abs(logits) == np.float32(1e3)).any()
    x = np.array([[0.0, -0.0], [-0.0, -0.0]])
    counts, sums, sums_sq, _ = moments_before_each_row(np, _moments(rng, 2, 0), x)
    z, _ = cpu_standardize(x, counts, sums, sums_sq, 1e-9, 4.59)
    assert np.signbit(z[1, 1])


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 9), d=st.integers(1, 40),
       count=st.integers(0, 2**40), kind=st.sampled_from(KINDS), shifted=st.booleans(),
       min_std=st.floats(1e-12, 10.0), logit_cap=st.floats(0.01, 20.0))
def test_random_chunks_scale_as_the_array_code_does(seed, n, d, count, kind, shifted, min_std,
                                                    logit_cap):
    rng = np.random.default_rng(seed)
    x = _rows(rng, n, d, kind)
    shift = _rows(rng, 1, d, kind)[0] if shifted else None
    moments = _moments(rng, d, count)
    want = moments_before_each_row(np, moments, x, shift)
    got = cpu_moments_before_each_row(moments, x, shift)
    _same(got, want)
    counts, sums, sums_sq, _ = want
    expected = standardized(np, x, counts, sums, sums_sq, min_std, logit_cap, shift)
    scaled = cpu_standardize(x, counts, sums, sums_sq, min_std, logit_cap, shift)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(scaled, expected, strict=True))


def test_strided_inputs_scale_as_contiguous_ones():
    rng = np.random.default_rng(5)
    x = _rows(rng, 9, 22, "normal")
    moments = _moments(rng, 11, 7)
    strided = x[:, ::2]  # every other column: a view that is not contiguous
    want = moments_before_each_row(np, moments, strided, strided[0])
    _same(cpu_moments_before_each_row(moments, strided, strided[0]), want)
    counts, sums, sums_sq, _ = want
    expected = standardized(np, strided, counts, sums, sums_sq, 1e-9, 4.59,
                            strided[0])
    got = cpu_standardize(strided, counts, sums, sums_sq, 1e-9, 4.59,
                          strided[0])
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got, expected, strict=True))
