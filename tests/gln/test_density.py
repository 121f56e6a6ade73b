"""The density model of binary images: one GLN per pixel, learned as one family."""

import numpy as np
import pytest

from gln import GLN
from gln.density import CAUSAL_NEIGHBOURS, ContextCounts, GLNDensity, pixel_rows

SHAPE = (4, 5)
D = 20
CONFIG = dict(layer_sizes=(5, 1), context_dim=2, learning_rate=0.01, seed=4)


def images(n, seed=0):
    """Binary images with structure: a random column of ink per image, plus noise."""
    rng = np.random.default_rng(seed)
    grid = np.zeros((n, *SHAPE), np.uint8)
    grid[np.arange(n), :, rng.integers(0, SHAPE[1], n)] = 1
    return grid ^ (rng.random((n, *SHAPE)) < 0.05)


def test_row_i_sees_only_the_pixels_before_i():
    """Changing pixel j of an image changes no row i <= j: neither its side information nor
    its base predictions; it changes the side information of every row after j."""
    counts = ContextCounts(SHAPE)
    counts.predictions(images(30, seed=7), learn=True)  # counts that say something
    image = images(1, seed=1)[0].reshape(-1)
    side, labels, members = pixel_rows(image[None], SHAPE)
    base = counts.predictions(image[None], learn=False)
    assert members.tolist() == list(range(D)) and labels.tolist() == image.tolist()
    for j in range(D):
        flipped = image.copy()
        flipped[j] ^= 1
        side_f, _, _ = pixel_rows(flipped[None], SHAPE)
        base_f = counts.predictions(flipped[None], learn=False)
        assert np.array_equal(base[:j + 1], base_f[:j + 1]), j
        assert np.array_equal(side[:j + 1], side_f[:j + 1]), j
        assert (side[j + 1:] != side_f[j + 1:]).any(axis=1).all(), j


def test_the_side_information_is_the_signed_image_before_i():
    image = images(1, seed=2)[0]
    side, _, _ = pixel_rows(image[None], SHAPE)
    signed = 2.0 * image.reshape(-1) - 1.0
    for i in range(D):
        assert np.array_equal(side[i], np.where(np.arange(D) < i, signed, 0.0))


def test_each_count_model_counts_the_earlier_images_whose_neighbours_were_the_same():
    """Model (k, per_position) predicts pixel i of an image as (ones + 1/2) / (seen + 1) over
    the pixels of the images before it, at i alone or at any position, whose k nearest causal
    neighbours were as i's are now (0 outside the image), counted one by one here."""
    models = ((0, True), (2, True), (3, False), (5, True), (5, False))
    data = images(12, seed=8)
    counts = ContextCounts(SHAPE, models)
    predicted = counts.predictions(data, learn=True).reshape(len(data), D, len(models))
    height, width = SHAPE

    def neighbours(image, i, k):
        r, c = divmod(i, width)
        return tuple(image[r - up, c - left] if r - up >= 0 and 0 <= c - left < width else 0
                     for up, left in CAUSAL_NEIGHBOURS[:k])

    for t, image in enumerate(data):
        for i in range(D):
            for m, (k, apart) in enumerate(models):
                mine = neighbours(image, i, k)
                values = [earlier.reshape(-1)[j] for earlier in data[:t]
                          for j in ([i] if apart else range(D))
                          if neighbours(earlier, j, k) == mine]
                want = (sum(values) + 0.5) / (len(values) + 1.0)
                assert predicted[t, i, m] == np.float32(want), (t, i, k, apart)
    # Predicting without learning leaves the counts as they are.
    again = counts.predictions(data[:3], learn=False)
    assert np.array_equal(again, counts.predictions(data[:3], learn=False))


def test_the_pixel_models_learned_as_one_are_each_pixels_model_learned_alone():
    data = images(6, seed=3)
    density = GLNDensity(SHAPE, **CONFIG)
    first = density.learn(data[:2])
    online = np.concatenate([first, density.learn(data[2:])])
    side, labels, members = pixel_rows(data, SHAPE)
    base = ContextCounts(SHAPE).predictions(data, learn=True)
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
    """Nats per image fall well below the 20 ln 2 of a coin per pixel as images are learned,
    and the network ends below what its count models give on average, alone."""
    data = images(600, seed=6)
    nats = GLNDensity(SHAPE, **CONFIG).learn(data)
    base = ContextCounts(SHAPE).predictions(data, learn=True).reshape(len(data), D, -1)
    pixels = data.reshape(len(data), D, 1)
    counted = -np.log(np.where(pixels == 1, base, 1 - base)).sum(axis=1)  # (n, models)
    assert nats[:50].mean() > nats[-100:].mean() + 1
    assert nats[-100:].mean() < counted[-100:].mean()
    assert nats[-100:].mean() < 0.6 * D * np.log(2)


def test_images_must_be_binary():
    with pytest.raises(ValueError, match="binary"):
        GLNDensity(SHAPE, **CONFIG).learn(np.full((1, *SHAPE), 2))


def test_a_gating_window_keeps_each_hyperplane_on_a_square_of_the_image():
    density = GLNDensity(SHAPE, gating_window=2, **CONFIG)
    normals = density.family.member(0).normals
    assert normals.shape[1] == D and ((normals != 0).sum(axis=1) == 4).all()
    assert density.learn(images(3)).shape == (3,)
