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


class SaliencyMixin:
    """The saliency part of ``gln.model.GLN``: the maps of a batch, computed from the model's
    weights and the contexts of its rows (``_scale`` and ``_contexts``); learns nothing."""

    def saliency(self, X: Any) -> np.ndarray:
        """The collapsed weight product W_L(z) ... W_1(z) for each row and class.

        Shape (n, num_classes, num_features): entry [t, c, j] is how much the logit of base
        prediction j moves class c's output logit for row t (paper, section "Linear
        interpretability"). Bias inputs are not features: they enter as a constant term, so
        where no output is clipped, ``sigmoid(S[t, c] . logit(p0[t]) + bias_term[t, c])``
        equals the GLN's output (see ``saliency_terms``). For a binary model class 0's map
        is the negative of class 1's. With more than two classes, class c's map is that of
        its one-vs-all network's output logit, before ``predict_proba`` divides the networks'
        outputs by their sum: it is not the slope of ``predict_proba``'s log-odds.
        """
        maps, _ = self.saliency_terms(X)
        return maps

    def saliency_terms(self, X: Any) -> tuple[np.ndarray, np.ndarray]:
        """Saliency maps (n, C, d) and the bias terms (n, C) that complete the output logit."""
        X32, _ = self.check_input(X)
        xp = self._xp
        maps, biases = [], []
        for start, stop in self._chunk_bounds(len(X32)):
            chunk = X32[start:stop]
            x64 = xp.asarray(chunk, dtype=xp.float64)
            count = xp.full((1, 1), float(self.moments.count))
            z, _, _ = self._scale(x64, count, learning=False)
            contexts = self._contexts(z)
            for t in range(len(chunk)):
                chunk_map, chunk_bias = self._collapse(contexts, t)
                maps.append(to_numpy(chunk_map))
                biases.append(to_numpy(chunk_bias))
        if not maps:
            return (np.zeros((0, self.num_classes, self.num_features)),
                    np.zeros((0, self.num_classes)))
        maps_g, biases_g = np.stack(maps), np.stack(biases)
        if self.num_glns == 1:
            return (np.concatenate([-maps_g, maps_g], axis=1),
                    np.concatenate([-biases_g, biases_g], axis=1))
        return maps_g, biases_g

    def _collapse(self, contexts: list[Any], t: int) -> tuple[Any, Any]:
        """W_L(z) ... W_1(z) over feature columns, and the bias term, for row t: (G, d), (G,).

        Multiplied from the output down: the output neuron's row times each layer below keeps
        one row per GLN in hand, so a layer costs a vector-matrix product, not a matrix
        product (for the MNIST network 1.2 million multiply-adds a row instead of 130 million).
        """
        xp = self._xp
        glns = xp.arange(self.num_glns)[:, None]
        row = bias_term = None  # (G, 1, K) and (G, 1): the output's logit in this layer's terms
        for layer_weights, layer_contexts in zip(self.weights[::-1], contexts[::-1], strict=True):
            neurons = xp.arange(layer_weights.shape[1])[None, :]
            active = layer_weights[glns, neurons, layer_contexts[t]].astype(xp.float64)
            from_bias = active[:, :, :1] * self._bias_logit  # (G, K, 1)
            if row is None:
                row, bias_term = active[:, :, 1:], from_bias[:, :, 0]
            else:
                bias_term = bias_term + (row @ from_bias)[:, :, 0]
                row = row @ active[:, :, 1:]
        return row[:, 0, :], bias_term[:, 0]
