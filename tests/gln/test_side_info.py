"""Per-row side information for gating: each row centred, optionally blurred, at norm sqrt(d)."""

import math

import numpy as np
import pytest
from scipy.ndimage import gaussian_filter

from gln import GLN
from gln.scaling import gaussian_blur_matrix, per_row_side_info

IMAGE = (4, 5)


def image_model(**overrides):
    config = dict(num_features=20, num_classes=3, layer_sizes=(8, 4, 1), context_dim=3,
                  learning_rate=0.05, seed=3, side_info="per_row", side_info_blur=1.0,
                  image_shape=IMAGE)
    config.update(overrides)
    return GLN(**config)


def image_stream(n=200, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.random((n, 20))
    y = (X[:, :10].sum(axis=1) > X[:, 10:].sum(axis=1)).astype(int) + (X[:, 0] > 0.9)
    return X, y


@pytest.mark.parametrize("sigma", [0.5, 1.0, 1.5])
def test_blur_matrix_is_scipys_gaussian_filter_with_zero_padding(sigma):
    image = np.random.default_rng(1).random((9, 7))
    rows, cols = gaussian_blur_matrix(9, sigma), gaussian_blur_matrix(7, sigma)
    expected = gaussian_filter(image, sigma, mode="constant", cval=0.0, truncate=4.0)
    np.testing.assert_allclose(rows @ image @ cols.T, expected, rtol=0, atol=1e-14)


def test_side_info_is_centred_at_norm_sqrt_d_and_ignores_brightness():
    X = np.random.default_rng(2).random((5, 20))
    z = per_row_side_info(np, X, None)
    np.testing.assert_allclose(z.mean(axis=1), 0, atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(z, axis=1), math.sqrt(20))
    np.testing.assert_allclose(per_row_side_info(np, 3 * X + 7, None), z, atol=1e-12)
    assert np.array_equal(per_row_side_info(np, np.full((2, 20), 4.0), None), np.zeros((2, 20)))


def test_blurred_side_info_is_the_blurred_centred_image_renormalised():
    X = np.random.default_rng(4).random((3, 20))
    blur = (gaussian_blur_matrix(4, 1.0), gaussian_blur_matrix(5, 1.0))
    z = per_row_side_info(np, X, blur)
    for row, got in zip(X, z, strict=True):
        smooth = gaussian_filter((row - row.mean()).reshape(IMAGE), 1.0, mode="constant")
        want = smooth.ravel() * math.sqrt(20) / np.linalg.norm(smooth)
        np.testing.assert_allclose(got, want, atol=1e-12)


@pytest.mark.parametrize("window", [0, 2], ids=["whole", "window"])
def test_per_row_gating_keeps_chunked_learning_byte_identical(window):
    X, y = image_stream()
    whole, single = image_model(gating_window=window), image_model(gating_window=window)
    p_whole = whole.learn(X, y)
    p_single = np.concatenate([single.learn(X[i:i + 1], y[i:i + 1]) for i in range(len(X))])
    assert np.array_equal(p_whole, p_single)
    assert whole.to_bytes() == single.to_bytes()


def test_per_row_gating_changes_the_contexts_but_not_the_base_predictions():
    X, y = image_stream()
    per_row, scaled = image_model(), image_model(side_info="scaled", side_info_blur=0.0)
    assert not np.array_equal(per_row.learn(X, y), scaled.learn(X, y))
    first_per_row, first_scaled = image_model(), image_model(side_info="scaled",
                                                             side_info_blur=0.0)
    # Before any learning the weights are 1/K everywhere, whatever the context: equal outputs.
    np.testing.assert_array_equal(first_per_row.predict_proba(X[:5]),
                                  first_scaled.predict_proba(X[:5]))


@pytest.mark.parametrize("window", [0, 2], ids=["whole", "window"])
def test_the_option_survives_config_and_bytes(window):
    model = image_model(gating_window=window)
    X, y = image_stream(50)
    model.learn(X, y)
    assert model.config["side_info"] == "per_row" and model.config["image_shape"] == [4, 5]
    assert model.config["gating_window"] == window
    again = GLN.from_bytes(model.to_bytes())
    assert again.config == model.config
    np.testing.assert_array_equal(again.predict_proba(X), model.predict_proba(X))
    rebuilt = GLN(**model.config)
    rebuilt.learn(X, y)
    assert rebuilt.to_bytes() == model.to_bytes()


@pytest.mark.parametrize("overrides, message", [
    (dict(side_info="pixels"), "side_info must be one of"),
    (dict(image_shape=(4, 4)), "height \\* width = 20"),
    (dict(image_shape=(20,)), "height, width"),
    (dict(image_shape="4x5"), "image_shape"),
    (dict(image_shape=None), "side_info_blur needs"),
    (dict(side_info="scaled"), "side_info_blur needs"),
    (dict(side_info_blur=-1.0), "side_info_blur"),
    (dict(gating_window=5), "gating_window must be 0 or 1..4"),
    (dict(gating_window=-1), "gating_window must be >= 0"),
    (dict(gating_window=2.0), "gating_window must be an int"),
    (dict(gating_window=2, image_shape=None, side_info_blur=0.0), "gating_window needs"),
])
def test_bad_side_info_options_are_clear_value_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        image_model(**overrides)


def test_a_gating_window_keeps_every_normal_on_a_square_of_the_image():
    model = image_model(gating_window=2)
    support = model.normals.reshape(-1, *IMAGE) != 0
    assert (support.sum(axis=(1, 2)) == 4).all()
    rows, cols = support.any(axis=2), support.any(axis=1)
    assert (rows.sum(axis=1) == 2).all() and (cols.sum(axis=1) == 2).all()
    np.testing.assert_allclose(np.linalg.norm(model.normals, axis=1), 1.0, atol=1e-6)
    # Different windows give other contexts, so other predictions once learning has begun.
    X, y = image_stream()
    assert not np.array_equal(model.learn(X, y), image_model().learn(X, y))
