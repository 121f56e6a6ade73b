"""A density model of binary images: one binary GLN per pixel, all learned as one family.

By the chain rule ``P(x) = prod_i P(x_i | x_<i)`` over the pixels in row-major order (the
paper's "MNIST density modelling"), a model of images is one binary model per pixel, each
predicting its pixel from the pixels before it. Pixel i's model is member i of a
``GLNFamily``; an image is one row per pixel, row i for member i, labelled with pixel i.
Every row of an image carries only pixels before its own, so all of an image's rows are
learned in one call, and the members end byte for byte where each pixel's model learning its
rows alone would (``gln.family``).

What each row holds (``pixel_rows``):

* side information, which gates the row (``side_info="given"``, ``gln.scaling``): the whole
  image with pixel i and every pixel after it masked, seen pixels as -1 (off) or +1 (on) and
  masked ones 0, so that a seen blank differs from one not yet seen. The halfspaces then pick
  a pixel's weights by the shape drawn so far;
* base predictions, which layer 1 mixes: a few causal neighbours of pixel i (left, up-left, up,
  up-right and two steps left and up; 0 outside the image), as probabilities in [0, 1] scaled
  with ``input_scaling="unit_fixed"`` (no statistics: an off pixel is the uninformative 1/2,
  an on one 1 - eps). The immediate neighbours are most of what predicts a pixel, and keeping
  p0 to a handful keeps each of the hundreds of models' weights small (K 2^m (6 + 1) floats
  in layer 1), where the masked image as p0 would make each layer-1 neuron 785 weights wide in
  every context (630 MB for 784 models of 16 neurons of context dimension 4, against 6 MB).

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

from collections.abc import Sequence
from typing import Any

import numpy as np

from gln.family import GLNFamily

# (rows up, columns left) of each base prediction's pixel from the one predicted: left, two
# left, up-left, up, up-right, two up. Each lies before the predicted pixel in row-major order.
NEIGHBOURS = ((0, 1), (0, 2), (1, 1), (1, 0), (1, -1), (2, 0))


def pixel_rows(
    images: Any, image_shape: Sequence[int], neighbours: Sequence[tuple[int, int]] = NEIGHBOURS
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each image as one row per pixel, image after image, pixel i of each for member i.

    ``images`` (n, height, width) or (n, height * width) of 0 and 1. Returns base inputs
    (n d, len(neighbours)) float32 in {0, 1}, side information (n d, d) float32 in {-1, 0, 1}
    (pixels before i as -1 / +1, i and after as 0), labels (n d,) int64 (pixel i) and members
    (n d,) int64 (i). Row i of an image depends on its pixels before i alone.
    """
    height, width = (int(k) for k in image_shape)
    d = height * width
    pixels = np.asarray(images).reshape(-1, d)
    if pixels.size and not np.isin(pixels, (0, 1)).all():
        raise ValueError("images must be binary: every pixel 0 or 1")
    n = len(pixels)
    bits = pixels.astype(np.float32)
    # Side information: the signed image (-1 off, +1 on) where j < i, else 0, for every i.
    before = np.tri(d, d, -1, dtype=np.float32)  # row i: 1 where j < i
    side = (before[None, :, :] * (2.0 * bits - 1.0)[:, None, :]).reshape(n * d, d)
    # Base inputs: each neighbour (up, left) of pixel (r, c) is pixel (r - up, c - left),
    # 0 outside the image.
    grid = bits.reshape(n, height, width)
    padded = np.zeros((n, height + 2 * height, width + 2 * width), np.float32)
    padded[:, height:2 * height, width:2 * width] = grid
    base = np.stack([padded[:, height - up:2 * height - up, width - left:2 * width - left]
                     for up, left in neighbours], axis=-1).reshape(n * d, len(neighbours))
    labels = pixels.reshape(-1).astype(np.int64)
    members = np.tile(np.arange(d, dtype=np.int64), n)
    return np.ascontiguousarray(base), side, labels, members


class GLNDensity:
    """An autoregressive density model of binary images of ``image_shape``: one binary GLN per
    pixel (``GLNFamily`` members, ``side_info="given"``), configured by the ``GLN`` keyword
    arguments in ``config`` (the network, rate, seed, ``gating_window``; the inputs and the
    side information are the module's, the side information an image of ``image_shape``).
    """

    def __init__(self, image_shape: Sequence[int] = (28, 28), **config: Any) -> None:
        height, width = (int(k) for k in image_shape)
        self.image_shape = (height, width)
        self.family = GLNFamily(
            height * width, num_features=len(NEIGHBOURS), num_classes=2,
            input_scaling="unit_fixed", side_info="given", side_info_size=height * width,
            image_shape=(height, width), **config)

    @classmethod
    def of_family(cls, family: GLNFamily, image_shape: Sequence[int]) -> GLNDensity:
        """A density model whose pixel models are ``family``'s members."""
        density = cls.__new__(cls)
        density.image_shape = tuple(int(k) for k in image_shape)
        density.family = family
        return density

    def learn(self, images: Any) -> np.ndarray:
        """Learn the images in order, each in one pass of its pixels; returns each image's
        code length in nats, -ln P(x), predicted before the image is learned (n,)."""
        base, side, labels, members = pixel_rows(images, self.image_shape)
        probs = self.family.learn(base, labels, members, side_info=side)
        return self._nats(probs, labels)

    def nats(self, images: Any) -> np.ndarray:
        """Each image's code length in nats, -ln P(x), learning nothing (n,)."""
        base, side, labels, members = pixel_rows(images, self.image_shape)
        probs = self.family.predict_proba(base, members, side_info=side)
        return self._nats(probs, labels)

    def frozen(self) -> GLNDensity:
        """A copy that learns apart from this model: its parameters as they stand."""
        family = GLNFamily.from_models([self.family.member_bytes(i)
                                        for i in range(self.family.size)],
                                       use_kernels=self.family.use_kernels)
        return GLNDensity.of_family(family, self.image_shape)

    def _nats(self, probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """-ln of each pixel's probability of its value, summed over each image's pixels."""
        d = self.image_shape[0] * self.image_shape[1]
        chosen = probs[np.arange(len(labels)), labels]
        return -np.log(chosen).reshape(-1, d).sum(axis=1)
