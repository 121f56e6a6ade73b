"""The MNIST reader (IDX format) and moment-based deskewing, on generated data."""

import gzip
import struct

import numpy as np
import pytest

from benchmarks.mnist import deskew, load_mnist, read_idx


def write_idx(path, array, compress):
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    opener = gzip.open if compress else open
    with opener(path, "wb") as handle:
        handle.write(header + array.astype(np.uint8).tobytes())


@pytest.mark.parametrize("compress", [True, False])
def test_load_mnist_reads_idx_files(tmp_path, compress):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (5, 28, 28))
    labels = rng.integers(0, 10, 5)
    suffix = ".gz" if compress else ""
    write_idx(tmp_path / f"t10k-images-idx3-ubyte{suffix}", images, compress)
    write_idx(tmp_path / f"t10k-labels-idx1-ubyte{suffix}", labels, compress)
    got_images, got_labels = load_mnist(tmp_path, "test")
    assert np.array_equal(got_images, images) and np.array_equal(got_labels, labels)


def test_truncated_idx_file_is_rejected(tmp_path):
    path = tmp_path / "bad-idx"
    path.write_bytes(struct.pack(">HBB", 0, 8, 1) + struct.pack(">I", 10) + b"\x00" * 3)
    with pytest.raises(ValueError, match="expected"):
        read_idx(path)


def skew(image):
    r = np.arange(28)[:, None]
    c = np.arange(28)[None, :]
    mass = image.sum()
    cr, cc = (image * r).sum() / mass, (image * c).sum() / mass
    return ((image * (r - cr) * (c - cc)).sum() / mass) / ((image * (r - cr) ** 2).sum() / mass)


def test_deskew_straightens_a_slanted_stroke_and_keeps_its_mass():
    image = np.zeros((28, 28), np.float32)
    for row in range(4, 24):  # a stroke leaning right by 0.5 pixel per row
        image[row, int(8 + 0.5 * row)] = 1.0
    straightened = deskew(image[None])[0]
    assert abs(skew(image)) > 0.4
    assert abs(skew(straightened)) < 0.05
    assert straightened.sum() == pytest.approx(image.sum(), rel=0.02)


def test_deskew_leaves_blank_images_blank():
    assert np.array_equal(deskew(np.zeros((2, 28, 28))), np.zeros((2, 28, 28)))
