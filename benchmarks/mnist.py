"""MNIST from its original IDX files, and moment-based deskewing.

The data directory holds ``train-images-idx3-ubyte[.gz]`` and friends (as distributed); it is
passed in or read from ``GLN_DATA_DIR``. Nothing is downloaded.
"""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np

_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def data_dir(explicit: str | None) -> Path:
    """The directory given, else ``$GLN_DATA_DIR``; a clear error when neither is set."""
    chosen = explicit or os.environ.get("GLN_DATA_DIR")
    if not chosen:
        raise SystemExit("give --data-dir or set GLN_DATA_DIR to the directory of the IDX files")
    return Path(chosen)


def read_idx(path: Path) -> np.ndarray:
    """An IDX array (big-endian header: magic 0x0000080T with T the rank, then the dims)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        raw = handle.read()
    zero, dtype_code, rank = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    dims = struct.unpack(f">{rank}I", raw[4:4 + 4 * rank])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * rank)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: expected {dims} values, found {data.size}")
    return data.reshape(dims)


def _find(directory: Path, stem: str) -> Path:
    for candidate in (directory / stem, directory / f"{stem}.gz"):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"{stem}[.gz] not found in {directory}")


def load_mnist(directory: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Images (n, 28, 28) uint8 and labels (n,) int64 of the ``"train"`` or ``"test"`` split."""
    images_stem, labels_stem = _FILES[split]
    images = read_idx(_find(directory, images_stem))
    labels = read_idx(_find(directory, labels_stem)).astype(np.int64)
    if len(images) != len(labels):
        raise ValueError(f"{split}: {len(images)} images but {len(labels)} labels")
    return images, labels


def deskew(images: np.ndarray) -> np.ndarray:
    """Shear each image so that its principal axis is vertical, centred on its centre of mass.

    The classic moment-based deskewing (as used for the paper's "deskewed MNIST"): with the
    intensity-weighted centre c and covariance, alpha = cov(row, col) / var(row), and the
    output pixel (r, s) samples the input at (r + c_r - h_r, s + alpha (r - h_r) + c_c - h_c)
    (h the image centre), with bilinear interpolation. Input (n, H, W) in any real dtype;
    output float32 in the same range.
    """
    images = np.asarray(images, dtype=np.float32)
    n, height, width = images.shape
    rows = np.arange(height, dtype=np.float32)[None, :, None]
    cols = np.arange(width, dtype=np.float32)[None, None, :]
    mass = images.sum(axis=(1, 2))
    safe = np.where(mass > 0, mass, 1.0)
    c_r = (images * rows).sum(axis=(1, 2)) / safe
    c_c = (images * cols).sum(axis=(1, 2)) / safe
    dr = rows - c_r[:, None, None]
    dc = cols - c_c[:, None, None]
    var_r = (images * dr * dr).sum(axis=(1, 2)) / safe
    cov = (images * dr * dc).sum(axis=(1, 2)) / safe
    alpha = np.where((mass > 0) & (var_r > 0), cov / np.where(var_r > 0, var_r, 1.0), 0.0)
    h_r, h_c = height / 2.0, width / 2.0
    src_r = np.broadcast_to(rows + (c_r - h_r)[:, None, None], (n, height, width))
    src_c = cols + alpha[:, None, None] * (rows - h_r) + (c_c - h_c)[:, None, None]
    return _bilinear(images, src_r, src_c)


def _bilinear(images: np.ndarray, src_r: np.ndarray, src_c: np.ndarray) -> np.ndarray:
    n, height, width = images.shape
    r0, c0 = np.floor(src_r), np.floor(src_c)
    fr, fc = (src_r - r0).astype(np.float32), (src_c - c0).astype(np.float32)
    r0, c0 = r0.astype(np.int64), c0.astype(np.int64)
    index = np.arange(n)[:, None, None]
    out = np.zeros(images.shape, dtype=np.float32)
    for dr, wr in ((0, 1.0 - fr), (1, fr)):
        for dc, wc in ((0, 1.0 - fc), (1, fc)):
            r, c = r0 + dr, c0 + dc
            inside = (r >= 0) & (r < height) & (c >= 0) & (c < width)
            values = images[index, np.clip(r, 0, height - 1), np.clip(c, 0, width - 1)]
            out += np.where(inside, values, 0.0) * wr * wc
    return out
