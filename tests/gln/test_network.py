"""The neuron maths of Algorithm 1: geometric mixing, its gradient, clipping, projection."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from gln.kernels import layer_pass_for
from gln.network import reference_layer_pass
from tests.gln.layer_data import random_layer


def logit(p):
    return np.log(p / (1 - p))


def sigmoid(a):
    return 1 / (1 + np.exp(-a))


probabilities = arrays(np.float64, 5, elements=st.floats(0.01, 0.99))
weights = arrays(np.float64, 5, elements=st.floats(-3, 3))


@settings(max_examples=200, deadline=None)
@given(p=probabilities, w=weights)
def test_geometric_mixing_is_a_normalised_product_of_experts(p, w):
    """Paper, section 2: sigma(w . logit(p)) = prod p^w / (prod p^w + prod (1-p)^w)."""
    product = np.prod(p**w)
    expected = product / (product + np.prod((1 - p) ** w))
    assert sigmoid(w @ logit(p)) == pytest.approx(expected, rel=1e-9)


@settings(max_examples=100, deadline=None)
@given(p=probabilities, w=weights, target=st.integers(0, 1))
def test_loss_gradient_matches_numerical_gradient(p, w, target):
    """Paper eq. (grad_loss): d/dw -log geo_w(x; p) = (geo_w(1; p) - x) logit(p)."""

    def loss(weights):  # -log sigma(a) = log(1 + e^-a), -log(1 - sigma(a)) = log(1 + e^a)
        a = weights @ logit(p)
        return np.logaddexp(0.0, -a if target == 1 else a)

    analytic = (sigmoid(w @ logit(p)) - target) * logit(p)
    h = 1e-6
    numerical = np.array([(loss(w + h * e) - loss(w - h * e)) / (2 * h) for e in np.eye(5)])
    np.testing.assert_allclose(analytic, numerical, rtol=1e-5, atol=1e-7)


def one_layer(inputs, weights_row, target, rate, pred_clip=0.01, weight_clip=5.0, kernel=False):
    """Run a single neuron with a single context through one example; returns (p, new row)."""
    xp_pass = layer_pass_for(np, use_kernels=kernel)
    w = np.asarray(weights_row, np.float32).reshape(1, 1, 1, -1).copy()
    contexts = np.zeros((1, 1, 1), np.int32)
    x = np.asarray(inputs, np.float32).reshape(1, 1, -1)
    probs = np.empty((1, 1, 1), np.float32)
    xp_pass(w, contexts, x, np.array([[target]], np.float32), np.array([rate], np.float32),
            pred_clip, weight_clip, True, probs)
    return float(probs[0, 0, 0]), w[0, 0, 0].astype(np.float64)


@pytest.mark.parametrize("kernel", [False, True])
def test_update_is_one_gradient_step(kernel):
    x = np.array([1.0, -0.5, 2.0, 0.25])
    w = np.array([0.1, 0.2, -0.3, 0.4])
    p, new_w = one_layer(x, w, target=1, rate=0.05, kernel=kernel)
    expected_p = sigmoid(w @ x)
    assert p == pytest.approx(expected_p, rel=1e-5)
    np.testing.assert_allclose(new_w, w - 0.05 * (expected_p - 1) * x, rtol=1e-5)


@pytest.mark.parametrize("kernel", [False, True])
def test_output_is_clipped_and_saturated_neurons_still_learn(kernel):
    """A confident wrong neuron outputs eps and its update uses the clipped p (no vanishing)."""
    x = np.array([1.0, 10.0])
    w = np.array([0.0, 3.0])  # sigmoid(30) ~ 1 - 1e-13
    p, new_w = one_layer(x, w, target=0, rate=0.1, pred_clip=0.05, kernel=kernel)
    assert p == pytest.approx(0.95, rel=1e-6)
    np.testing.assert_allclose(new_w, w - 0.1 * (0.95 - 0) * x, rtol=1e-5)


@pytest.mark.parametrize("kernel", [False, True])
def test_weights_are_projected_onto_the_hypercube(kernel):
    x = np.array([20.0, -20.0, 4.0])
    w = np.array([4.9, -4.9, 0.0])
    _, new_w = one_layer(x, w, target=1, rate=1.0, weight_clip=5.0, kernel=kernel)
    assert new_w.max() <= 5.0 and new_w.min() >= -5.0
    assert new_w[0] == 5.0 and new_w[1] == -5.0  # pushed past the bound, clipped back


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("learn", [True, False])
def test_cpu_kernel_matches_reference(shared, learn):
    rng = np.random.default_rng(1)
    w, ctx, x, targets, rates = random_layer(rng, 3, 7, 4, 33, 50, shared)
    w_ref, w_fast = assert_kernel_matches_reference(w, ctx, x, targets, rates, learn)
    assert learn or np.array_equal(w_fast, w)  # no learning leaves weights alone
    assert learn == (not np.array_equal(w_ref, w))


@settings(max_examples=60, deadline=None)
@given(glns=st.integers(1, 3), neurons=st.integers(1, 10), inputs=st.integers(1, 40),
       n=st.integers(1, 12), shared=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_cpu_kernel_matches_reference_for_any_layer_shape(glns, neurons, inputs, n, shared,
                                                          seed):
    """Every layer width (whole blocks of four neurons, and remainders of one to three), any
    row width and chunk length: the CPU kernel learns what the reference does."""
    rng = np.random.default_rng(seed)
    assert_kernel_matches_reference(
        *random_layer(rng, glns, neurons, 4, inputs, n, shared), learn=True)


def assert_kernel_matches_reference(w, ctx, x, targets, rates, learn):
    """Run the reference pass and the CPU kernel on copies of ``w``; their outputs and
    weights agree to 2e-5. Returns the weights after each: (reference, kernel)."""
    results = []
    for kernel in (False, True):
        weights = w.copy()
        probs = np.empty(ctx.shape, np.float32)
        layer_pass_for(np, use_kernels=kernel)(
            weights, ctx, x, targets, rates, 0.01, 1.5, learn, probs)
        results.append((weights, probs))
    (w_ref, p_ref), (w_fast, p_fast) = results
    np.testing.assert_allclose(p_fast, p_ref, atol=2e-5)
    np.testing.assert_allclose(w_fast, w_ref, atol=2e-5)
    return w_ref, w_fast


def test_reference_pass_updates_only_active_rows():
    rng = np.random.default_rng(2)
    w, ctx, x, targets, rates = random_layer(rng, 2, 3, 4, 5, 1, True)
    before = w.copy()
    reference_layer_pass(np)(w, ctx, x, targets, rates, 0.01, 5.0, True,
                             np.empty((1, 2, 3), np.float32))
    changed = np.any(w != before, axis=-1)  # (G, K, contexts)
    expected = np.zeros_like(changed)
    for g in range(2):
        for k in range(3):
            expected[g, k, ctx[0, g, k]] = True
    assert np.array_equal(changed, expected)
