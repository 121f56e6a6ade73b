"""Short calls' gating from the 16-bit normals decides every bit as the float32 normals do."""

import numpy as np
import pytest

from gln.gating import dot_rounding_bound, halfspace_contexts, layer_contexts, sample_halfspaces
from gln.kernels import contexts_for
from gln.kernels.cpu import cpu_exact_dots
from gln.kernels.cpu_int16_gating import context_layout, int16_normals


def _contexts(layer_contexts, z, normals, offsets, m):
    """A CpuLayerContexts call for one GLN of one layer, as (n, P / m)."""
    neurons = normals.shape[0] // m
    (indices,) = layer_contexts(z, normals, offsets, m, 1, [neurons])
    return indices[:, 0, :]


def test_the_copy_is_16_bit_values_times_a_power_of_two_within_its_residual_bound():
    rng = np.random.default_rng(0)
    normals, _ = sample_halfspaces(rng, 300, 50, 1.0)
    copy = int16_normals(normals)
    assert copy.values.dtype == np.int16 and copy.scales.dtype == np.float32
    mantissa, _ = np.frexp(copy.scales)
    assert np.all(mantissa == 0.5)  # powers of two: values * scale is exact in float32
    largest = np.abs(copy.values.astype(np.int64)).max(axis=1)
    assert np.all(largest <= 32767) and np.all(largest >= 16384)  # the range is used
    rebuilt = copy.values.astype(np.float64) * copy.scales[:, None]
    residuals = np.linalg.norm(normals.astype(np.float64) - rebuilt, axis=1)
    assert np.all(copy.residual_norms >= residuals)
    assert np.all(copy.residual_norms <= residuals * 1.001)
    assert np.all(copy.norms >= np.linalg.norm(rebuilt, axis=1))
    assert np.all(residuals > 0)  # the copy is not the normals


@pytest.mark.parametrize("d", [20, 300])
def test_short_calls_decide_as_the_reference_on_and_off_the_hyperplanes(d):
    rng = np.random.default_rng(1)
    m, neurons = 4, 25
    normals, offsets = sample_halfspaces(rng, neurons * m, d, 1.0)
    z = rng.normal(size=(40, d))
    for t in range(0, 40, 2):  # every other row on a hyperplane
        v = normals[t % (neurons * m)].astype(np.float64)
        z[t] += (offsets[t % (neurons * m)] - z[t] @ v) * v
    z = z.astype(np.float32)
    layer_contexts = contexts_for(np)
    for n in (1, 2, 3, 4, 5, 8, 31, 32, 33, 40):  # the 16-bit path up to 32 rows, then split
        expected = halfspace_contexts(np, z[:n], normals, offsets, m)
        got = _contexts(layer_contexts, z[:n], normals, offsets, m)
        assert got.dtype == np.int32 and np.array_equal(got, expected), n
    assert layer_contexts.nbytes == int16_normals(normals).nbytes


def test_margins_the_16_bit_rounding_gets_wrong_are_rechecked():
    """Rows placed so that the 16-bit product has the wrong sign, far beyond float32's own
    rounding bound: only the residual's share of the tolerance sends them to the re-check."""
    rng = np.random.default_rng(2)
    d, m = 20, 4
    normals, offsets = sample_halfspaces(rng, 8 * m, d, 1.0)
    copy = int16_normals(normals)
    rows, planes = [], []
    for p in range(normals.shape[0]):
        v = normals[p].astype(np.float64)
        r = v - copy.values[p].astype(np.float64) * copy.scales[p]
        across = r - (r @ v) / (v @ v) * v  # the residual's part orthogonal to the normal
        u = across / np.linalg.norm(across)
        for eps in (3e-4, -3e-4):
            along = (offsets[p] + eps) / (v @ v)  # z . v = b + eps
            # The 16-bit margin z . (v - r) - b = eps - along (v . r) - s (u . r) = -eps.
            s = (2 * eps - along * (v @ r)) / (u @ r)
            rows.append(along * v + s * u)
            planes.append(p)
    z = np.array(rows, dtype=np.float32)
    planes = np.array(planes)
    exact = (z.astype(np.float64) * normals[planes].astype(np.float64)).sum(axis=1)
    exact -= offsets[planes]
    rebuilt = copy.values.astype(np.float32) * copy.scales[:, None]  # exact in float32
    approximate = (z @ rebuilt.T)[np.arange(len(z)), planes] - offsets[planes]
    wrong = np.sign(approximate) != np.sign(exact)
    assert wrong.mean() > 0.9  # the 16-bit products get these signs wrong ...
    float32_bound = 2 * dot_rounding_bound(d) * np.linalg.norm(z.astype(np.float64), axis=1)
    assert np.all(np.abs(approximate) > 2 * float32_bound)  # ... beyond float32's bound
    expected = halfspace_contexts(np, z, normals, offsets, m)
    for n in (1, 4, len(z)):  # ... yet every call decides them as the reference does
        got = np.concatenate([_contexts(contexts_for(np), z[t:t + n], normals, offsets, m)
                              for t in range(0, len(z), n)])
        assert np.array_equal(got, expected), n


def test_new_normals_get_a_new_copy():
    """A restore replaces the model's normals: the next short call must not use the old copy."""
    rng = np.random.default_rng(3)
    d, m = 30, 2
    first, offsets = sample_halfspaces(rng, 10 * m, d, 1.0)
    second, _ = sample_halfspaces(rng, 10 * m, d, 1.0)
    z = rng.normal(size=(3, d)).astype(np.float32)
    layer_contexts = contexts_for(np)
    _contexts(layer_contexts, z, first, offsets, m)
    for normals in (second, first.copy()):
        got = _contexts(layer_contexts, z, normals, offsets, m)
        assert np.array_equal(got, halfspace_contexts(np, z, normals, offsets, m))


def test_rows_too_large_for_16_bit_products_take_the_float32_normals():
    """A row near float32's range could overflow ``z * values`` before the scale brings it
    back (where the compiler moves the scale); such calls are decided from the float32
    normals, still as the reference does."""
    rng = np.random.default_rng(4)
    d, m = 40, 2
    normals, offsets = sample_halfspaces(rng, 6 * m, d, 1.0)
    z = (rng.normal(size=(3, d)) * 1e30).astype(np.float32)
    for rows in (z, z * 1e6):  # the 16-bit path, then the float32 one
        got = _contexts(contexts_for(np), rows, normals, offsets, m)
        assert np.array_equal(got, halfspace_contexts(np, rows, normals, offsets, m))


@pytest.mark.parametrize(("glns", "layer_sizes", "m", "d"), [
    (1, (8, 4, 1), 3, 6),
    (5, (16, 16, 1), 4, 20),
    (3, (13, 1), 5, 30),
    (2, (5, 1), 1, 3),
    (1, (4, 1), 16, 10),
    (10, (128, 128, 1), 4, 784),
])
def test_short_calls_give_each_layer_its_contexts_as_the_reference(glns, layer_sizes, m, d):
    """One pass writes each layer's (n, G, K_l) int32 array, C-contiguous, with the reference's
    contexts, for rows on hyperplanes and rows away from them, one to 32 rows at a time."""
    rng = np.random.default_rng(d)
    planes = glns * sum(layer_sizes) * m
    normals, offsets = sample_halfspaces(rng, planes, d, 1.0)
    z = rng.normal(size=(32, d))
    for t in range(0, 32, 3):  # some rows on a hyperplane
        p = rng.integers(planes)
        v = normals[p].astype(np.float64)
        z[t] += (offsets[p] - z[t] @ v) * v
    z = z.astype(np.float32)
    for t in range(1, 32, 3):  # and some hyperplanes through a row
        offsets[rng.integers(planes)] = np.float32(z[t].astype(np.float64)
                                                   @ normals[rng.integers(planes)])
    layer_contexts_of = contexts_for(np)
    for n in (1, 2, 3, 4, 5, 9, 32):
        for start in range(0, 32 - n + 1, max(n, 7)):
            rows = z[start:start + n]
            expected = layer_contexts(np, rows, normals, offsets, m, glns, layer_sizes,
                                      dots=cpu_exact_dots)
            got = layer_contexts_of(rows, normals, offsets, m, glns, layer_sizes)
            assert len(got) == len(layer_sizes)
            for layer, want in zip(got, expected, strict=True):
                assert layer.dtype == np.int32 and layer.flags.c_contiguous
                assert layer.shape == want.shape and np.array_equal(layer, want)


def test_the_layout_places_each_neuron_in_its_layer():
    glns, layer_sizes, n = 3, (4, 2, 1), 5
    layout = context_layout(glns, layer_sizes)
    flat = np.full(n * glns * sum(layer_sizes), -1)
    for q in range(glns * sum(layer_sizes)):
        for t in range(n):
            flat[layout[0, q] * n + layout[1, q] + t * layout[2, q]] = t * 1000 + q
    first = 0
    for a, b in ((0, 4), (4, 6), (6, 7)):
        piece = flat[first:first + n * glns * (b - a)].reshape(n, glns, b - a)
        for t in range(n):
            for g in range(glns):
                expected = t * 1000 + g * sum(layer_sizes) + np.arange(a, b)
                assert np.array_equal(piece[t, g], expected)
        first += n * glns * (b - a)
