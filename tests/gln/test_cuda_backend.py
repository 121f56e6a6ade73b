"""The CUDA backend: kernels against the NumPy reference, GLN(device="cuda") against the CPU.

Every test runs twice: on a GPU (marked ``gpu``; skipped where CuPy or a GPU is missing) and on
the emulated device of ``emulated_cupy.py`` (the same kernel sources and ``gln.kernels.cuda``
on the CPU; skipped without g++). On a GPU machine:

    pytest -m gpu tests/gln/test_cuda_backend.py
"""

from __future__ import annotations

import copy
import threading

import numpy as np
import pytest

from gln import GLN, SnapshotBuffer
from gln.gating import (
    context_indices,
    dot_rounding_bound,
    halfspace_contexts,
    layer_contexts,
    rounding_tolerances,
    sample_halfspaces,
)
from gln.network import reference_layer_pass, with_bias
from gln.scaling import (
    Z_LIMIT,
    RunningMoments,
    gaussian_blur_matrix,
    per_row_side_info,
    standardized,
)
from gln.scaling import moments_before_each_row as numpy_moments  # the array code
from tests.gln.emulated_cupy import GXX, emulated_cupy_installed
from tests.gln.layer_data import random_layer


def run_cuda(cp, data, learn, mode="auto", pred_clip=0.01, weight_clip=1.5):
    """The CUDA layer pass on device copies of ``data``; returns host (weights, probs)."""
    from gln.kernels.cuda import cuda_layer_pass  # noqa: PLC0415 - needs CuPy

    w, ctx, x, targets, rates = (cp.asarray(a) for a in data)
    probs = cp.full((ctx.shape[0], *w.shape[:2]), cp.nan, dtype=cp.float32)  # poisoned
    cuda_layer_pass(w, ctx, x, targets, rates, pred_clip, weight_clip, learn, probs, mode=mode)
    cp.cuda.Device().synchronize()
    return w.get(), probs.get()


def run_cuda_row_by_row(cp, data, learn):
    """The CUDA layer pass on one example a call, in order; returns host (weights, probs)."""
    w, ctx, x, targets, rates = data
    probs = np.empty((len(ctx), *w.shape[:2]), np.float32)
    for t in range(len(ctx)):
        one = (w, ctx[t:t + 1], x[t:t + 1], targets[t:t + 1], rates[t:t + 1])
        w, probs[t:t + 1] = run_cuda(cp, one, learn)
    return w, probs


def run_reference(data, learn, pred_clip=0.01, weight_clip=1.5):
    w, ctx, x, targets, rates = data
    weights = w.copy()
    probs = np.empty((len(ctx), *w.shape[:2]), np.float32)
    reference_layer_pass(np)(weights, ctx, x, targets, rates, pred_clip, weight_clip, learn,
                             probs)
    return weights, probs


LAYERS = [  # (G, K, S, I): bias only, odd widths, one warp exactly, MNIST's layers 2 and 1,
    (2, 3, 2, 1),  # and a layer wider than 1024 inputs (loads after the store, no prefetch)
    (3, 5, 4, 33),
    (2, 3, 4, 64),
    (3, 8, 16, 129),
    (2, 4, 16, 785),
    (1, 2, 2, 1100),
]


@pytest.mark.parametrize("layer", LAYERS, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mode", ["streaming", "resident", "rows", "auto"])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("learn", [True, False])
def test_cuda_layer_pass_matches_reference(cp, layer, mode, shared, learn):
    rng = np.random.default_rng(sum(layer))
    data = random_layer(rng, *layer, 100, shared)  # 4 windows of 32 examples
    w_ref, p_ref = run_reference(data, learn)
    w_gpu, p_gpu = run_cuda(cp, data, learn, mode)
    assert not np.isnan(p_gpu).any(), "some outputs were never written"
    np.testing.assert_allclose(p_gpu, p_ref, atol=1e-5)
    np.testing.assert_allclose(w_gpu, w_ref, atol=1e-5)
    if not learn:
        np.testing.assert_array_equal(w_gpu, data[0])


@pytest.mark.parametrize("layer", [LAYERS[1], LAYERS[4]], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mode", ["streaming", "resident", "rows"])
def test_an_odd_chunk_ends_on_the_first_of_two_register_turns(cp, layer, mode):
    """The learning kernels take examples in pairs, the register arrays swapping roles: 65
    examples end on the first of a pair, past two windows of 32."""
    rng = np.random.default_rng(65)
    data = random_layer(rng, *layer, 65, True)
    w_ref, p_ref = run_reference(data, True)
    w_gpu, p_gpu = run_cuda(cp, data, True, mode)
    assert not np.isnan(p_gpu).any(), "some outputs were never written"
    np.testing.assert_allclose(p_gpu, p_ref, atol=1e-5)
    np.testing.assert_allclose(w_gpu, w_ref, atol=1e-5)


def test_mnist_sized_layer_matches_reference(cp):
    rng = np.random.default_rng(0)
    data = random_layer(rng, 10, 128, 16, 785, 64, True)
    w_ref, p_ref = run_reference(data, True)
    w_gpu, p_gpu = run_cuda(cp, data, True)
    np.testing.assert_allclose(p_gpu, p_ref, atol=1e-5)
    np.testing.assert_allclose(w_gpu, w_ref, atol=1e-5)


@pytest.mark.parametrize("learn", [True, False])
def test_layers_too_wide_for_registers_take_the_wide_kernel(cp, learn):
    """More inputs than a lane's registers hold: the wide kernel, whatever the mode asked,
    against the reference; a chunk equals its rows one call at a time, byte for byte."""
    from gln.kernels.cuda import MAX_INPUTS, WIDE, plan_layer_launch  # noqa: PLC0415

    layer = (2, 2, 4, MAX_INPUTS + 67)
    for mode in ("auto", "streaming", "resident", "shared", "rows"):
        assert plan_layer_launch(layer, 70, learn and mode != "shared", 227 * 1024,
                                 mode).kernel == WIDE
    data = random_layer(np.random.default_rng(1), *layer, 70, False)  # three windows of 32
    w_ref, p_ref = run_reference(data, learn)
    w_gpu, p_gpu = run_cuda(cp, data, learn)
    assert not np.isnan(p_gpu).any(), "some outputs were never written"
    np.testing.assert_allclose(p_gpu, p_ref, atol=1e-5)
    np.testing.assert_allclose(w_gpu, w_ref, atol=1e-5)
    w, one_by_one = run_cuda_row_by_row(cp, data, learn)
    np.testing.assert_array_equal(one_by_one, p_gpu)
    np.testing.assert_array_equal(w, w_gpu)


@pytest.mark.parametrize("layer", LAYERS, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("learn", [True, False])
def test_the_wide_kernel_equals_the_register_kernels_byte_for_byte(cp, layer, learn):
    """Forced onto rows that registers hold, the wide kernel adds the same products in the
    same order as the streaming kernel: the same bytes."""
    data = random_layer(np.random.default_rng(3), *layer, 45, True)
    w_stream, p_stream = run_cuda(cp, data, learn, "streaming")
    w_wide, p_wide = run_cuda(cp, data, learn, "wide")
    np.testing.assert_array_equal(p_wide, p_stream)
    np.testing.assert_array_equal(w_wide, w_stream)


@pytest.mark.parametrize("layer", LAYERS[1:], ids=lambda s: "x".join(map(str, s)))
def test_kernels_and_chunkings_agree_byte_for_byte(cp, layer):
    """Streaming, resident and row kernels, and a chunk against its rows one call at a time."""
    rng = np.random.default_rng(2)
    data = random_layer(rng, *layer, 80, False)
    w_stream, p_stream = run_cuda(cp, data, True, "streaming")
    w_res, p_res = run_cuda(cp, data, True, "resident")
    np.testing.assert_array_equal(w_res, w_stream)
    np.testing.assert_array_equal(p_res, p_stream)
    w_rows, p_rows = run_cuda(cp, data, True, "rows")
    np.testing.assert_array_equal(w_rows, w_stream)
    np.testing.assert_array_equal(p_rows, p_stream)
    w, rows_p = run_cuda_row_by_row(cp, data, True)
    np.testing.assert_array_equal(w, w_res)
    np.testing.assert_array_equal(rows_p, p_res)
    # Prediction (examples split over warps) gives what learning predicted first.
    _, ctx, x, targets, rates = data
    _, p_first = run_cuda(cp, (data[0], ctx[:1], x[:1], targets[:1], rates[:1]), False)
    np.testing.assert_array_equal(p_first, p_res[:1])


@pytest.mark.parametrize("layer", [LAYERS[1], LAYERS[4], LAYERS[5]],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("learn", [True, False])
@pytest.mark.parametrize("order", ["longest_first", "natural"])
def test_the_row_kernel_takes_each_rows_examples_in_order_however_uneven(cp, layer, learn,
                                                                         order, monkeypatch):
    """A warp per row takes only its own context's examples, in order: a neuron whose every
    example selects one row (one chain the length of the chunk), a row that only the first and
    the last example select (five windows of 32 with nothing for it between), rows that none
    selects, and contexts with bits above the neuron's rows (masked, as every kernel masks
    them): the streaming kernel's bytes, whichever order the rows are taken in."""
    import gln.kernels.cuda as cuda  # noqa: PLC0415

    monkeypatch.setattr(cuda, "ROW_ORDER", order)
    glns, neurons, contexts, _ = layer
    n = 200
    w, ctx, x, targets, rates = random_layer(np.random.default_rng(11), *layer, n, True)
    ctx[:, 0, 0] = contexts - 1
    ctx[:, -1, -1] = 0
    ctx[0, -1, -1] = ctx[-1, -1, -1] = contexts - 1
    ctx[:, 0, -1] += contexts * (np.arange(n, dtype=np.int32) % 7)
    data = (w, ctx, x, targets, rates)
    w_stream, p_stream = run_cuda(cp, data, learn, "streaming")
    w_rows, p_rows = run_cuda(cp, data, learn, "rows")
    assert not np.isnan(p_rows).any(), "some outputs were never written"
    np.testing.assert_array_equal(p_rows, p_stream)
    np.testing.assert_array_equal(w_rows, w_stream)
    assert (w_rows[0, 0, :-1] == w[0, 0, :-1]).all()  # the rows never selected, untouched
    if learn:
        assert not np.array_equal(w_rows[0, 0, -1], w[0, 0, -1])


@pytest.mark.parametrize("n", [1, 200, 4096])
def test_each_rows_examples_are_listed_in_order_and_the_fullest_rows_first(cp, n):
    """gln_row_examples lists each row's examples (contexts masked), in order, with their
    counts and starts; gln_row_order lists every row once, by buckets of 1/64 of the chunk,
    the fullest first."""
    from gln.kernels.cuda import ORDER_BUCKETS, _row_lists, per_lane  # noqa: PLC0415

    rng = np.random.default_rng(n)
    glns, neurons, contexts = 3, 7, 16
    chances = rng.random((4, glns, neurons))
    ctx = sum((rng.random((4, n, glns, neurons)) < chances[:, None])[b].astype(np.int32) << b
              for b in range(4))
    ctx[:, 0, 0] = contexts * rng.integers(0, 9, n) + 5  # masked to 5: one row takes all
    examples, counts, starts, order, ordered = (
        a.get() if hasattr(a, "get") else a
        for a in _row_lists(cp.asarray(ctx), contexts, per_lane(33)))
    assert ordered == 1
    masked = (ctx & (contexts - 1)).reshape(n, -1)
    for neuron in range(glns * neurons):
        listed = examples[neuron * n:(neuron + 1) * n]
        for c in range(contexts):
            row = neuron * contexts + c
            expected = np.flatnonzero(masked[:, neuron] == c)
            assert counts[row] == len(expected)
            np.testing.assert_array_equal(listed[starts[row]:starts[row] + counts[row]],
                                          expected)
    np.testing.assert_array_equal(np.sort(order), np.arange(glns * neurons * contexts))
    buckets = counts[order] * ORDER_BUCKETS // (n + 1)
    assert (np.diff(buckets) <= 0).all()
    assert order[0] == 5  # neuron (0, 0)'s row 5, every example's


# Layers for the shared prediction kernel: as LAYERS, 37 neurons, more than one block holds, and
# 8 elements a lane, the last of them inside the row on some lanes.
SHARED_LAYERS = [*LAYERS[:-1], (2, 37, 4, 33), (1, 3, 4, 250), LAYERS[-1]]


# Settings of the shared kernel: at most this many neurons a block, and the constants
# PREDICT_SUM_BATCH, PREDICT_WARPS, PREDICT_EXAMPLE_GROUP (None: the source's own).
SHARED_SETTINGS = {
    "as_many_as_fit": (32, None, None, None),
    "at_most_3": (3, None, None, None),
    "sums_one_by_one": (32, 1, None, None),
    "sums_by_4": (32, 4, None, None),
    "sums_by_32": (32, 32, None, None),
    "20_warps": (32, None, 20, None),
    "32_warps_at_most_3_one_by_one": (3, 1, 32, None),
    "32_warps_examples_by_2": (32, None, 32, 2),
    "examples_by_4_sums_by_32": (32, 32, None, 4),
    "examples_by_2_sums_by_4_at_most_3": (3, 4, None, 2),
}


# Each setting on every other layer (each layer under half the settings, each setting on
# narrow and wide rows), with shared inputs (one row for every GLN) or a row per GLN in turn:
# every setting is a module compiled for each row width, and under the emulation each compile
# takes a second, so the whole product cost CI a minute.
SHARED_CASES = [
    pytest.param(layer, (i + j) // 2 % 2 == 0, settings,
                 id=f"{name}-{(i + j) // 2 % 2 == 0}-{'x'.join(map(str, layer))}")
    for i, (name, settings) in enumerate(SHARED_SETTINGS.items())
    for j, layer in enumerate(SHARED_LAYERS) if (i + j) % 2 == 0
]


@pytest.mark.parametrize(("layer", "shared", "settings"), SHARED_CASES)
def test_shared_prediction_equals_the_streaming_kernel_byte_for_byte(cp, layer, shared, settings,
                                                                      monkeypatch):
    """Several neurons per block (as many as fit, or at most 3), blocks of 24 examples (the
    last one short), warps taking turns over a block's examples (as many as the source takes,
    20 or 32 with no input loaded ahead), dot products summed in batches (the source's, one,
    four, 32), a warp's examples taken one by one or in groups (of 4, of 2: the library's
    with 32 warps): the outputs of the one-neuron-per-warp kernel, bit for bit, and the
    weights untouched."""
    import gln.kernels.cuda as cuda  # noqa: PLC0415

    most, batch, warps, group = settings
    monkeypatch.setattr(cuda, "PREDICT_ROWS_PER_BLOCK", 24)
    monkeypatch.setattr(cuda, "PREDICT_MAX_NEURONS_PER_BLOCK", most)
    monkeypatch.setattr(cuda, "PREDICT_SUM_BATCH", batch)
    monkeypatch.setattr(cuda, "PREDICT_WARPS", warps)
    monkeypatch.setattr(cuda, "PREDICT_EXAMPLE_GROUP", group)
    data = random_layer(np.random.default_rng(7), *layer, 100, shared)
    w_shared, p_shared = run_cuda(cp, data, False, "shared")
    _, p_stream = run_cuda(cp, data, False, "streaming")
    assert not np.isnan(p_shared).any(), "some outputs were never written"
    np.testing.assert_array_equal(p_shared, p_stream)
    np.testing.assert_array_equal(w_shared, data[0])
    np.testing.assert_allclose(p_shared, run_reference(data, False)[1], atol=1e-5)


@pytest.mark.parametrize("layer", [*LAYERS[1:], (1, 2, 2, 2051)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize(("mode", "learn"), [("streaming", True), ("resident", True),
                                             ("rows", True), ("streaming", False),
                                             ("shared", False)])
def test_a_layer_pass_writes_the_next_layers_inputs_bit_for_bit(cp, layer, mode, learn):
    """What the separate input kernel would build from the outputs, from the same launch,
    also where prediction splits a neuron's examples over warps (and for the widest layers,
    which take the wide kernel)."""
    from gln.kernels.cuda import cuda_layer_inputs, cuda_layer_pass  # noqa: PLC0415

    data = random_layer(np.random.default_rng(5), *layer, 70, False)
    w, ctx, x, targets, rates = (cp.asarray(a) for a in data)
    glns, neurons = layer[:2]
    probs = cp.full((70, glns, neurons), cp.nan, dtype=cp.float32)
    next_inputs = cp.full((70, glns, neurons + 1), cp.nan, dtype=cp.float32)
    cuda_layer_pass(w, ctx, x, targets, rates, 0.01, 1.5, learn, probs, mode=mode,
                    next_inputs=next_inputs, bias_logit=0.75)
    expected = cuda_layer_inputs(probs, 0.75, True).get()
    np.testing.assert_array_equal(next_inputs.get(), expected)
    assert (expected[:, :, 0] == np.float32(0.75)).all()
    _, alone = run_cuda(cp, data, learn, mode)  # and the outputs are those without it
    np.testing.assert_array_equal(probs.get(), alone)


@pytest.mark.parametrize("n", [0, 1, 7, 300, 500])  # 500 rows > 300 features
@pytest.mark.parametrize("shifted", [False, True], ids=["raw", "shifted"])
def test_cuda_moments_equal_numpy_bit_for_bit(cp, n, shifted):
    from gln.kernels.cuda import moments_before_each_row  # noqa: PLC0415

    rng = np.random.default_rng(n)
    d = 300
    x = rng.normal(3, 5, (n, d)) + (1e6 if shifted else 0.0)
    shift = rng.normal(1e6, 5, d) if shifted else None
    moments = RunningMoments(11, rng.normal(0, 50, d), rng.uniform(0, 500, d))
    expected = numpy_moments(np, moments, x, shift=shift)
    on_gpu = RunningMoments(11, cp.asarray(moments.total), cp.asarray(moments.total_sq))
    counts, sums, sums_sq, after = moments_before_each_row(
        on_gpu, cp.asarray(x), shift=None if shift is None else cp.asarray(shift))
    np.testing.assert_array_equal(counts.get(), expected[0])
    np.testing.assert_array_equal(sums.get(), expected[1])
    np.testing.assert_array_equal(sums_sq.get(), expected[2])
    assert after.count == expected[3].count
    np.testing.assert_array_equal(after.total.get(), expected[3].total)
    np.testing.assert_array_equal(after.total_sq.get(), expected[3].total_sq)


@pytest.mark.parametrize("n", [0, 1, 5, 300])  # 1 and 5: products from our kernel, not cuBLAS
@pytest.mark.parametrize(("glns", "layer_sizes"), [(1, (64,)), (4, (8, 5, 3))])
@pytest.mark.parametrize("list_room", ["ample", "eight"])
def test_cuda_contexts_equal_numpy_contexts(cp, n, glns, layer_sizes, list_room, monkeypatch):
    """The context kernel, fed by cuBLAS or, for short chunks, by gln_halfspace_products,
    decides every bit as NumPy does, ties included, and gives each layer a C-contiguous
    (n, G, K_l) array; with room to list only eight close margins for the second launch, the
    rest are re-checked in place, to the same bits."""
    import gln.kernels.cuda  # noqa: PLC0415
    from gln.kernels.cpu import cpu_exact_dots  # noqa: PLC0415
    from gln.kernels.cuda import cuda_layer_contexts  # noqa: PLC0415

    if list_room == "eight":
        monkeypatch.setattr(gln.kernels.cuda, "RECHECK_LIST_FRACTION", 1 << 40)
        monkeypatch.setattr(gln.kernels.cuda, "RECHECK_LIST_MIN", 8)

    rng = np.random.default_rng(n)
    d, m = 784, 4
    z = rng.normal(size=(n, d)).astype(np.float32)
    normals, offsets = sample_halfspaces(rng, 64 * m, d, 0.05)
    for t, p in zip(rng.integers(0, max(n, 1), 50), rng.integers(0, 64 * m, 50), strict=True):
        if n:  # a margin of a few ulps: the kernel must redo it in float64
            offsets[p] = np.float32(z[t].astype(np.float64) @ normals[p].astype(np.float64))
    expected = layer_contexts(np, z, normals, offsets, m, glns, layer_sizes, dots=cpu_exact_dots)
    if n > 1:  # the ties matter: float32 signs alone would decide some contexts otherwise
        exact = halfspace_contexts(np, z, normals, offsets, m, dots=cpu_exact_dots)
        assert (context_indices(np, z @ normals.T - offsets >= 0, m) != exact).any()
    got = cuda_layer_contexts(cp.asarray(z), cp.asarray(normals), cp.asarray(offsets), m, glns,
                              layer_sizes)
    assert len(got) == len(layer_sizes)
    for layer, want, k in zip(got, expected, layer_sizes, strict=True):
        assert layer.dtype == cp.int32 and layer.shape == (n, glns, k)
        assert layer.flags.c_contiguous
        np.testing.assert_array_equal(layer.get(), want)


@pytest.mark.parametrize(("n", "d"), [(300, 784), (40, 301)])  # 301: slices padded to 304
def test_int8_gating_decides_every_context_as_float32_does(cp, n, d, monkeypatch):
    """GATING_PRODUCT = "int8": the products from int8 slices with their own bound decide every
    context as NumPy does, on rows of every scale, a row of zeros, a row with one huge value,
    and margins of a few ulps that only the float64 re-check settles; and their bound is
    tighter than float32's on most rows."""
    from gln.kernels.cpu import cpu_exact_dots  # noqa: PLC0415
    from gln.kernels.cuda import cuda_layer_contexts, launch_rounding_tolerances  # noqa: PLC0415
    from gln.kernels.int8_gating import int8_products  # noqa: PLC0415

    rng = np.random.default_rng(d)
    m, glns, layer_sizes = 4, 2, (8, 5, 3)
    z = (rng.normal(size=(n, d)) * rng.lognormal(0, 2, (n, 1))).astype(np.float32)
    z[0] = 0.0
    z[1, 3] = 3e4
    normals, offsets = sample_halfspaces(rng, glns * sum(layer_sizes) * m, d, 0.05)
    for t, p in zip(rng.integers(3, n, 30), rng.integers(0, len(offsets), 30), strict=True):
        offsets[p] = np.float32(z[t].astype(np.float64) @ normals[p].astype(np.float64))
    # A row the slices hold exactly, (1, -64, 64) in each element but the first, and a plane
    # along it: all the error is in the slice pairs the int8 products leave out.
    z[2] = 0.50390625
    z[2, 0] = 127.0
    normals[0] = z[2] / 128.0  # a norm just below 1
    expected = layer_contexts(np, z, normals, offsets, m, glns, layer_sizes, dots=cpu_exact_dots)
    gate_on_int8(monkeypatch)
    got = cuda_layer_contexts(cp.asarray(z), cp.asarray(normals), cp.asarray(offsets), m, glns,
                              layer_sizes)
    for layer, want in zip(got, expected, strict=True):
        np.testing.assert_array_equal(layer.get(), want)
    count = cp.full(1, 5, dtype=cp.int32)  # a list's count, which the bounds' launch zeroes
    products, tolerance = int8_products(cp.asarray(z), cp.asarray(normals), cp.asarray(offsets),
                                        count)
    assert int(count.get()[0]) == 0
    exact = z.astype(np.float64) @ normals.astype(np.float64).T
    error = np.abs(products.as_float32().get().astype(np.float64) - exact)
    assert np.all(error <= tolerance.get()[:, None])  # the bound holds on every product
    float32_bound = cp.empty(n, dtype=cp.float32)
    launch_rounding_tolerances(cp.asarray(z), float32_bound)
    rows = slice(3, None)  # the zero row, the huge one and the sliced one aside
    assert np.median(tolerance.get()[rows] / float32_bound.get()[rows]) < 0.5


@pytest.mark.parametrize("n", [0, 1, 300])
@pytest.mark.parametrize("frozen", [False, True], ids=["learning", "frozen"])
@pytest.mark.parametrize("shifted", [False, True], ids=["raw", "shifted"])
def test_cuda_standardize_equals_numpy_bit_for_bit(cp, n, frozen, shifted):
    """Before any data, constant features (the std floor), logits beyond the cap, statistics
    per row or one frozen set (prediction), of the rows themselves or of the rows less a
    shift."""
    from gln.kernels.cuda import cuda_standardize  # noqa: PLC0415

    rng = np.random.default_rng(n)
    d = 784
    x = rng.normal(2, 3, (n, d)) * rng.uniform(0.01, 10, d)
    x[:, 7] = 0.5  # constant: the std floor
    shift = x[0].copy() if shifted and n else (rng.normal(0, 3, d) if shifted else None)
    counts, sums, sums_sq, after = numpy_moments(np, RunningMoments(0, np.zeros(d), np.zeros(d)),
                                                 x, shift=shift)
    if n:
        x[n // 2, 9] = 1e4  # far beyond the logit cap, whichever statistics scale it
        x[n // 2, 11] = -3e38  # beyond float32 once scaled: bounded to -Z_LIMIT
    if frozen:
        counts, sums, sums_sq = (np.full((1, 1), float(after.count)), after.total[None],
                                 after.total_sq[None])
    expected = standardized(np, x, counts, sums, sums_sq, 0.3, 8.1, shift)
    seen = n > 1 or (n and frozen)  # some row is scaled by statistics of rows before it
    assert not seen or (np.abs(expected[1]) == np.float32(8.1)).any()
    assert not seen or frozen or expected[0][n // 2, 11] == np.float32(-Z_LIMIT)
    unseen = (counts == 0).ravel() if len(counts) == n else np.zeros(n, bool)
    assert not n or frozen or unseen[0]  # the first row learned has nothing before it: z = 0
    assert (expected[0][unseen] == 0).all() and (expected[1][unseen] == 0).all()
    got = cuda_standardize(*(cp.asarray(a) for a in (x, counts, sums, sums_sq)), 0.3, 8.1,
                           None if shift is None else cp.asarray(shift))
    np.testing.assert_array_equal(got[0].get(), expected[0])
    np.testing.assert_array_equal(got[1].get(), expected[1])


@pytest.mark.parametrize("n", [0, 1, 300])
@pytest.mark.parametrize("frozen", [False, True], ids=["learning", "frozen"])
@pytest.mark.parametrize("want_z", [True, False], ids=["z", "logits_only"])
def test_cuda_unit_scaling_matches_numpy_whatever_the_chunk(cp, n, frozen, want_z):
    """Inputs that are already probabilities: logits of the clipped inputs, and z divided by the
    pooled standard deviation (a row's own sum, so its bits do not depend on the chunk)."""
    from gln.kernels.cuda import cuda_unit_scaling  # noqa: PLC0415
    from gln.scaling import unit_scaled  # noqa: PLC0415

    rng = np.random.default_rng(n)
    d = 784
    x = rng.random((n, d))
    x[:, :30] = 0.0  # a blank border: clipped to eps, variance 0
    x[n // 2:, 40] = 3e38  # not a probability: its z is bounded to Z_LIMIT
    counts, sums, sums_sq, after = numpy_moments(np, RunningMoments(0, np.zeros(d), np.zeros(d)),
                                                 x)
    if frozen:
        counts, sums, sums_sq = (np.full((1, 1), float(after.count)), after.total[None],
                                 after.total_sq[None])
    args = (counts, sums, sums_sq, 0.1, 3e-4, want_z)
    want_z_value, want_logits = unit_scaled(np, x, *args)
    z, logits = cuda_unit_scaling(cp.asarray(x), *(cp.asarray(a) for a in args[:3]), *args[3:])
    np.testing.assert_allclose(logits.get(), want_logits, rtol=1e-6)
    if not want_z:
        assert z is None and want_z_value is None
        return
    np.testing.assert_allclose(z.get(), want_z_value, rtol=1e-6, atol=1e-6)
    if n > 1:
        t = n // 2
        rows = slice(0, 1) if frozen else slice(t, t + 1)
        alone, _ = cuda_unit_scaling(cp.asarray(x[t:t + 1]), cp.asarray(counts[rows]),
                                     cp.asarray(sums[rows]), cp.asarray(sums_sq[rows]), 0.1,
                                     3e-4)
        np.testing.assert_array_equal(alone.get()[0], z.get()[t])


@pytest.mark.parametrize(("n", "d"), [(1, 5), (7, 784), (130, 33)])
def test_cuda_rounding_tolerances_equal_the_array_code(cp, n, d):
    """The per-row bound that decides which margins are redone in float64 (one warp per row;
    the float64 sum runs in another order, so equal up to its rounding); the same launch zeroes
    the count of the margins the contexts kernel lists, where it is given one."""
    from gln.kernels.cuda_modules import GATING_THREADS, WARP, function  # noqa: PLC0415

    z = np.random.default_rng(d).normal(0, 3, (n, d)).astype(np.float32)
    for pending_count in (cp.full(1, 7, dtype=cp.int32), None):
        tolerance = cp.full(n, cp.nan, dtype=cp.float32)
        function("gating.cu", "gln_rounding_tolerances")(
            (-(-n * WARP // GATING_THREADS),), (GATING_THREADS,),
            (cp.asarray(z), np.int32(n), np.int32(d), np.float64(2.0 * dot_rounding_bound(d)),
             tolerance, pending_count),
        )
        np.testing.assert_allclose(tolerance.get(), rounding_tolerances(np, z), rtol=1e-6)
        if pending_count is not None:
            assert int(pending_count.get()[0]) == 0


@pytest.mark.parametrize("blurred", [False, True], ids=["plain", "blurred"])
def test_cuda_per_row_side_info_matches_numpy_whatever_the_chunk(cp, blurred):
    from gln.kernels.cuda import cuda_per_row_side_info  # noqa: PLC0415

    x = np.random.default_rng(4).random((300, 784))
    x[11] = 0.25  # a constant row: all zeros, not NaN
    blur = (gaussian_blur_matrix(28, 1.5),) * 2 if blurred else None
    on_gpu = None if blur is None else tuple(cp.asarray(b) for b in blur)
    z = cuda_per_row_side_info(cp.asarray(x), on_gpu).get()
    np.testing.assert_allclose(z, per_row_side_info(np, x, blur), rtol=1e-6, atol=1e-6)
    assert (z[11] == 0).all()
    alone = cuda_per_row_side_info(cp.asarray(x[7:8]), on_gpu).get()
    np.testing.assert_array_equal(alone[0], z[7])


@pytest.mark.parametrize("step", ["moments", "standardize", "unit", "per_row", "blurred"])
def test_float32_rows_scale_as_their_float64_widening_bit_for_bit(cp, step):
    """A long chunk's float32 rows go to the moments and scaling kernels as they came (the
    ``_f32`` entry points, each value read as the float64 it equals): every output is the
    widened rows' bit for bit, also for values that float32 rounds and beyond the clips."""
    import gln.kernels.cuda as cuda  # noqa: PLC0415

    rng = np.random.default_rng(3)
    n, d = 70, 784
    rows32 = (rng.normal(0.4, 2, (n, d)) * rng.uniform(0.01, 10, d)).astype(np.float32)
    rows32[5, :3] = [1e30, -1e30, 0.1]  # beyond the clips; 0.1 is not a float32 exactly
    moments = RunningMoments(0, np.zeros(d), np.zeros(d))
    counts, sums, sums_sq, _ = numpy_moments(np, moments, rows32.astype(np.float64),
                                             shift=rows32[0].astype(np.float64))

    def run(rows):
        on_gpu = cp.asarray(rows)
        if step == "moments":
            totals = RunningMoments(3, cp.zeros(d), cp.zeros(d))
            return cuda.moments_before_each_row(totals, on_gpu, shift=cp.asarray(
                rows32[0].astype(np.float64)))[:3]
        stats = tuple(cp.asarray(a) for a in (counts, sums, sums_sq))
        if step == "standardize":
            return cuda.cuda_standardize(on_gpu, *stats, 0.3, 8.1,
                                         cp.asarray(rows32[0].astype(np.float64)))
        if step == "unit":
            return cuda.cuda_unit_scaling(on_gpu, *stats, 0.3, 0.01)
        blur = tuple(cp.asarray(gaussian_blur_matrix(28, 1.5)) for _ in range(2))
        return (cuda.cuda_per_row_side_info(on_gpu, blur if step == "blurred" else None),)

    widened, as_sent = run(rows32.astype(np.float64)), run(rows32)
    for expected, got in zip(widened, as_sent, strict=True):
        np.testing.assert_array_equal(got.get(), expected.get())
    if hasattr(cp, "operations"):  # the emulated device counts them: the float32 kernel ran
        assert any(name.endswith("_f32") for name in cp.operations)


@pytest.mark.parametrize("bad", [None, (0, np.nan), (-1, np.inf), (700, -np.inf)])
def test_a_value_that_is_not_finite_is_flagged_wherever_it_lies(cp, bad, monkeypatch):
    """gln_flag_nonfinite, its grid (two blocks here) looping over the rest: a bad value first,
    last or anywhere sets the flag, clean rows leave it as it was."""
    import gln.kernels.cuda as cuda  # noqa: PLC0415

    monkeypatch.setattr(cuda, "NONFINITE_MAX_BLOCKS", 2)
    rows = np.random.default_rng(0).normal(0, 1e30, (40, 33)).astype(np.float32)
    if bad is not None:
        rows.flat[bad[0]] = bad[1]
    flag = cp.zeros(1, dtype=cp.int32)
    cuda.flag_nonfinite(cp.asarray(rows), flag)
    assert int(flag.get()[0]) == (bad is not None)
    cuda.flag_nonfinite(cp.asarray(np.zeros((3, 33), np.float32)), flag)
    assert int(flag.get()[0]) == (bad is not None)  # a clean chunk clears nothing


@pytest.mark.parametrize("from_probs", [False, True], ids=["base", "hidden"])
def test_cuda_layer_inputs_match_plain_cupy(cp, from_probs):
    from gln.kernels.cuda import cuda_layer_inputs  # noqa: PLC0415

    rng = np.random.default_rng(int(from_probs))
    shape = (300, 10, 128) if from_probs else (300, 1, 784)
    values = cp.asarray((rng.uniform(1e-4, 1 - 1e-4, shape) if from_probs
                         else rng.normal(0, 3, shape)).astype(np.float32))
    expected = with_bias(cp, values, 1.0, from_probs).get()
    got = cuda_layer_inputs(values, 1.0, from_probs).get()
    np.testing.assert_array_equal(got[:, :, 0], 1.0)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


def stream(n=1000, features=20, classes=3, seed=0, unit=False):
    """A labelled stream; with ``unit``, features squashed into (0, 1) like pixels."""
    rng = np.random.default_rng(seed)
    X = rng.normal(0, 1, (n, features)) * rng.uniform(0.5, 3, features) + rng.normal(0, 2,
                                                                                    features)
    y = (X[:, :classes] + rng.normal(0, 0.5, (n, classes))).argmax(axis=1)
    return (1.0 / (1.0 + np.exp(-X)) if unit else X), y


CONFIG = dict(num_features=20, num_classes=3, layer_sizes=(16, 16, 1), context_dim=4,
              learning_rate={"schedule": "inverse_time", "scale": 100, "cap": 0.01}, seed=3)
# Each input scaling and side information has its own kernels: standardised inputs, gating on
# per-row side information (centred, blurred 4 x 5 "images"), on windows of it, and inputs that
# are already probabilities (with and without per-row gating).
PER_ROW = dict(side_info="per_row", side_info_blur=1.0, image_shape=(4, 5))
SIDE_INFOS = [{}, PER_ROW, dict(PER_ROW, gating_window=2), dict(input_scaling="unit"),
              dict(PER_ROW, input_scaling="unit")]
SIDE_INFO_IDS = ["scaled", "per_row", "window", "unit", "unit_per_row"]


def stream_for(options, n=1000, seed=0):
    return stream(n, seed=seed, unit=options.get("input_scaling") == "unit")


@pytest.mark.parametrize("side_info", SIDE_INFOS, ids=SIDE_INFO_IDS)
def test_cuda_model_matches_cpu_model(cp, side_info):
    X, y = stream_for(side_info)
    config = {**CONFIG, **side_info}
    cpu, gpu = GLN(**config, device="cpu"), GLN(**config, device="cuda")
    assert isinstance(gpu.weights[0], cp.ndarray)
    np.testing.assert_allclose(gpu.learn(X, y), cpu.learn(X, y), atol=1e-4)
    X_test, _ = stream_for(side_info, 200, seed=1)
    np.testing.assert_allclose(gpu.predict_proba(X_test), cpu.predict_proba(X_test), atol=1e-4)
    for w_gpu, w_cpu in zip(gpu.weights, cpu.weights, strict=True):
        np.testing.assert_allclose(w_gpu.get(), w_cpu, atol=1e-4)
    np.testing.assert_allclose(gpu.moments.total.get(), cpu.moments.total, rtol=1e-12)
    assert gpu.examples_seen == cpu.examples_seen == len(X)


def test_a_model_of_more_features_than_registers_hold_learns_with_kernels(cp):
    """2,100 features (the first layer's rows beyond MAX_INPUTS): the CPU model's results, a
    chunk equal to its rows one call at a time, and short calls replayed from their graphs
    (the reference pass, which wide layers took before, could not be captured)."""
    import warnings  # noqa: PLC0415

    rng = np.random.default_rng(4)
    X, y = rng.normal(size=(40, 2100)), rng.integers(0, 2, 40)
    config = dict(num_features=2100, num_classes=2, layer_sizes=(3, 1), context_dim=2, seed=1)
    cpu, chunked, rows = (GLN(**config, device=d) for d in ("cpu", "cuda", "cuda"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a failed capture warns
        learned = chunked.learn(X, y)
        one_by_one = np.concatenate([rows.learn(X[t:t + 1], y[t:t + 1]) for t in range(40)])
        predicted = rows.predict_proba(X[:5])
    np.testing.assert_array_equal(one_by_one, learned)
    assert rows.to_bytes() == chunked.to_bytes()
    np.testing.assert_allclose(learned, cpu.learn(X, y), atol=1e-4)
    np.testing.assert_allclose(predicted, cpu.predict_proba(X[:5]), atol=1e-4)
    if hasattr(cp, "operations"):  # the emulated device counts them: the wide kernel ran
        assert cp.operations["kernel gln_layer_pass_wide"] > 0


def test_cuda_kernels_match_plain_cupy_path(cp):
    X, y = stream(300)
    fast, plain = GLN(**CONFIG, device="cuda"), GLN(**CONFIG, device="cuda", use_kernels=False)
    np.testing.assert_allclose(fast.learn(X, y), plain.learn(X, y), atol=1e-4)
    for w_fast, w_plain in zip(fast.weights, plain.weights, strict=True):
        np.testing.assert_allclose(w_fast.get(), w_plain.get(), atol=1e-4)


@pytest.mark.parametrize("side_info", SIDE_INFOS, ids=SIDE_INFO_IDS)
def test_cuda_learn_equals_single_row_calls_byte_for_byte(cp, side_info, monkeypatch):
    """Needs the sequential moments kernel in gln.scaling (CuPy's cumsum is a parallel scan).
    A chunk of 256 rows (the row kernel, from ROW_WARPS_MIN_ROWS; rows sent as float32) and one
    of 44 (streaming, rows widened on the host) against single rows (streaming, widened on the
    host)."""
    import gln.kernels.cuda as cuda  # noqa: PLC0415
    import gln.model  # noqa: PLC0415

    monkeypatch.setattr(gln.model, "CHUNK_ROWS_GPU", 256)
    monkeypatch.setattr(cuda, "ROW_WARPS_MIN_ROWS", 256)
    X, y = stream_for(side_info, 300)
    config = {**CONFIG, **side_info}
    chunked, rows = GLN(**config, device="cuda"), GLN(**config, device="cuda")
    chunk_probs = chunked.learn(X, y)
    row_probs = np.concatenate([rows.learn(X[t:t + 1], y[t:t + 1]) for t in range(len(X))])
    np.testing.assert_array_equal(row_probs, chunk_probs)
    assert rows.to_bytes() == chunked.to_bytes()


def test_a_unit_fixed_chunk_of_float32_rows_equals_its_rows_one_call_at_a_time(cp):
    """``"unit_fixed"`` scales in array code, which takes the rows widened: a chunk whose rows
    travel as float32 (more than ``HOST_WIDENED_ROWS``) is scaled from the float64 values
    they equal, as a short call's rows widened on the host are."""
    X, y = stream(100, seed=2, unit=True)
    config = {**CONFIG, "input_scaling": "unit_fixed"}
    chunked, rows = GLN(**config, device="cuda"), GLN(**config, device="cuda")
    chunk_probs = chunked.learn(X, y)
    row_probs = np.concatenate([rows.learn(X[t:t + 1], y[t:t + 1]) for t in range(len(X))])
    np.testing.assert_array_equal(row_probs, chunk_probs)
    assert rows.to_bytes() == chunked.to_bytes()
    assert (chunked.predict_proba(X).tobytes()
            == np.concatenate([rows.predict_proba(X[t:t + 1]) for t in range(len(X))]).tobytes())


def gate_on_int8(monkeypatch, min_rows: int | None = None) -> None:
    """Long chunks' gating products from int8 slices, from ``min_rows`` rows (by default from
    the float32 GEMM's shortest chunk, so that the tests' short chunks take them)."""
    import gln.kernels.cuda as cuda  # noqa: PLC0415

    monkeypatch.setattr(cuda, "GATING_PRODUCT", "int8")
    monkeypatch.setattr(cuda, "INT8_GATING_MIN_ROWS", min_rows or cuda.GATING_GEMM_MIN_ROWS)


@pytest.mark.parametrize("rows", [39, 40])
def test_int8_gating_starts_at_its_shortest_chunk(cp, rows, monkeypatch):
    """Chunks shorter than INT8_GATING_MIN_ROWS, where the float32 GEMM was faster, take it;
    from there on, the three int8 GEMMs; the same contexts either way."""
    import gln.kernels.cuda as cuda  # noqa: PLC0415
    from gln.kernels.cpu import cpu_exact_dots  # noqa: PLC0415

    rng = np.random.default_rng(rows)
    z = rng.normal(size=(rows, 24)).astype(np.float32)
    normals, offsets = sample_halfspaces(rng, 16, 24, 0.05)
    gate_on_int8(monkeypatch, min_rows=40)
    counted = getattr(cp, "operations", {})
    int8_gemms, float32_gemms = counted.get("cublas gemmEx", 0), counted.get("op matmul", 0)
    (got,) = cuda.cuda_layer_contexts(cp.asarray(z), cp.asarray(normals), cp.asarray(offsets),
                                      4, 1, (4,))
    (want,) = layer_contexts(np, z, normals, offsets, 4, 1, (4,), dots=cpu_exact_dots)
    np.testing.assert_array_equal(got.get(), want)
    if hasattr(cp, "operations"):  # the emulated device counts them
        assert cp.operations.get("cublas gemmEx", 0) == int8_gemms + (3 if rows >= 40 else 0)
        assert cp.operations.get("op matmul", 0) == float32_gemms + (0 if rows >= 40 else 1)


def test_int8_gating_leaves_planes_not_a_multiple_of_4_to_float32(cp, monkeypatch):
    """Three planes a neuron, 15 in all: cuBLAS's int8 GEMMs would want 16, so the float32
    GEMM decides them, to the same contexts."""
    import gln.kernels.cuda as cuda  # noqa: PLC0415
    from gln.kernels.cpu import cpu_exact_dots  # noqa: PLC0415

    rng = np.random.default_rng(4)
    z = rng.normal(size=(40, 24)).astype(np.float32)
    normals, offsets = sample_halfspaces(rng, 15, 24, 0.05)
    gate_on_int8(monkeypatch)
    gemms = getattr(cp, "operations", {}).get("cublas gemmEx", 0)
    (got,) = cuda.cuda_layer_contexts(cp.asarray(z), cp.asarray(normals), cp.asarray(offsets),
                                      3, 1, (5,))
    (want,) = layer_contexts(np, z, normals, offsets, 3, 1, (5,), dots=cpu_exact_dots)
    np.testing.assert_array_equal(got.get(), want)
    assert getattr(cp, "operations", {}).get("cublas gemmEx", 0) == gemms


@pytest.mark.parametrize("side_info", [{}, PER_ROW], ids=["scaled", "per_row"])
def test_int8_gating_learns_and_predicts_the_same_bytes(cp, side_info, monkeypatch):
    """A model whose long chunks gate on int8 slices learns and predicts exactly as one on the
    float32 GEMM: the same contexts, so the same bytes."""
    import gln.kernels.cuda as cuda  # noqa: PLC0415

    X, y = stream_for(side_info, 300)
    config = {**CONFIG, **side_info}
    monkeypatch.setattr(cuda, "GATING_PRODUCT", "float32")
    plain = GLN(**config, device="cuda")
    learned, predicted = plain.learn(X, y), plain.predict_proba(X)
    gate_on_int8(monkeypatch)
    sliced = GLN(**config, device="cuda")
    gemms_before = getattr(cp, "operations", {}).get("cublas gemmEx", 0)
    np.testing.assert_array_equal(sliced.learn(X, y), learned)
    np.testing.assert_array_equal(sliced.predict_proba(X), predicted)
    assert sliced.to_bytes() == plain.to_bytes()
    if hasattr(cp, "operations"):  # the emulated device counts them: the int8 GEMMs ran
        assert cp.operations["cublas gemmEx"] >= gemms_before + 6  # three a chunk


def test_a_model_cuts_its_hyperplanes_for_int8_once(cp, monkeypatch):
    """The hyperplanes never change, so a model cuts them into int8 slices on its first long
    chunk and keeps the cut (counted in ``nbytes``): later chunks cut only their rows, and
    predict the bytes of a model that cuts the planes afresh for every chunk."""
    import gln.kernels.cuda as cuda  # noqa: PLC0415
    import gln.staging as staging  # noqa: PLC0415

    X, y = stream(300)
    gate_on_int8(monkeypatch)
    monkeypatch.setattr(staging, "PREDICT_CHUNK_ROWS_GPU", 100)
    model = GLN(**CONFIG, device="cuda")
    afresh = GLN(**CONFIG, device="cuda")
    afresh._pipeline.layer_contexts = cuda.cuda_layer_contexts  # no cache: cut for every chunk
    before = model.nbytes
    assert model.learn(X[:40], y[:40]).tobytes() == afresh.learn(X[:40], y[:40]).tobytes()
    counted = getattr(cp, "operations", {})
    cuts = counted.get("kernel gln_int8_slices", 0)
    np.testing.assert_array_equal(model.predict_proba(X), afresh.predict_proba(X))
    np.testing.assert_array_equal(model.predict_proba(X), afresh.predict_proba(X))
    cut = model._pipeline.layer_contexts.nbytes
    planes, features = model.normals.shape
    assert cut >= planes * 3 * features  # three int8 slices of every normal
    assert model.nbytes == before + cut
    assert model.nbytes == GLN.estimate_nbytes(model.config_for_estimate())  # "cuda": the cut
    if hasattr(cp, "operations"):  # the emulated device counts them
        # Each model's six chunks' rows; the planes again for each of the afresh model's
        # chunks, and never for the model's, which cut them when it learned.
        assert cp.operations["kernel gln_int8_slices"] == cuts + 6 + 6 + 6


def test_the_int8_cut_follows_the_models_hyperplanes(cp):
    """A cut is kept for the arrays it was made from: other normals or offsets (a restore
    replaces them) are cut again, to their own slices."""
    from gln.kernels.int8_gating import Int8PlanesCache, int8_planes  # noqa: PLC0415

    rng = np.random.default_rng(8)
    normals, offsets = (cp.asarray(a) for a in sample_halfspaces(rng, 16, 24, 0.05))
    cache = Int8PlanesCache()
    assert cache.nbytes == 0
    first = cache.planes(normals, offsets)
    assert cache.planes(normals, offsets) is first
    assert cache.nbytes == first.nbytes > 0
    other_normals = normals * -1
    flipped = cache.planes(other_normals, offsets)
    assert flipped is not first
    np.testing.assert_array_equal(
        flipped.cut.slices.get(), int8_planes(other_normals, offsets).cut.slices.get())
    assert cache.planes(other_normals, offsets.copy()) is not flipped


def test_learning_with_a_warp_per_row_gives_the_same_bytes(cp, monkeypatch):
    """A model whose chunks learn with the row kernel (ROW_WARPS_MIN_ROWS) learns and
    predicts exactly as one with the library's kernels, over chunks long and short, and
    calls of two rows: launched, captured with the rows' ordering launches, replayed."""
    import gln.kernels.cuda as cuda  # noqa: PLC0415

    X, y = stream(306)
    cuts = [(0, 256), (256, 300), (300, 302), (302, 304), (304, 306)]
    usual = GLN(**CONFIG, device="cuda")
    learned = np.concatenate([usual.learn(X[a:b], y[a:b]) for a, b in cuts])
    monkeypatch.setattr(cuda, "ROW_WARPS_MIN_ROWS", 1)
    by_row = GLN(**CONFIG, device="cuda")
    counted = getattr(cp, "operations", {})
    launches, replays = counted.get("kernel gln_layer_pass_rows", 0), counted.get("graph launch", 0)
    np.testing.assert_array_equal(
        np.concatenate([by_row.learn(X[a:b], y[a:b]) for a, b in cuts]), learned)
    assert by_row.to_bytes() == usual.to_bytes()
    np.testing.assert_array_equal(by_row.predict_proba(X), usual.predict_proba(X))
    if hasattr(cp, "operations"):  # the emulated device counts them: one a layer and chunk
        layers = len(CONFIG["layer_sizes"])
        assert cp.operations["kernel gln_layer_pass_rows"] >= launches + 2 * layers
        assert cp.operations["graph launch"] >= replays + 1  # the last two-row call's


def test_snapshots_move_between_gpu_and_cpu(cp):
    X, y = stream(400)
    gpu = GLN(**CONFIG, device="cuda")
    gpu.learn(X, y)
    blob = gpu.to_bytes()
    on_cpu = GLN.from_bytes(blob, device="cpu")
    assert isinstance(on_cpu.weights[0], np.ndarray)
    for w_gpu, w_cpu in zip(gpu.weights, on_cpu.weights, strict=True):
        np.testing.assert_array_equal(w_gpu.get(), w_cpu)
    X_test, _ = stream(100, seed=5)
    np.testing.assert_allclose(on_cpu.predict_proba(X_test), gpu.predict_proba(X_test),
                               atol=1e-5)
    back = GLN.from_bytes(on_cpu.to_bytes(), device="cuda")
    assert isinstance(back.weights[0], cp.ndarray)
    copied = copy.deepcopy(gpu)  # a copy stays on the GPU
    assert isinstance(copied.weights[0], cp.ndarray) and copied.to_bytes() == blob
    buffer = SnapshotBuffer(gpu)  # the state copied from the device straight into a snapshot
    buffer.capture(gpu)
    assert bytes(buffer.seal()) == blob
    np.testing.assert_array_equal(back.predict_proba(X_test), gpu.predict_proba(X_test))
    # A model that started on the CPU carries on learning on the GPU.
    cpu = GLN(**CONFIG, device="cpu")
    cpu.learn(X[:200], y[:200])
    moved = GLN.from_bytes(cpu.to_bytes(), device="cuda")
    np.testing.assert_allclose(moved.learn(X[200:], y[200:]), cpu.learn(X[200:], y[200:]),
                               atol=1e-4)


def test_auto_device_picks_the_gpu(cp):
    model = GLN(**CONFIG, device="auto")
    assert isinstance(model.weights[0], cp.ndarray)
    assert "cuda" in repr(model)


@pytest.mark.skipif(GXX is None, reason="the emulated device needs g++ on PATH")
@pytest.mark.parametrize(("options", "most"), [
    ({}, 11), (PER_ROW, 12), (dict(input_scaling="unit"), 11),
    (dict(PER_ROW, input_scaling="unit"), 12),
], ids=["scaled", "per_row", "unit", "unit_per_row"])
def test_a_single_example_costs_a_handful_of_device_operations(options, most):
    """Each launch or copy costs the host microseconds, which a one-row call feels: learning one
    example is one copy in (the rows already widened), moments, scaling, the gating GEMM and two
    gating kernels, the first layer's inputs, each layer's pass (which writes the next layer's
    inputs), one copy out (counted on the emulated device, which counts what a GPU would run);
    prediction is no dearer."""
    X, y = stream_for(options, 3)
    with emulated_cupy_installed() as cp:
        model = GLN(**{**CONFIG, **options}, device="cuda")
        model.learn(X[:2], y[:2])
        cp.operations.clear()
        model.learn(X[2:], y[2:])
        learned = dict(cp.operations)
        cp.operations.clear()
        model.predict_proba(X[2:])
        predicted = dict(cp.operations)
    layers = len(CONFIG["layer_sizes"])
    assert learned["kernel gln_layer_pass_streaming"] == layers
    assert learned["kernel gln_layer_inputs"] == 1
    assert learned["copy host->device"] == learned["copy device->host"] == 1
    assert sum(learned.values()) <= most, learned
    assert sum(predicted.values()) <= most, predicted


@pytest.mark.skipif(GXX is None, reason="the emulated device needs g++ on PATH")
def test_a_long_chunks_float32_rows_reach_the_kernels_unwidened():
    """Chunks longer than HOST_WIDENED_ROWS travel as float32 rows, which the moments and
    scaling kernels read as they came: no launch widens them (counted on the emulated device,
    which counts what a GPU would run)."""
    X, y = stream(300)
    with emulated_cupy_installed() as cp:
        model = GLN(**CONFIG, device="cuda")
        model.learn(X[:200], y[:200])
        cp.operations.clear()
        model.learn(X[200:], y[200:])
        model.predict_proba(X)
        counted = dict(cp.operations)
    assert "op astype" not in counted, counted
    assert counted["kernel gln_running_moments_f32"] == 1
    assert counted["kernel gln_standardize_f32"] == 2


@pytest.mark.skipif(GXX is None, reason="the emulated device needs g++ on PATH")
def test_a_progress_bar_on_the_device_changes_nothing_learned(monkeypatch, capsys):
    """``learn(progress=True)`` learns in pieces of a few chunks (here 128, 128 and 5 rows, the
    last a short call, which takes the captured-graph path): the same outputs and bytes as one
    call."""
    import gln.model

    monkeypatch.setattr(gln.model, "CHUNK_ROWS_GPU", 16)  # pieces of 128 rows
    X, y = stream_for({}, 261)
    with emulated_cupy_installed():
        plain, shown = GLN(**CONFIG, device="cuda"), GLN(**CONFIG, device="cuda")
        expected = plain.learn(X, y)
        assert np.array_equal(shown.learn(X, y, progress=True), expected)
        assert shown.to_bytes() == plain.to_bytes()
    assert "261/261" in capsys.readouterr().err


def uncaptured(model):
    """The model with its short calls run launch by launch, never replayed."""
    model._staging.replays = None
    return model


def calls_of_every_kind(model, X, y):
    """Single rows, short batches of each size, a predict between learns, a long call: every
    output and the final bytes."""
    outputs, start = [], 0
    for rows in (1, 1, 1, 2, 2, 2, 8, 8, 8, 1, 9, 1, 3, 3, 3, 1, 1):
        outputs.append(model.learn(X[start:start + rows], y[start:start + rows]))
        outputs.append(model.predict_proba(X[start:start + 1]))
        start += rows
    outputs.append(model.learn(X[start:start + 40], y[start:start + 40]))
    outputs.append(model.predict_proba(X[:5]))
    outputs.append(model.predict_proba(X[:5]))
    return outputs, model.to_bytes()


@pytest.mark.parametrize("side_info", SIDE_INFOS, ids=SIDE_INFO_IDS)
def test_short_calls_replayed_from_their_graphs_equal_uncaptured_calls(cp, side_info):
    """From its third call on, a call of at most REPLAY_MAX_ROWS rows is a replay of the
    graph captured at its second; replays give the same bytes, and the moments and examples
    seen move on as they would."""
    X, y = stream_for(side_info, 100)
    config = {**CONFIG, **side_info}
    replaying = GLN(**config, device="cuda")
    want_outputs, want_bytes = calls_of_every_kind(uncaptured(GLN(**config, device="cuda")), X, y)
    outputs, blob = calls_of_every_kind(replaying, X, y)
    assert replaying._staging.replays.failure is None
    assert {(1, True), (2, True), (8, True), (3, True), (1, False), (5, False)} <= set(
        replaying._staging.replays._captured)
    for got, want in zip(outputs, want_outputs, strict=True):
        np.testing.assert_array_equal(got, want)
    assert blob == want_bytes


def test_calls_whose_rows_are_not_staged_are_not_replayed(cp, monkeypatch):
    """A replayed call's rows travel staged with its rates: where HOST_WIDENED_ROWS is below
    REPLAY_MAX_ROWS, longer short calls launch as long ones do, and capturing them fails not
    (which would stop the model replaying any call)."""
    import gln.staging  # noqa: PLC0415

    monkeypatch.setattr(gln.staging, "HOST_WIDENED_ROWS", 2)
    X, y = stream(40)
    model, reference = GLN(**CONFIG, device="cuda"), uncaptured(GLN(**CONFIG, device="cuda"))
    for rows in (1, 2, 5, 5, 5, 1, 2):
        start = model.examples_seen
        np.testing.assert_array_equal(
            model.learn(X[start:start + rows], y[start:start + rows]),
            reference.learn(X[start:start + rows], y[start:start + rows]))
        np.testing.assert_array_equal(model.predict_proba(X[:rows]),
                                      reference.predict_proba(X[:rows]))
    assert model._staging.replays.failure is None
    assert {rows for rows, _ in model._staging.replays._captured} == {1, 2}
    assert model.to_bytes() == reference.to_bytes()


def test_a_model_whose_arrays_are_replaced_captures_its_calls_again(cp):
    """A graph holds the addresses of the arrays it was captured with: after the model's
    arrays are replaced (as a restore does), its calls read and write the new ones."""
    X, y = stream(20)
    model, reference = GLN(**CONFIG, device="cuda"), uncaptured(GLN(**CONFIG, device="cuda"))
    for t in range(3):  # run, capture, replay
        np.testing.assert_array_equal(model.learn(X[t:t + 1], y[t:t + 1]),
                                      reference.learn(X[t:t + 1], y[t:t + 1]))
    old = model._staging.replays._captured[(1, True)]
    restored = GLN.from_bytes(reference.to_bytes(), device="cuda")
    model.weights, model.moments = restored.weights, restored.moments
    for t in range(3, 6):
        np.testing.assert_array_equal(model.learn(X[t:t + 1], y[t:t + 1]),
                                      reference.learn(X[t:t + 1], y[t:t + 1]))
    assert model._staging.replays._captured[(1, True)] is not old
    assert model.to_bytes() == reference.to_bytes()


class LaunchingAnotherCallMeanwhile:
    """A captured graph whose next launch, once launched, has another thread make ``call`` and
    waits a while for it to finish: the other call may not replay into the same buffers."""

    def __init__(self, graph, call):
        self.graph, self.call, self.other = graph, call, None

    def launch(self, stream=None):
        self.graph.launch(stream)
        if self.other is None:
            self.other = threading.Thread(target=self.call)
            self.other.start()
            self.other.join(timeout=0.5)


def test_two_threads_predicting_with_one_model_get_their_own_rows(cp):
    """Replays of a model share one staged buffer and one outputs array, so they take turns;
    a prediction made while another is being replayed gets its own rows' probabilities."""
    X, y = stream(40)
    model, reference = GLN(**CONFIG, device="cuda"), uncaptured(GLN(**CONFIG, device="cuda"))
    model.learn(X[:30], y[:30])
    reference.learn(X[:30], y[:30])
    for t in range(2):  # run, capture
        model.predict_proba(X[t:t + 1])
    results = {}
    captured = model._staging.replays._captured[(1, False)]
    captured.graph = LaunchingAnotherCallMeanwhile(
        captured.graph, lambda: results.setdefault("other", model.predict_proba(X[31:32])))
    mine = model.predict_proba(X[30:31])
    captured.graph.other.join()
    np.testing.assert_array_equal(mine, reference.predict_proba(X[30:31]))
    np.testing.assert_array_equal(results["other"], reference.predict_proba(X[31:32]))


@pytest.mark.skipif(GXX is None, reason="the emulated device needs g++ on PATH")
def test_a_replayed_single_example_is_one_copy_in_one_graph_launch_one_copy_out():
    """What the host does for a replayed one-row call, counted on the emulated device."""
    X, y = stream(6)
    with emulated_cupy_installed() as cp:
        model = GLN(**CONFIG, device="cuda")
        for t in range(2):  # run, then capture
            model.learn(X[t:t + 1], y[t:t + 1])
            model.predict_proba(X[t:t + 1])
        for t in range(2, 4):
            cp.operations.clear()
            model.learn(X[t:t + 1], y[t:t + 1])
            assert dict(cp.operations) == {"copy host->device": 1, "graph launch": 1,
                                           "copy device->host": 1}
            cp.operations.clear()
            model.predict_proba(X[t:t + 1])
            assert dict(cp.operations) == {"copy host->device": 1, "graph launch": 1,
                                           "copy device->host": 1}
    assert model.examples_seen == 4 and model.moments.count == 4


@pytest.mark.skipif(GXX is None, reason="the emulated device needs g++ on PATH")
def test_a_failed_capture_warns_and_leaves_the_calls_uncaptured(monkeypatch):
    """A one-row call that waits for the device on the way (a copy back to the host, which
    CUDA cannot capture) cannot be captured: the model says so once and runs its calls as
    before, same bytes."""
    import gln.kernels.cuda as cuda  # noqa: PLC0415

    launch = cuda.launch_rounding_tolerances

    def waiting(z, tolerance, pending_count=None):
        z.get()
        launch(z, tolerance, pending_count)

    monkeypatch.setattr(cuda, "launch_rounding_tolerances", waiting)
    X, y = stream(6)
    with emulated_cupy_installed():
        model, reference = GLN(**CONFIG, device="cuda"), uncaptured(GLN(**CONFIG, device="cuda"))
        np.testing.assert_array_equal(model.learn(X[:1], y[:1]), reference.learn(X[:1], y[:1]))
        with pytest.warns(RuntimeWarning, match="capture failed"):
            np.testing.assert_array_equal(model.learn(X[1:2], y[1:2]),
                                          reference.learn(X[1:2], y[1:2]))
        for t in range(2, 6):
            np.testing.assert_array_equal(model.learn(X[t:t + 1], y[t:t + 1]),
                                          reference.learn(X[t:t + 1], y[t:t + 1]))
        assert "during a stream capture" in model._staging.replays.failure
        assert model.to_bytes() == reference.to_bytes()


@pytest.mark.parametrize("classes", [2, 3])
def test_cuda_saliency_matches_the_cpu_model(cp, classes):
    """The collapsed weight product, gathered and multiplied on the device."""
    X, y = stream(200, classes=classes)
    config = {**CONFIG, "num_classes": classes}
    cpu, gpu = GLN(**config, device="cpu"), GLN(**config, device="cuda")
    cpu.learn(X, y)
    gpu.learn(X, y)
    maps, biases = gpu.saliency_terms(X[:6])
    want_maps, want_biases = cpu.saliency_terms(X[:6])
    assert isinstance(maps, np.ndarray) and maps.shape == (6, classes, 20)
    np.testing.assert_allclose(maps, want_maps, atol=1e-4)
    np.testing.assert_allclose(biases, want_biases, atol=1e-4)


def test_cuda_bad_input_and_prediction_change_nothing(cp):
    X, y = stream(40)
    model = GLN(**CONFIG, device="cuda")
    model.learn(X[:20], y[:20])
    blob = model.to_bytes()
    bad = X[20:].copy()
    bad[-1, 3] = np.nan  # the last row of the batch
    with pytest.raises(ValueError, match="row 19"):
        model.learn(bad, y[20:])
    with pytest.raises(ValueError, match="labels"):
        model.learn(X[20:], np.full(20, 3))
    model.predict_proba(X)
    model.saliency(X[:3])
    model.warm_up()
    assert model.to_bytes() == blob and model.examples_seen == 20


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16],
                         ids=["float32", "float64", "float16"])
def test_a_long_prediction_in_chunks_equals_one_chunk(cp, dtype, monkeypatch):
    """A long batch is predicted in chunks, each sent while the device runs the one before
    (float32 and float64 rows checked by the device, float16 by the host): the same bytes as one
    chunk, and a bad value in a later chunk, or one beyond float32, is named by its row in the
    batch, with nothing changed."""
    import gln.staging  # noqa: PLC0415

    X, y = stream(60)
    X = X.astype(dtype)
    model = GLN(**CONFIG, device="cuda")
    model.learn(X[:30], y[:30])
    whole = model.predict_proba(X)
    monkeypatch.setattr(gln.staging, "PREDICT_CHUNK_ROWS_GPU", 16)
    monkeypatch.setattr(gln.staging, "HOST_WIDENED_ROWS", 8)  # 16-row chunks go as float32 rows
    np.testing.assert_array_equal(model.predict_proba(X), whole)
    blob = model.to_bytes()
    for bad_value in (np.inf, np.nan, -1e39 if dtype == np.float64 else -np.inf):
        bad = X.copy()
        bad[37, 2] = bad_value
        with pytest.raises(ValueError, match="row 37, column 2"):
            model.predict_proba(bad)
    # A masked value is refused as on the CPU, whatever its data (the device would see none).
    masked = np.ma.array(X, mask=np.zeros(X.shape, bool))
    masked[37, 2] = np.ma.masked
    with pytest.raises(ValueError, match="masked values: row 37, column 2 is masked"):
        model.predict_proba(masked)
    assert model.to_bytes() == blob and model.examples_seen == 30


def long_predictions_in_chunks_of_16(monkeypatch) -> None:
    """Long predictions cut into chunks of 16 rows, each sent as it is (not widened by the
    host)."""
    import gln.staging  # noqa: PLC0415

    monkeypatch.setattr(gln.staging, "PREDICT_CHUNK_ROWS_GPU", 16)
    monkeypatch.setattr(gln.staging, "HOST_WIDENED_ROWS", 8)


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.int32])
def test_a_long_prediction_of_integer_rows_equals_that_of_their_floats(cp, dtype, monkeypatch):
    """Pixels as uint8 (and any dtype whose values are all float32) go to the device in their
    own bytes and predict, in chunks, the same bytes as the float32 rows of their values; other
    integers (int32) are converted by the host, as before."""
    import gln.kernels.uploads as uploads  # noqa: PLC0415
    import gln.staging  # noqa: PLC0415

    X, y = stream(60, unit=True)
    pixels = np.rint(X * 255).astype(dtype)
    model = GLN(**CONFIG, device="cuda")
    model.learn(pixels[:30].astype(np.float32), y[:30])
    long_predictions_in_chunks_of_16(monkeypatch)
    travelled = []

    def recorded(max_rows, num_features, dtype, source=None):
        travelled.append(dtype)
        return uploads.ChunkUploads(max_rows, num_features, dtype, source)

    monkeypatch.setattr(gln.staging, "ChunkUploads", recorded)
    as_floats = model.predict_proba(pixels.astype(np.float32))
    np.testing.assert_array_equal(model.predict_proba(pixels), as_floats)
    assert travelled == [np.float32] + ([dtype] if dtype != np.int32 else [])
    if hasattr(cp, "operations"):  # the emulated device counts them: no finite check
        cp.operations.clear()
        model.predict_proba(pixels)
        assert not any("nonfinite" in name for name in cp.operations), cp.operations


def test_cuda_constant_features_never_produce_nan(cp):
    model = GLN(**CONFIG, device="cuda")
    probs = model.learn(np.full((40, 20), 4.0), np.zeros(40, int))
    assert np.isfinite(probs).all()
    assert all(np.isfinite(w.get()).all() for w in model.weights)
    assert np.isfinite(model.predict_proba(np.full((1, 20), 1e6))).all()
