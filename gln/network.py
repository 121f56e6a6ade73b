"""Layers of gated geometric mixers and their online update: the paper's Algorithm 1.

Shapes (G = number of one-vs-all GLNs, K = neurons in a layer, m = context dimension,
I = inputs to the layer including the bias input):

* ``weights``  (G, K, 2^m, I) float32: row ``w[g, k, c]`` is neuron (g, k)'s weight vector in
  context c. Column 0 multiplies the bias input ``logit(beta)``.
* ``contexts`` (n, G, K) int32: the active context of every neuron for every example.
* ``inputs``   (n, 1 or G, I) float32: logits of the layer's inputs, bias first. Layer 1 reads
  the base predictions, shared by every class (middle axis 1); later layers read their own
  GLN's previous layer.
* ``targets``  (n, G) float32 in {0, 1}; ``rates`` (n,) float32.

For one example and one neuron (Algorithm 1, lines 10-13):

    p   = clip(sigmoid(w_c . x), eps, 1 - eps)
    w_c = clip(w_c - rate * (p - target) * x, -b, b)

The update uses the clipped p, as the paper's analytic gradient does, so a saturated neuron
still learns. Each neuron at step t depends only on its own weights, the layer's inputs at t
and the target, so a chunk may be processed layer by layer (every example through layer 1,
then every example through layer 2, ...) and still equal strict per-example learning.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Protocol


class LayerPass(Protocol):
    """Runs one layer over a chunk of examples, writing each example's outputs to ``probs``."""

    def __call__(
        self,
        weights: Any,
        contexts: Any,
        inputs: Any,
        targets: Any,
        rates: Any,
        pred_clip: float,
        weight_clip: float,
        learn: bool,
        probs: Any,
    ) -> None: ...


def reference_layer_pass(xp: ModuleType) -> LayerPass:
    """Algorithm 1 for one layer in plain array code, one example at a time.

    This is the specification the fused kernels are tested against, and the fallback where
    no kernel exists for a device.
    """

    def layer_pass(weights, contexts, inputs, targets, rates, pred_clip, weight_clip, learn, probs):
        num_glns, num_neurons = weights.shape[:2]
        glns = xp.arange(num_glns)[:, None]
        neurons = xp.arange(num_neurons)[None, :]
        for t in range(contexts.shape[0]):
            active = weights[glns, neurons, contexts[t]]  # (G, K, I): w_{ij c_ij(z)}
            x = inputs[t][:, None, :]  # (G or 1, 1, I): logit(p_{i-1})
            p = 1.0 / (1.0 + xp.exp(-(active * x).sum(axis=-1)))
            p = xp.clip(p, pred_clip, 1.0 - pred_clip).astype(xp.float32)
            probs[t] = p
            if learn:
                step = rates[t] * (p - targets[t][:, None])  # eta * (p_ij - x)
                updated = active - step[..., None] * x
                weights[glns, neurons, contexts[t]] = xp.clip(updated, -weight_clip, weight_clip)

    return layer_pass


def network_pass(
    xp: ModuleType,
    layer_pass: LayerPass,
    weights: list[Any],
    contexts: list[Any],
    base_logits: Any,
    targets: Any,
    rates: Any,
    *,
    bias_logit: float,
    pred_clip: float,
    weight_clip: float,
    learn: bool,
) -> Any:
    """Every layer over a chunk; returns the last layer's outputs (n, G) float32.

    ``base_logits`` (n, d) are the logits of the base predictions p_0 (without the bias).
    """
    n = base_logits.shape[0]
    inputs = with_bias(xp, base_logits[:, None, :], bias_logit, False)
    probs = None
    for depth, (layer_weights, layer_contexts) in enumerate(zip(weights, contexts, strict=True)):
        if depth:  # the logits of the layer below are this layer's inputs
            inputs = with_bias(xp, probs, bias_logit, True)
        num_glns, num_neurons = layer_weights.shape[-4:-2]  # behind a family's members axis
        probs = xp.empty((n, num_glns, num_neurons), dtype=xp.float32)
        layer_pass(
            layer_weights, layer_contexts, inputs, targets, rates,
            pred_clip, weight_clip, learn, probs,
        )
    return probs[..., 0]


def with_bias(xp: ModuleType, values: Any, bias_logit: float, from_probs: bool) -> Any:
    """(n, G, K) logits, or probabilities when ``from_probs``, -> (n, G, K + 1) float32 layer
    inputs: the bias logit first, then the logits."""
    inputs = xp.empty((*values.shape[:2], values.shape[2] + 1), dtype=xp.float32)
    inputs[..., 0] = bias_logit
    if from_probs:  # log(p / (1 - p)) in one temporary: a few-row call is mostly such calls
        ratio = 1.0 - values
        xp.divide(values, ratio, out=ratio)
        values = xp.log(ratio, out=ratio)
    inputs[..., 1:] = values
    return inputs


def reference_family_layer_pass(xp: ModuleType) -> Any:
    """One layer over a chunk of rows of many members, in plain array code: the specification
    of ``gln.kernels.cpu_family``.

    ``weights`` (M, G, K, 2^m, I) float32, ``members`` (n,) int64: row t reads and updates
    ``weights[members[t]]``; the rest as ``gln.network.LayerPass``. Each row is
    ``gln.network.reference_layer_pass`` on that row alone and its member's weights (a view,
    updated in place), so each member's weights and outputs are the reference's bytes for its
    rows."""
    layer_pass = reference_layer_pass(xp)

    def family_layer_pass(weights, members, contexts, inputs, targets, rates, pred_clip,
                          weight_clip, learn, probs):
        for t in range(contexts.shape[0]):
            row = slice(t, t + 1)
            layer_pass(weights[int(members[t])], contexts[row], inputs[row], targets[row],
                       rates[row], pred_clip, weight_clip, learn, probs[row])

    return family_layer_pass
