"""The CPU kernel: Algorithm 1 for one layer over a chunk, compiled with Numba.

Shaped for the cache: each thread owns whole neurons and runs them through every example of
the chunk, so a neuron's weights (2^m rows of I floats; 50 KB for 785 inputs and m = 4) stay in
the core's cache for the whole chunk instead of streaming ~4 MB of active weights per example
through memory. Neurons of a layer are independent given the layer's inputs, so the threads
need no synchronisation, and the result does not depend on the number of threads or on how a
stream is cut into chunks.

Numba's default threading layer must not be entered from two Python threads at once, so
calls are serialised by a lock (each call already uses every core).
"""

from __future__ import annotations

import threading

import numba
import numpy as np

_LOCK = threading.Lock()


@numba.njit(parallel=True, cache=True, fastmath={"reassoc", "contract", "nsz", "arcp"})
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


def cpu_layer_pass(weights, contexts, inputs, targets, rates, pred_clip, weight_clip, learn, probs):
    """See ``gln.network.LayerPass``; arrays must be C-contiguous NumPy arrays."""
    with _LOCK:
        _layer_pass(
            weights, contexts, inputs, targets, rates,
            np.float32(pred_clip), np.float32(weight_clip), bool(learn), probs,
        )
