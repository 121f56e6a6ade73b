"""Halfspace sampling and context signatures."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gln.gating import (
    context_indices,
    halfspace_bits,
    halfspace_contexts,
    restrict_to_windows,
    sample_halfspaces,
)
from gln.kernels import contexts_for, cpu_gating


def test_normals_are_uniform_on_the_unit_sphere_and_offsets_normal():
    rng = np.random.default_rng(0)
    normals, offsets = sample_halfspaces(rng, 20000, 8, offset_scale=1.0)
    assert normals.dtype == np.float32 and normals.shape == (20000, 8)
    np.testing.assert_allclose(np.linalg.norm(normals, axis=1), 1.0, atol=1e-6)
    # Uniform on the sphere: mean 0 and covariance I / d.
    np.testing.assert_allclose(normals.mean(axis=0), 0.0, atol=0.01)
    np.testing.assert_allclose(np.cov(normals.T), np.eye(8) / 8, atol=0.01)
    assert abs(offsets.mean()) < 0.03 and abs(offsets.std() - 1.0) < 0.03
    _, scaled = sample_halfspaces(np.random.default_rng(0), 20000, 8, offset_scale=0.05)
    assert abs(scaled.std() - 0.05) < 0.002


def test_context_index_is_the_m_bit_signature():
    rng = np.random.default_rng(1)
    z = rng.normal(size=(40, 6)).astype(np.float32)
    normals, offsets = sample_halfspaces(rng, 3 * 4, 6, 1.0)  # 3 neurons, m = 4
    indices = context_indices(np, halfspace_bits(np, z, normals, offsets), 4)
    assert indices.shape == (40, 3)
    for t in range(40):
        for k in range(3):
            bits = [float(z[t].astype(np.float64) @ normals[4 * k + j]) >= offsets[4 * k + j]
                    for j in range(4)]
            assert indices[t, k] == sum(int(b) << j for j, b in enumerate(bits))


def test_borderline_rows_get_the_same_decision_alone_or_in_a_batch():
    """Points placed on a hyperplane (within float32 rounding) are decided exactly."""
    rng = np.random.default_rng(2)
    d = 300
    normals, offsets = sample_halfspaces(rng, 16, d, 1.0)
    z = rng.normal(size=(64, d))
    # Move each row onto hyperplane (t mod 16): its margin is now pure rounding noise.
    for t in range(64):
        v = normals[t % 16].astype(np.float64)
        z[t] += (offsets[t % 16] - z[t] @ v) * v
    z = z.astype(np.float32)
    batch = halfspace_bits(np, z, normals, offsets)
    alone = np.concatenate([halfspace_bits(np, z[t:t + 1], normals, offsets) for t in range(64)])
    assert np.array_equal(batch, alone)
    exact = (z.astype(np.float64) @ normals.astype(np.float64).T) >= offsets.astype(np.float64)
    borderline = [(t, t % 16) for t in range(64)]
    assert all(batch[t, p] == exact[t, p] for t, p in borderline)


def test_cpu_kernel_contexts_match_the_reference_on_and_off_the_hyperplanes():
    rng = np.random.default_rng(3)
    d, m = 200, 4
    normals, offsets = sample_halfspaces(rng, 40 * m, d, 1.0)
    z = rng.normal(size=(120, d))
    for t in range(0, 120, 2):  # every other row sits on one of the hyperplanes
        v = normals[t % (40 * m)].astype(np.float64)
        z[t] += (offsets[t % (40 * m)] - z[t] @ v) * v
    z = z.astype(np.float32)
    cpu_layer_contexts = contexts_for(np)
    glns, layer_sizes = 4, (6, 3, 1)  # 40 neurons
    fused = cpu_layer_contexts(z, normals, offsets, m, glns, layer_sizes)
    flat = halfspace_contexts(np, z, normals, offsets, m).reshape(120, glns, 10)
    assert [a.shape for a in fused] == [(120, glns, k) for k in layer_sizes]
    assert all(a.dtype == np.int32 and a.flags.c_contiguous for a in fused)
    assert np.array_equal(np.concatenate(fused, axis=2), flat)
    for t in range(120):
        alone = cpu_layer_contexts(z[t:t + 1], normals, offsets, m, glns, layer_sizes)
        assert all(np.array_equal(a[0], b[t]) for a, b in zip(alone, fused, strict=True))
    empty = cpu_layer_contexts(z[:0], normals, offsets, m, glns, layer_sizes)
    assert [a.shape for a in empty] == [(0, glns, k) for k in layer_sizes]


@pytest.mark.parametrize("parts", [None, 2, 3, 7])
def test_cpu_contexts_are_the_same_however_the_neurons_are_split(monkeypatch, parts):
    """Every split, of calls of any length, decides as the reference does."""
    monkeypatch.setattr(cpu_gating, "SPLIT_MIN_WORK", 0)
    monkeypatch.setattr(cpu_gating, "SPLIT_PARTS", parts)
    rng = np.random.default_rng(4)
    d, m, neurons = 150, 3, 20
    normals, offsets = sample_halfspaces(rng, neurons * m, d, 1.0)
    z = rng.normal(size=(40, d))
    for t in range(0, 40, 2):  # every other row on a hyperplane: its decision is a re-check
        v = normals[t % (neurons * m)].astype(np.float64)
        z[t] += (offsets[t % (neurons * m)] - z[t] @ v) * v
    z = z.astype(np.float32)
    for n in (1, 2, 3, 4, 5, 40):
        expected = halfspace_contexts(np, z[:n], normals, offsets, m)
        got = cpu_gating.cpu_halfspace_contexts(z[:n], normals, offsets, m)
        assert got.dtype == np.int32 and np.array_equal(got, expected), n


@settings(max_examples=60, deadline=None)
@given(d=st.integers(1, 60), m=st.integers(1, 5), neurons=st.integers(1, 12),
       n=st.integers(0, 20), on_planes=st.floats(0, 1), seed=st.integers(0, 2**32 - 1))
def test_one_pass_decisions_match_the_reference(d, m, neurons, n, on_planes, seed):
    """``decided_contexts`` (bits, float64 re-checks and folding in one pass) against the
    array code, with a share of the rows moved onto a hyperplane so that their decision is a
    re-check."""
    rng = np.random.default_rng(seed)
    normals, offsets = sample_halfspaces(rng, neurons * m, d, 1.0)
    z = rng.normal(size=(n, d))
    for t in range(n):
        if rng.random() < on_planes:  # onto plane p, up to float32 rounding
            p = rng.integers(neurons * m)
            v = normals[p].astype(np.float64)
            z[t] += (offsets[p] - z[t] @ v) * v
    z = z.astype(np.float32)
    expected = halfspace_contexts(np, z, normals, offsets, m)
    got = cpu_gating.decided_contexts(z, normals, offsets, m)
    assert got.dtype == np.int32 and got.shape == (n, neurons)
    assert np.array_equal(got, expected)


def _blas_threads() -> list[int]:
    from threadpoolctl import threadpool_info  # noqa: PLC0415

    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


def test_blas_is_held_to_one_thread_only_while_a_split_call_runs():
    before = _blas_threads()
    if not before:
        pytest.skip("threadpoolctl finds no BLAS to limit")
    blas = cpu_gating._SingleThreadedBlas()
    first, second = blas.held(), blas.held()
    first.__enter__()
    second.__enter__()  # calls overlap: the limit lasts until the last one leaves
    first.__exit__(None, None, None)
    assert set(_blas_threads()) == {1}
    second.__exit__(None, None, None)
    assert _blas_threads() == before


def test_a_failing_block_raises_and_gives_blas_its_threads_back(monkeypatch):
    before = _blas_threads()
    monkeypatch.setattr(cpu_gating, "SPLIT_MIN_WORK", 0)
    monkeypatch.setattr(cpu_gating, "SPLIT_PARTS", 3)
    calls = []

    decided = cpu_gating.decided_contexts

    def failing(z, normals, *args):
        calls.append(normals.shape[0])
        if len(calls) == 2:
            raise RuntimeError("block failed")
        return decided(z, normals, *args)

    monkeypatch.setattr(cpu_gating, "decided_contexts", failing)
    rng = np.random.default_rng(5)
    normals, offsets = sample_halfspaces(rng, 6 * 2, 8, 1.0)
    with pytest.raises(RuntimeError, match="block failed"):
        cpu_gating.cpu_halfspace_contexts(rng.normal(size=(8, 8)).astype(np.float32),
                                          normals, offsets, 2)
    assert len(calls) == 3 and _blas_threads() == before


def test_windowed_normals_are_uniform_on_a_random_square_inside_the_image():
    rng = np.random.default_rng(5)
    height, width, window = 9, 7, 3
    normals, _ = sample_halfspaces(rng, 4000, height * width, 1.0)
    kept = restrict_to_windows(rng, normals, (height, width), window)
    assert kept.dtype == np.float32 and kept.shape == normals.shape
    np.testing.assert_allclose(np.linalg.norm(kept, axis=1), 1.0, atol=1e-6)
    support = kept.reshape(-1, height, width) != 0
    tops = support.any(axis=2).argmax(axis=1)
    lefts = support.any(axis=1).argmax(axis=1)
    for k in range(0, 4000, 97):  # the support is exactly the square at (top, left)
        square = np.zeros((height, width), bool)
        square[tops[k]:tops[k] + window, lefts[k]:lefts[k] + window] = True
        np.testing.assert_array_equal(support[k], square)
    # Every position that keeps the square inside the image occurs, about equally often.
    positions = np.bincount(tops * width + lefts, minlength=height * width).reshape(height, width)
    inside = positions[: height - window + 1, : width - window + 1]
    assert positions.sum() == inside.sum() and inside.min() > 0.6 * 4000 / inside.size
    # Inside its square a normal is uniform on that sphere: coordinates of variance 1 / w^2.
    values = kept.reshape(-1, height, width)[support]
    assert abs(values.mean()) < 0.01 and abs(values.var() - 1 / window**2) < 0.01
    # A window as large as a square image leaves the normals as they were.
    square_normals, _ = sample_halfspaces(rng, 50, 7 * 7, 1.0)
    whole = restrict_to_windows(rng, square_normals, (7, 7), 7)
    np.testing.assert_allclose(whole, square_normals, atol=1e-6)
