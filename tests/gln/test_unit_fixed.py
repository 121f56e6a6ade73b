"""``input_scaling="unit_fixed"``: inputs in [0, 1] scaled without running statistics, so a
row's side information and base predictions are its own whatever the stream brought before."""

import math

import numpy as np
import pytest

from gln import GLN
from gln.scaling import scale_inputs


def _pixels(rng, n, d=16, ink=0.3):
    """Rows like images: mostly 0, some pixels lit."""
    return np.where(rng.random((n, d)) < ink, rng.random((n, d)), 0.0).astype(np.float32)


def _model(**extra):
    return GLN(num_features=16, num_classes=3, layer_sizes=(8, 4, 1), context_dim=3,
               input_scaling="unit_fixed", seed=1, **extra)


def test_learning_in_one_call_equals_learning_row_by_row():
    rng = np.random.default_rng(0)
    X, y = _pixels(rng, 300), rng.integers(0, 3, 300)
    whole, rows = _model(), _model()
    together = whole.learn(X, y)
    one_by_one = np.concatenate([rows.learn(X[i:i + 1], y[i:i + 1]) for i in range(len(X))])
    assert together.tobytes() == one_by_one.tobytes()
    assert whole.to_bytes() == rows.to_bytes()


def test_the_reference_array_code_gives_the_kernels_predictions():
    rng = np.random.default_rng(1)
    X, y = _pixels(rng, 200), rng.integers(0, 3, 200)
    kernels, reference = _model(), _model(use_kernels=False)
    np.testing.assert_allclose(kernels.learn(X, y), reference.learn(X, y), atol=1e-5)


@pytest.mark.parametrize("side_info", ["scaled", "per_row"])
def test_a_rows_scaling_does_not_change_with_the_stream(side_info):
    """The statistics of what came before (none, or a stream of another distribution) leave
    the side information and base predictions of a row as they are; ``"unit"`` moves them."""
    rng = np.random.default_rng(2)
    x = _pixels(rng, 5).astype(np.float64)
    before = (np.zeros((5, 1)), np.zeros((5, 16)), np.zeros((5, 16)))
    other = rng.random((1000, 16)) * 0.9  # a brighter stream
    after = (np.full((5, 1), 1000.0), np.tile(other.sum(0), (5, 1)),
             np.tile((other ** 2).sum(0), (5, 1)))
    scaled = [scale_inputs(np, x, *stats, mode="unit_fixed", pred_clip=0.01, min_std=1e-9,
                           side_info=side_info) for stats in (before, after)]
    assert all(a.tobytes() == b.tobytes() for a, b in zip(*scaled, strict=True))
    if side_info == "scaled":
        unit = [scale_inputs(np, x, *stats, mode="unit", pred_clip=0.01, min_std=1e-9)[0]
                for stats in (before, after)]
        assert not np.array_equal(*unit)


def test_side_information_is_the_row_at_norm_sqrt_d_and_base_predictions_its_pixels():
    x = np.zeros((2, 16))
    x[0, :4] = [1.0, 0.5, 0.0, 0.25]  # row 1: all zeros
    z, logits = scale_inputs(np, x, np.zeros((2, 1)), np.zeros((2, 16)), np.zeros((2, 16)),
                             mode="unit_fixed", pred_clip=0.01, min_std=1e-9)
    np.testing.assert_allclose(np.linalg.norm(z[0]), 4.0, rtol=1e-6)
    np.testing.assert_allclose(z[0] / z[0, 0], x[0], rtol=1e-6)  # a multiple of the row
    assert not z[1].any()
    np.testing.assert_allclose(logits[0, :4], np.array([1.0, 0.5, 0.0, 0.25]) * math.log(99),
                               rtol=1e-6)
    assert not logits[1].any()  # no ink: the uninformative 1/2


def test_predictions_of_a_model_do_not_depend_on_the_rows_it_saw_only_on_its_weights():
    """Two models whose weights are equal but whose input statistics differ predict alike."""
    rng = np.random.default_rng(3)
    model = _model()
    model.learn(_pixels(rng, 100), rng.integers(0, 3, 100))
    probe = _pixels(rng, 20)
    twin = GLN.from_bytes(model.to_bytes())
    twin.moments = type(model.moments)(10**6, np.full(16, 3e5), np.full(16, 2e5))
    assert model.predict_proba(probe).tobytes() == twin.predict_proba(probe).tobytes()


def test_snapshots_keep_the_mode_and_learn_on_alike():
    rng = np.random.default_rng(4)
    model = _model()
    model.learn(_pixels(rng, 100), rng.integers(0, 3, 100))
    copy = GLN.from_bytes(model.to_bytes())
    assert copy.config["input_scaling"] == "unit_fixed"
    X, y = _pixels(rng, 50), rng.integers(0, 3, 50)
    assert model.learn(X, y).tobytes() == copy.learn(X, y).tobytes()
    assert model.to_bytes() == copy.to_bytes()


def test_strict_checks_refuse_values_outside_the_unit_interval():
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        _model().check_input(np.full((1, 16), 255.0), strict=True)


def test_the_cuda_path_gives_the_cpu_models_results(cp):
    """On the device (a GPU, or the emulated one), in long chunks and in single rows (which a
    GPU model replays from captured graphs where it can), as the CPU model learns them."""
    import warnings  # noqa: PLC0415

    rng = np.random.default_rng(5)
    X, y = _pixels(rng, 60), rng.integers(0, 3, 60)
    cpu, chunked, rows = _model(), _model(device="cuda"), _model(device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a failed capture warns
        learned = chunked.learn(X, y)
        one_by_one = np.concatenate([rows.learn(X[t:t + 1], y[t:t + 1]) for t in range(60)])
    np.testing.assert_allclose(learned, cpu.learn(X, y), atol=1e-4)
    np.testing.assert_allclose(one_by_one, learned, atol=1e-5)
    np.testing.assert_allclose(rows.predict_proba(X[:5]), cpu.predict_proba(X[:5]), atol=1e-4)


def test_a_value_outside_the_unit_interval_is_refused_naming_unit_fixed():
    from gln import GLN

    with pytest.raises(ValueError, match=r"^input_scaling='unit_fixed' takes features in \[0, 1\]"):
        GLN(2, input_scaling="unit_fixed").check_input([[0.5, 1.5]], strict=True)
