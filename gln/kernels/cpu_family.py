"""The CPU kernels of a family of models (``gln.family``): one layer pass, and one fold of the
running input statistics, over a chunk whose rows belong to many members.

Both deviate from the single model's kernels (``gln.kernels.cpu``, ``gln.kernels.cpu_scaling``)
in one thing only: each row reads and updates the state of its own member, ``members[t]``, in
the stacked arrays (weights (M, G, K, 2^m, I), statistics (M, d)). Rows of one member are taken
in their order and rows of different members touch different memory, so every member sees the
float operations a model of its own would make on its rows, in the same order:

* the layer pass is ``gln.kernels.cpu._layer_pass`` with the weights indexed by member: the
  same blocks of four neurons, the same inlined mixing and update (fast-math, as there), so
  each neuron's sums vectorise as they do in the single model's kernel. That is what the
  compiler should do with the same loop, not what it promises: a process checks once that the
  two kernels agree on its CPU (``family_pass_agrees``), and where they do not the family runs
  the single model's kernel on each member's rows instead (``cpu_family_layer_pass``);
* the fold is ``gln.kernels.cpu_scaling._moments`` with each member's sums, without fast-math:
  NumPy's cumsum, one row at a time, bit for bit.
"""

from __future__ import annotations

import functools

import numba
import numpy as np

from gln.kernels.cpu import (
    _FASTMATH,
    _LOCK,
    NEURONS_PER_BLOCK,
    _clipped_sigmoid,
    _layer_pass,
    _mix,
    _mix4,
    _update,
    _update4,
    cpu_layer_pass,
    threaded_kernel,
)


@threaded_kernel(nogil=True, cache=True, fastmath=_FASTMATH)
def _family_layer_pass(weights, members, contexts, inputs, targets, rates, pred_clip,
                       weight_clip, learn, probs):
    n = contexts.shape[0]
    _, num_glns, num_neurons, _, _ = weights.shape
    shared_inputs = inputs.shape[1] == 1
    eps = np.float32(pred_clip)
    bound = np.float32(weight_clip)
    blocks = (num_neurons + NEURONS_PER_BLOCK - 1) // NEURONS_PER_BLOCK
    for block in numba.prange(num_glns * blocks):
        g = block // blocks
        k0 = (block - g * blocks) * NEURONS_PER_BLOCK
        source = 0 if shared_inputs else g
        if k0 + NEURONS_PER_BLOCK <= num_neurons:
            for t in range(n):
                member = members[t]  # whose weights this row reads and updates
                x = inputs[t, source]
                w0 = weights[member, g, k0, contexts[t, g, k0]]
                w1 = weights[member, g, k0 + 1, contexts[t, g, k0 + 1]]
                w2 = weights[member, g, k0 + 2, contexts[t, g, k0 + 2]]
                w3 = weights[member, g, k0 + 3, contexts[t, g, k0 + 3]]
                m0, m1, m2, m3 = _mix4(w0, w1, w2, w3, x)
                p0, p1 = _clipped_sigmoid(m0, eps), _clipped_sigmoid(m1, eps)
                p2, p3 = _clipped_sigmoid(m2, eps), _clipped_sigmoid(m3, eps)
                probs[t, g, k0], probs[t, g, k0 + 1] = p0, p1
                probs[t, g, k0 + 2], probs[t, g, k0 + 3] = p2, p3
                if learn:  # each neuron's step: eta * (p - target)
                    rate, target = rates[t], targets[t, g]
                    _update4(w0, w1, w2, w3, x, rate * (p0 - target), rate * (p1 - target),
                             rate * (p2 - target), rate * (p3 - target), bound)
        else:  # the last neurons of a layer whose size is no multiple of the block
            for k in range(k0, num_neurons):
                for t in range(n):
                    w = weights[members[t], g, k, contexts[t, g, k]]
                    x = inputs[t, source]
                    p = _clipped_sigmoid(_mix(w, x), eps)
                    probs[t, g, k] = p
                    if learn:
                        _update(w, x, rates[t] * (p - targets[t, g]), bound)


def cpu_family_layer_pass(
    weights: np.ndarray, members: np.ndarray, contexts: np.ndarray, inputs: np.ndarray,
    targets: np.ndarray, rates: np.ndarray, pred_clip: float, weight_clip: float, learn: bool,
    probs: np.ndarray,
) -> None:
    """``gln.network.reference_family_layer_pass`` compiled: ``weights`` (M, G, K, 2^m, I),
    ``members`` (n,) int64, the rest as ``gln.network.LayerPass``; C-contiguous NumPy arrays.

    Each member's weights and outputs are the bytes ``gln.kernels.cpu.cpu_layer_pass`` gives
    on that member's rows alone."""
    if not family_pass_agrees():
        _pass_member_by_member(weights, members, contexts, inputs, targets, rates, pred_clip,
                               weight_clip, learn, probs)
        return
    # Both builds give the single model's parallel kernel's bytes (family_pass_agrees), which
    # is what a single model gives at any size: either may run.
    _family_layer_pass(contexts.size * weights.shape[4], weights, members, contexts, inputs,
                       targets, rates, float(pred_clip), float(weight_clip), bool(learn), probs)


def _pass_member_by_member(weights, members, contexts, inputs, targets, rates, pred_clip,
                           weight_clip, learn, probs):
    """The single model's kernel on each member's rows, in their order: the family's pass
    where its own kernel does not give that kernel's bytes."""
    for member in np.unique(members):
        rows = np.flatnonzero(members == member)
        out = np.empty((len(rows), *probs.shape[1:]), dtype=np.float32)
        cpu_layer_pass(weights[member], contexts[rows], inputs[rows], targets[rows],
                       rates[rows], pred_clip, weight_clip, learn, out)
        probs[rows] = out


@functools.cache
def family_pass_agrees() -> bool:
    """Whether both builds of the family's layer pass give, on this CPU, each member the bytes
    the single model's parallel kernel gives on that member's rows alone (which is what a
    single model gives, whichever build runs it: ``gln.kernels.cpu.layer_pass_twins_agree``),
    learning and predicting, on layers whose sizes leave vector remainders and a block of
    fewer than four neurons. Checked once per process."""
    rng = np.random.default_rng(0)
    for glns, neurons, inputs, shared in ((1, 9, 21, True), (2, 6, 77, False)):
        size, n, contexts = 3, 11, 16
        weights = rng.uniform(-0.2, 0.2, (size, glns, neurons, contexts, inputs))
        weights = weights.astype(np.float32)
        members = rng.integers(0, size, n).astype(np.int64)
        ctx = rng.integers(0, contexts, (n, glns, neurons)).astype(np.int32)
        x = rng.normal(0, 2, (n, 1 if shared else glns, inputs)).astype(np.float32)
        targets = rng.integers(0, 2, (n, glns)).astype(np.float32)
        rates = rng.uniform(0.001, 0.1, n).astype(np.float32)
        for learn in (True, False):
            expected_weights = weights.copy()
            expected = np.empty((n, glns, neurons), np.float32)
            for member in range(size):
                rows = np.flatnonzero(members == member)
                out = np.empty((len(rows), glns, neurons), np.float32)
                with _LOCK:
                    _layer_pass.parallel(expected_weights[member], ctx[rows], x[rows],
                                         targets[rows], rates[rows], 0.01, 5.0, learn, out)
                expected[rows] = out
            for kernel in _family_layer_pass.dispatchers:
                w, probs = weights.copy(), np.empty((n, glns, neurons), np.float32)
                with _LOCK:
                    kernel(w, members, ctx, x, targets, rates, 0.01, 5.0, learn, probs)
                if (w.tobytes(), probs.tobytes()) != (expected_weights.tobytes(),
                                                       expected.tobytes()):
                    return False
    return True


@numba.njit(nogil=True, cache=True)
def _family_moments(members, x64, shifts, counts_in, totals, totals_sq, counts, sums, sums_sq):
    # gln.kernels.cpu_scaling._moments with each row's member's sums: row t sees its member's
    # totals as they stand, then adds its x - shift and its square to them, in place.
    n, d = x64.shape
    for t in range(n):
        member = members[t]
        counts[t, 0] = np.float64(counts_in[member])
        counts_in[member] += 1
        for i in range(d):
            sums[t, i] = totals[member, i]
            sums_sq[t, i] = totals_sq[member, i]
            centred = x64[t, i] - shifts[member, i]
            totals[member, i] += centred
            totals_sq[member, i] += centred * centred


def cpu_family_moments(
    members: np.ndarray, x64: np.ndarray, shifts: np.ndarray, member_counts: np.ndarray,
    totals: np.ndarray, totals_sq: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``gln.scaling.family_moments_before_each_row`` for float64 NumPy arrays, bit for bit:
    each row's count (n, 1), sums (n, d) and sums of squares (n, d) of its member's rows
    before it; ``member_counts`` (M,) int64 and ``totals`` / ``totals_sq`` (M, d) are
    advanced in place."""
    n, d = x64.shape
    counts, sums, sums_sq = np.empty((n, 1)), np.empty((n, d)), np.empty((n, d))
    _family_moments(members, x64, shifts, member_counts, totals, totals_sq, counts, sums,
                    sums_sq)
    return counts, sums, sums_sq
