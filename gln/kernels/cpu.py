"""The CPU kernel: Algorithm 1 for one layer over a chunk, compiled with Numba.

Shaped for the cache: each thread owns whole neurons and runs them through every example of
the chunk, so a neuron's weights (2^m rows of I floats; 50 KB for 785 inputs and m = 4) stay in
the core's cache for the whole chunk instead of streaming ~4 MB of active weights per example
through memory. Neurons of a layer are independent given the layer's inputs, so the threads
need no synchronisation, and the result does not depend on the number of threads or on how a
stream is cut into chunks.

The kernel releases the GIL, so a server keeps answering while a model learns. Numba's
default threading layer must not be entered from two Python threads at once, so calls are
serialised by a lock (each call already uses every core). Small calls (a few examples of a
small network) run on one thread: waking a thread pool costs more than the work, and far more
on a busy machine. Every neuron runs the same compiled code whatever the thread count, so the
results do not depend on it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import numba
import numpy as np

_LOCK = threading.Lock()

# Multiply-adds per call (examples x neurons x inputs) below which one thread does the work:
# waking the pool's other threads costs more than they would take over, and more on a busy
# machine, where they wait for a core. One MNIST-sized example is about a million in its first
# layer (10 x 128 x 785) and 165,000 in its second.
PARALLEL_MIN_WORK = 100_000


@numba.njit(parallel=True, nogil=True, cache=True, fastmath={"reassoc", "contract", "nsz", "arcp"})
def _layer_pass(weights, contexts, inputs, targets, rates, pred_clip, weight_clip, learn, probs):
    n = contexts.shape[0]
    num_glns, num_neurons, _, num_inputs = weights.shape
    shared_inputs = inputs.shape[1] == 1
    one = np.float32(1.0)
    eps = np.float32(pred_clip)
    bound = np.float32(weight_clip)
    for neuron in numba.prange(num_glns * num_neurons):
        g = neuron // num_neurons
        k = neuron - g * num_neurons
        source = 0 if shared_inputs else g
        for t in range(n):
            w = weights[g, k, contexts[t, g, k]]
            x = inputs[t, source]
            mixed = np.float32(0.0)
            for j in range(num_inputs):
                mixed += w[j] * x[j]
            p = one / (one + np.exp(-mixed))
            p = min(max(p, eps), one - eps)
            probs[t, g, k] = p
            if learn:
                step = rates[t] * (p - targets[t, g])
                for j in range(num_inputs):
                    w[j] = min(max(w[j] - step * x[j], -bound), bound)


@contextlib.contextmanager
def threads_for(work: int) -> Iterator[None]:
    """Hold the kernel lock around a parallel Numba kernel; use one thread when ``work``
    (multiply-adds) is too small to share."""
    with _LOCK:
        threads = numba.get_num_threads()
        if work < PARALLEL_MIN_WORK:
            numba.set_num_threads(1)
        try:
            yield
        finally:
            numba.set_num_threads(threads)


def cpu_layer_pass(weights, contexts, inputs, targets, rates, pred_clip, weight_clip, learn, probs):
    """See ``gln.network.LayerPass``; arrays must be C-contiguous NumPy arrays."""
    work = contexts.shape[0] * weights.shape[0] * weights.shape[1] * weights.shape[3]
    with threads_for(work):
        _layer_pass(
            weights, contexts, inputs, targets, rates,
            np.float32(pred_clip), np.float32(weight_clip), bool(learn), probs,
        )


# No fastmath here: the float64 sums must run in a fixed order.
@numba.njit(nogil=True, cache=True)
def _exact_dots(z, normals, rows, planes, out):
    for k in range(rows.shape[0]):
        total = 0.0
        for i in range(z.shape[1]):
            total += np.float64(z[rows[k], i]) * np.float64(normals[planes[k], i])
        out[k] = total


def cpu_exact_dots(z, normals, rows, planes):
    """``gln.gating.exact_dots`` without gathering float64 copies of the rows it needs."""
    out = np.empty(rows.shape[0], dtype=np.float64)
    _exact_dots(z, normals, rows, planes, out)
    return out
