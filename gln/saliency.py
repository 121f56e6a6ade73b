"""Saliency: the paper's linear interpretability of a GLN.

For a given input z, every neuron's active weight vector is fixed, and the network is a
product of linear maps in logit space: the output logit is W_L(z) ... W_1(z) . logit(p0) plus
a constant term from the bias inputs. The collapsed product is the saliency map: how much each
input's base logit moves each class's output logit for that row.

>>> import numpy as np
>>> from gln import GLN
>>> model = GLN(num_features=3, num_classes=2, layer_sizes=(4, 1), seed=0)
>>> _ = model.learn(np.eye(3), [0, 1, 1])
>>> maps = model.saliency(np.eye(3))
>>> maps.shape                                  # (rows, classes, features)
(3, 2, 3)
>>> bool((maps[:, 0] == -maps[:, 1]).all())     # binary: class 0's map is class 1's, negated
True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gln.backend import to_numpy
from gln.pipeline import Pipeline
from gln.staging import chunk_bounds
from gln.state import State


def saliency_terms(
    pipeline: Pipeline, state: State, X32: np.ndarray, chunk_rows: int,
    given: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Saliency maps (n, C, d) and the bias terms (n, C) that complete the output logit, of
    checked rows ``X32`` (``GLN.saliency`` says what they are; ``given``: their checked side
    information, for ``side_info="given"``), ``chunk_rows`` rows at a time through the
    model's scaling and contexts; learns nothing."""
    xp, config = pipeline.xp, pipeline.config
    maps, biases = [], []
    for start, stop in chunk_bounds(len(X32), chunk_rows):
        chunk = X32[start:stop]
        x64 = xp.asarray(chunk, dtype=xp.float64)
        count = xp.full((1, 1), float(state.moments.count))
        side = None if given is None else xp.asarray(given[start:stop])
        z, _, _ = pipeline.scale(state, x64, count, learning=False, side_info=side)
        contexts = pipeline.contexts(state, z)
        for t in range(len(chunk)):
            chunk_map, chunk_bias = _collapse(xp, state.weights, contexts, t,
                                              config.bias_logit)
            maps.append(to_numpy(chunk_map))
            biases.append(to_numpy(chunk_bias))
    if not maps:
        return (np.zeros((0, config.num_classes, config.num_features)),
                np.zeros((0, config.num_classes)))
    maps_g, biases_g = np.stack(maps), np.stack(biases)
    if config.num_glns == 1:
        return (np.concatenate([-maps_g, maps_g], axis=1),
                np.concatenate([-biases_g, biases_g], axis=1))
    return maps_g, biases_g


def _collapse(
    xp: Any, weights: list[Any], contexts: list[Any], t: int, bias_logit: float
) -> tuple[Any, Any]:
    """W_L(z) ... W_1(z) over feature columns, and the bias term, for row t: (G, d), (G,).

    Multiplied from the output down: the output neuron's row times each layer below keeps
    one row per GLN in hand, so a layer costs a vector-matrix product, not a matrix
    product (for the MNIST network 1.2 million multiply-adds a row instead of 130 million).
    """
    glns = xp.arange(weights[0].shape[0])[:, None]
    row = bias_term = None  # (G, 1, K) and (G, 1): the output's logit in this layer's terms
    for layer_weights, layer_contexts in zip(weights[::-1], contexts[::-1], strict=True):
        neurons = xp.arange(layer_weights.shape[1])[None, :]
        active = layer_weights[glns, neurons, layer_contexts[t]].astype(xp.float64)
        from_bias = active[:, :, :1] * bias_logit  # (G, K, 1)
        if row is None:
            row, bias_term = active[:, :, 1:], from_bias[:, :, 0]
        else:
            bias_term = bias_term + (row @ from_bias)[:, :, 0]
            row = row @ active[:, :, 1:]
    return row[:, 0, :], bias_term[:, 0]
