"""The density model of binary images: one GLN per pixel, learned as one family."""

import numpy as np
import pytest

from gln import GLN
from gln.density import NEIGHBOURS, GLNDensity, pixel_rows

SHAPE = (4, 5)
D = 20
CONFIG = dict(layer_sizes=(5, 1), context_dim=2, learning_rate=0.1, seed=4)


def images(n, seed=0):
    """Binary images with structure: a random column of ink per image, plus noise."""
    rng = np.random.default_rng(seed)
    grid = np.zeros((n, *SHAPE), np.uint8)
    grid[np.arange(n), :, rng.integers(0, SHAPE[1], n)] = 1
    return grid ^ (rng.random((n, *SHAPE)) < 0.05)


def test_row_i_sees_only_the_pixels_before_i():
    """Changing pixel j of an image changes no row i <= j: neither its side information nor
    its base inputs; it changes the side information of every row after j."""
    image = images(1, seed=1)[0].reshape(-1)
    base, side, labels, members = pixel_rows(image[None], SHAPE)
    assert members.tolist() == list(range(D)) and labels.tolist() == image.tolist()
    for j in range(D):
        flipped = image.copy()
        flipped[j] ^= 1
        base_f, side_f, _, _ = pixel_rows(flipped[None], SHAPE)
        assert np.array_equal(base[:j + 1], base_f[:j + 1]), j
        assert np.array_equal(side[:j + 1], side_f[:j + 1]), j
        assert (side[j + 1:] != side_f[j + 1:]).any(axis=1).all(), j


def test_the_side_information_is_the_signed_image_before_i_and_the_inputs_its_neighbours():
    image = images(1, seed=2)[0]
    base, side, _, _ = pixel_rows(image[None], SHAPE)
    signed = 2.0 * image.reshape(-1) - 1.0
    for i in range(D):
        assert np.array_equal(side[i], np.where(np.arange(D) < i, signed, 0.0))
        r, c = divmod(i, SHAPE[1])
        want = [image[r - up, c - left] if 0 <= r - up and 0 <= c - left < SHAPE[1] else 0
                for up, left in NEIGHBOURS]
        assert base[i].tolist() == want


def test_the_pixel_models_learned_as_one_are_each_pixels_model_learned_alone():
    data = images(6, seed=3)
    density = GLNDensity(SHAPE, **CONFIG)
    first = density.learn(data[:2])
    online = np.concatenate([first, density.learn(data[2:])])
    base, side, labels, members = pixel_rows(data, SHAPE)
    config = density.family.config
    expected = np.zeros(len(data))
    for i in range(D):
        mine = members == i
        alone = GLN(**config)
        probs = alone.learn(base[mine], labels[mine], side_info=side[mine])
        assert density.family.member_bytes(i) == alone.to_bytes(), i
        expected -= np.log(probs[np.arange(len(data)), labels[mine]])
    np.testing.assert_allclose(online, expected, rtol=1e-12)


def test_frozen_predicts_without_learning_and_apart_from_the_model():
    data = images(40, seed=5)
    density = GLNDensity(SHAPE, **CONFIG)
    density.learn(data[:30])
    frozen = density.frozen()
    before = frozen.nats(data[30:])
    assert np.array_equal(frozen.nats(data[30:]), before)  # nats learns nothing
    assert np.array_equal(density.nats(data[30:]), before)
    online = density.learn(data[30:])
    assert np.array_equal(online[:1], before[:1])  # the first test image: nothing learned yet
    assert np.array_equal(frozen.nats(data[30:]), before)  # the copy did not move
    assert not np.array_equal(density.nats(data[30:]), before)


def test_the_model_learns_the_images_structure():
    """Nats per image fall well below the 20 ln 2 of a coin per pixel as images are learned."""
    density = GLNDensity(SHAPE, **CONFIG)
    nats = density.learn(images(600, seed=6))
    assert nats[:50].mean() > nats[-100:].mean() + 2
    assert nats[-100:].mean() < 0.6 * D * np.log(2)


def test_images_must_be_binary():
    with pytest.raises(ValueError, match="binary"):
        GLNDensity(SHAPE, **CONFIG).learn(np.full((1, *SHAPE), 2))


def test_a_gating_window_keeps_each_hyperplane_on_a_square_of_the_image():
    density = GLNDensity(SHAPE, gating_window=2, **CONFIG)
    normals = density.family.member(0).normals
    assert normals.shape[1] == D and ((normals != 0).sum(axis=1) == 4).all()
    assert density.learn(images(3)).shape == (3,)
