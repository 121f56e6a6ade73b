"""Random data for one GLN layer over a chunk, shared by the kernel tests."""

import numpy as np


def random_layer(rng, glns, neurons, contexts, inputs, n, shared, repeat=0.5):
    """Well-conditioned random layer data; contexts repeat with probability ``repeat``.

    Returns weights (G, K, S, I), contexts (n, G, K), inputs (n, 1 or G, I), targets (n, G)
    and rates (n,), with the dtypes the layer passes take.
    """
    w = (rng.uniform(-1, 1, (glns, neurons, contexts, inputs)) / np.sqrt(inputs)).astype(
        np.float32)
    ctx = rng.integers(0, contexts, (n, glns, neurons)).astype(np.int32)
    for t in range(1, n):  # runs of one context exercise the in-register hand-over
        same = rng.random((glns, neurons)) < repeat
        ctx[t][same] = ctx[t - 1][same]
    x = rng.normal(0, 2, (n, 1 if shared else glns, inputs)).astype(np.float32)
    targets = rng.integers(0, 2, (n, glns)).astype(np.float32)
    rates = rng.uniform(0.001, 0.1, n).astype(np.float32)
    return w, ctx, x, targets, rates
