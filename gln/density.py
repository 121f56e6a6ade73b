"""A density model of binary images: one binary GLN per pixel, all learned as one family.

By the chain rule ``P(x) = prod_i P(x_i | x_<i)`` over the pixels in row-major order (the
paper's "MNIST density modelling"), a model of images is one binary model per pixel, each
predicting its pixel from the pixels before it. Pixel i's model is member i of a
``GLNFamily``; an image is one row per pixel, row i for member i, labelled with pixel i.
Every row of an image carries only pixels before its own, so all of an image's rows are
learned in one call, and the members end byte for byte where each pixel's model learning its
rows alone would (``gln.family``).

What each row holds:

* side information, which gates the row (``side_info="given"``, ``pixel_rows``): the whole
  image with pixel i and every pixel after it masked, seen pixels as -1 (off) or +1 (on) and
  masked ones 0, so that a seen blank differs from one not yet seen. The halfspaces then pick
  a pixel's weights by the shape drawn so far;
* base predictions, which layer 1 mixes (``ContextCounts``): what counting has said so far
  of pixel i given its nearest causal neighbours, for several neighbourhood sizes, counted
  for pixel i alone and over every pixel position (probabilities, ``input_scaling="unit"``).
  A count of the images before answers a neighbourhood it has seen often almost exactly and
  learns in one image what a GLN's weights take hundreds to; the network's part is to
  weigh the counts, by how much each has seen and by the shape around the pixel. Raw
  neighbouring pixels as p0 (this module's first form) gave 111 nats a test image on the full
  pass, the counts 95 (docs/paper.md).

``GLNDensity.learn(images)`` returns each image's code length in nats predicted before its own
update (prequential, the online figure); ``GLNDensity.nats(images)`` the code length without
learning (the frozen figure).

>>> import numpy as np
>>> from gln.density import GLNDensity
>>> images = (np.random.default_rng(0).random((3, 4, 4)) < 0.3).astype(np.uint8)
>>> density = GLNDensity((4, 4), layer_sizes=(4, 1), seed=0)
>>> density.learn(images).shape                  # nats of each image, before learning it
(3,)
>>> bool(density.nats(images[:1])[0] > 0)       # frozen: learns nothing
True
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np

from gln.family import GLNFamily

# Causal neighbours of a pixel, nearest first, as (rows up, columns left): a context of k
# neighbours is the first k of them (each lies before the pixel in row-major order).
CAUSAL_NEIGHBOURS = (
    (0, 1), (1, 0), (1, 1), (1, -1), (0, 2), (2, 0), (1, 2), (1, -2), (2, 1), (2, -1),
    (0, 3), (3, 0), (2, 2), (2, -2), (1, 3), (1, -3), (0, 4), (3, 1), (3, -1), (4, 0),
)
# The count models, (neighbours in the context, counted for each pixel position apart): small
# contexts counted per position, large ones pooled over positions (a context of 20 pixels
# per position would see each of its million patterns too rarely). Chosen by the online nats
# of the first 4,000 training images of binarized MNIST.
COUNT_MODELS = ((4, True), (8, True), (12, True), (8, False), (12, False), (16, False),
                (20, False))
DEFAULT_PRED_CLIP = 1e-4  # counts reach 1e-4 on the blank border: 0.01 costs 8 nats an image


def check_binary(images: Any, image_shape: Sequence[int]) -> np.ndarray:
    """``images`` (n, height, width) or (n, height * width) of 0 and 1, as (n, d) uint8."""
    d = int(image_shape[0]) * int(image_shape[1])
    pixels = np.asarray(images).reshape(-1, d)
    if pixels.size and not np.isin(pixels, (0, 1)).all():
        raise ValueError("images must be binary: every pixel 0 or 1")
    return pixels.astype(np.uint8)


def pixel_rows(
    images: Any, image_shape: Sequence[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each image as one row per pixel, image after image, pixel i of each for member i.

    Returns side information (n d, d) float32 in {-1, 0, 1} (pixels before i as -1 / +1, i
    and after as 0), labels (n d,) int64 (pixel i) and members (n d,) int64 (i). Row i of an
    image depends on its pixels before i alone.
    """
    d = int(image_shape[0]) * int(image_shape[1])
    pixels = check_binary(images, image_shape)
    n = len(pixels)
    signed = 2.0 * pixels.astype(np.float32) - 1.0
    before = np.tri(d, d, -1, dtype=np.float32)  # row i: 1 where j < i
    side = (before[None, :, :] * signed[:, None, :]).reshape(n * d, d)
    labels = pixels.reshape(-1).astype(np.int64)
    members = np.tile(np.arange(d, dtype=np.int64), n)
    return side, labels, members


class ContextCounts:
    """Online count models of binary images: model (k, per_position) predicts pixel i as
    ``(ones + prior) / (seen + 2 prior)`` over the images counted so far whose k nearest causal
    neighbours of i (``CAUSAL_NEIGHBOURS``; pixels outside the image are 0) were as they are
    now; counted for each pixel position apart, or over all positions together."""

    def __init__(self, image_shape: Sequence[int],
                 models: Sequence[tuple[int, bool]] = COUNT_MODELS, prior: float = 0.5) -> None:
        self.image_shape = (int(image_shape[0]), int(image_shape[1]))
        self.models = tuple((int(k), bool(apart)) for k, apart in models)
        if not self.models or any(not 0 <= k <= len(CAUSAL_NEIGHBOURS)
                                  for k, _ in self.models):
            raise ValueError(f"models must be (k, per_position) pairs with 0 <= k <= "
                             f"{len(CAUSAL_NEIGHBOURS)}, got {models!r}")
        if not prior > 0:
            raise ValueError(f"prior must be > 0, got {prior!r}")
        self.prior = float(prior)
        d = self.image_shape[0] * self.image_shape[1]
        # Per model: counts (positions, 2^k patterns, 2 values), one position when pooled.
        self.counts = [np.zeros((d if apart else 1, 1 << k, 2), np.uint32)
                       for k, apart in self.models]

    def predictions(self, images: Any, learn: bool) -> np.ndarray:
        """Each pixel's prediction by each model (n d, models) float32, image after image,
        each from the images counted before it (with ``learn``, the call's images are
        counted too, each once it is predicted)."""
        pixels = check_binary(images, self.image_shape)
        n, d = pixels.shape
        patterns = self._patterns(pixels)
        out = np.empty((n, d, len(self.models)), np.float32)
        positions = np.arange(d)
        for t in range(n):
            for m, ((k, apart), counts) in enumerate(zip(self.models, self.counts,
                                                        strict=True)):
                where = (positions if apart else 0, patterns[k][t])
                seen = counts[where].astype(np.float64)
                out[t, :, m] = (seen[:, 1] + self.prior) / (seen.sum(axis=1) + 2 * self.prior)
                if learn:
                    np.add.at(counts, (*where, pixels[t]), 1)
        return out.reshape(n * d, len(self.models))

    def _patterns(self, pixels: np.ndarray) -> dict[int, np.ndarray]:
        """Each pixel's k nearest causal neighbours as a k-bit number (n, d), for every k of
        the models: one pass over the neighbours, a k-bit pattern the (k-1)-bit one plus a bit."""
        height, width = self.image_shape
        grid = pixels.reshape(-1, height, width).astype(np.int64)
        up_most = max(up for up, _ in CAUSAL_NEIGHBOURS)
        side_most = max(abs(left) for _, left in CAUSAL_NEIGHBOURS)
        padded = np.zeros((len(grid), height + up_most, width + 2 * side_most), np.int64)
        padded[:, up_most:, side_most:side_most + width] = grid
        wanted = {k for k, _ in self.models}
        pattern = np.zeros(grid.shape, np.int64)
        patterns = {0: pattern.reshape(len(grid), -1).copy()} if 0 in wanted else {}
        for bit, (up, left) in enumerate(CAUSAL_NEIGHBOURS[:max(wanted)]):
            pattern |= padded[:, up_most - up:up_most - up + height,
                              side_most - left:side_most - left + width] << bit
            if bit + 1 in wanted:
                patterns[bit + 1] = pattern.reshape(len(grid), -1).copy()
        return patterns


class GLNDensity:
    """An autoregressive density model of binary images of ``image_shape``: one binary GLN per
    pixel (``GLNFamily`` members, ``side_info="given"``) mixing the predictions of
    ``ContextCounts(image_shape, count_models)``, configured by the ``GLN`` keyword arguments
    in ``config`` (the network, rate, seed, ``pred_clip`` (default ``DEFAULT_PRED_CLIP``),
    ``gating_window``; the inputs and the side information are the module's).
    """

    def __init__(self, image_shape: Sequence[int] = (28, 28),
                 count_models: Sequence[tuple[int, bool]] = COUNT_MODELS,
                 **config: Any) -> None:
        height, width = (int(k) for k in image_shape)
        self.image_shape = (height, width)
        self.counts = ContextCounts(self.image_shape, count_models)
        config.setdefault("pred_clip", DEFAULT_PRED_CLIP)
        self.family = GLNFamily(
            height * width, num_features=len(self.counts.models), num_classes=2,
            input_scaling="unit", side_info="given", side_info_size=height * width,
            image_shape=(height, width), **config)

    def learn(self, images: Any) -> np.ndarray:
        """Learn the images in order, each in one pass of its pixels; returns each image's
        code length in nats, -ln P(x), predicted before the image is learned (n,)."""
        side, labels, members = pixel_rows(images, self.image_shape)
        base = self.counts.predictions(images, learn=True)
        probs = self.family.learn(base, labels, members, side_info=side)
        return self._nats(probs, labels)

    def nats(self, images: Any) -> np.ndarray:
        """Each image's code length in nats, -ln P(x), learning nothing (n,)."""
        side, labels, members = pixel_rows(images, self.image_shape)
        base = self.counts.predictions(images, learn=False)
        probs = self.family.predict_proba(base, members, side_info=side)
        return self._nats(probs, labels)

    def frozen(self) -> GLNDensity:
        """A copy that learns apart from this model: its parameters and counts as they
        stand."""
        density = GLNDensity.__new__(GLNDensity)
        density.image_shape = self.image_shape
        density.counts = copy.deepcopy(self.counts)
        density.family = GLNFamily.from_models([self.family.member_bytes(i)
                                                for i in range(self.family.size)],
                                               use_kernels=self.family.use_kernels)
        return density

    def _nats(self, probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """-ln of each pixel's probability of its value, summed over each image's pixels."""
        d = self.image_shape[0] * self.image_shape[1]
        chosen = probs[np.arange(len(labels)), labels]
        return -np.log(chosen).reshape(-1, d).sum(axis=1)
