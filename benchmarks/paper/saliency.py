"""The paper's saliency experiment: what a GLN's collapsed weight product shows of an MNIST digit.

    python benchmarks/paper/saliency.py --data-dir DIR            # full: one pass over 60,000
    python benchmarks/paper/saliency.py --data-dir DIR --quick    # the first 10,000 only

The appendix's setting: 10 one-vs-all GLNs of [50, 25, 1] neurons, context dimension 4,
constant learning rate 0.01, one pass over the training set, bias weights dropped from the
maps (``GLN.saliency`` is the product over feature columns only: the bias inputs' weights are
in ``saliency_terms``' bias term). Pixels are divided by 255 and taken as the base
probabilities themselves (``input_scaling="unit"``, as the paper's pixels-as-probabilities);
``--input-scaling standardize`` runs the library's default instead.

Writes the figure (``--figure``, default docs/figures/saliency.png): for the first test digit
of each class, the digit, its map for its own class, and three readings of that map (below);
shows a progress bar and ends with one line of JSON of the figures measured:

- ``map_correlation``: mean pairwise Pearson correlation of the own-class maps of ``--per-class``
  test digits of each class, within a class and between classes, beside the same for the
  digits' pixels; ``residual_correlation``: the correlation of a map's departure from its
  class's mean map with the digit's departure from its class's mean digit (0: the per-input
  part of the map says nothing of the digit's shape).
- ``frame``: pixels that are 0 in every training image. Their base prediction is the same in
  every row, so their first-layer weights are equal to each other in every neuron and context
  (and, with ``standardize``, never move from 1/K); the maps are flat there.
- the readings: the map with those never-seen pixels masked; the map less its class's mean map
  (the per-input part); and each pixel's term in the output logit relative to a blank image,
  ``S_j * (logit(p0_j) - logit(p0_j of a 0 pixel))``, which is 0 wherever the digit has no ink.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.mnist import data_dir, load_mnist  # noqa: E402
from benchmarks.paper.common import save_figure  # noqa: E402
from gln import GLN  # noqa: E402

# --quick learns this many training images: about a sixth of the pass, a minute on two cores.
QUICK_TRAIN = 10_000
SIDE = 28


def appendix_model(input_scaling: str, seed: int) -> GLN:
    """The appendix's network; what the appendix does not fix is the library's default (the
    paper's own values: eps 0.01, hyperplane offsets N(0, 1), whole-image normals)."""
    return GLN(num_features=SIDE * SIDE, num_classes=10, layer_sizes=(50, 25, 1),
               context_dim=4, learning_rate=0.01, input_scaling=input_scaling, seed=seed)


def pairwise_correlation(rows: np.ndarray, groups: np.ndarray) -> dict[str, float]:
    """Mean Pearson correlation over pairs of distinct rows (n, d): pairs of one group and pairs
    of different groups."""
    centred = rows - rows.mean(axis=1, keepdims=True)
    norms = np.linalg.norm(centred, axis=1, keepdims=True)
    unit = centred / np.where(norms > 0, norms, 1.0)
    corr = unit @ unit.T
    same = groups[:, None] == groups[None, :]
    off_diagonal = ~np.eye(len(rows), dtype=bool)
    return {"within_class": float(corr[same & off_diagonal].mean()),
            "between_classes": float(corr[~same].mean())}


def residual_correlation(maps: np.ndarray, pixels: np.ndarray, groups: np.ndarray,
                         where: np.ndarray) -> float:
    """Mean over rows of corr(map - class mean map, pixels - class mean pixels) on ``where``."""
    values = []
    for c in np.unique(groups):
        rows = groups == c
        dm = maps[rows][:, where] - maps[rows][:, where].mean(axis=0)
        dp = pixels[rows][:, where] - pixels[rows][:, where].mean(axis=0)
        dm -= dm.mean(axis=1, keepdims=True)
        dp -= dp.mean(axis=1, keepdims=True)
        denom = np.linalg.norm(dm, axis=1) * np.linalg.norm(dp, axis=1)
        values.extend((dm * dp).sum(axis=1)[denom > 0] / denom[denom > 0])
    return float(np.mean(values))


def frame_figures(maps: np.ndarray, frame: np.ndarray) -> dict[str, float | int]:
    """How the never-seen pixels show on the maps (n, d): their spread within a map (0: flat),
    and how far their level sits from the seen pixels' mean, in the seen pixels' spreads."""
    on_frame, on_seen = maps[:, frame], maps[:, ~frame]
    spread_seen = on_seen.std(axis=1)
    return {"pixels": int(frame.sum()),
            "spread_on_frame": float(on_frame.std(axis=1).max()) if frame.any() else 0.0,
            "spread_on_seen": float(spread_seen.mean()),
            "frame_offset_in_seen_spreads": float(np.mean(
                np.abs(on_frame.mean(axis=1) - on_seen.mean(axis=1)) / spread_seen))
            if frame.any() else 0.0}


def base_logit(X: np.ndarray, X_train: np.ndarray, input_scaling: str, eps: float) -> np.ndarray:
    """The logit of the base predictions of rows ``X`` once the pass is over: the pixel's own
    logit (``unit``), or its z against the training set's statistics (``standardize``; a
    constant pixel's z is 0), as ``gln.scaling`` computes them."""
    cap = np.log((1 - eps) / eps)
    if input_scaling == "unit":
        p = np.clip(X.astype(np.float64), eps, 1 - eps)
        return np.log(p / (1 - p))
    std = X_train.std(axis=0, dtype=np.float64)
    z = (X - X_train.mean(axis=0, dtype=np.float64)) / np.where(std > 0, std, np.inf)
    return np.clip(z, -cap, cap)


def own_class_maps(model: GLN, X: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each row's saliency map for its own class (n, d), with a progress bar."""
    maps = []
    for lo in tqdm(range(0, len(X), 100), desc="saliency", unit="100 rows", file=sys.stderr):
        chunk = model.saliency(X[lo:lo + 100])
        maps.append(chunk[np.arange(len(chunk)), labels[lo:lo + 100]])
    return np.concatenate(maps)


def plot(path: Path, digits: np.ndarray,
         panels: list[tuple[str, np.ndarray, np.ndarray | None]]) -> None:
    """One column per class: the digit, then each panel's map (grey where its mask is set),
    each map on its own symmetric colour scale (red: raises the class's logit, blue: lowers)."""
    import matplotlib  # noqa: PLC0415 - only this step needs it (the `paper` extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    cmap = plt.get_cmap("RdBu_r").with_extremes(bad="0.75")
    rows = 1 + len(panels)
    fig, axes = plt.subplots(rows, 10, figsize=(12, 1.35 * rows + 0.4))
    for c in range(10):
        axes[0, c].imshow(digits[c].reshape(SIDE, SIDE), cmap="gray_r")
        axes[0, c].set_title(str(c))
        for r, (_, maps, mask) in enumerate(panels, start=1):
            image = np.ma.masked_array(maps[c], mask=np.zeros(maps.shape[1], bool)
                                       if mask is None else mask)
            limit = float(np.abs(image.compressed()).max()) or 1.0
            axes[r, c].imshow(image.reshape(SIDE, SIDE), cmap=cmap, vmin=-limit, vmax=limit)
    for r, title in enumerate(["digit", *(title for title, _, _ in panels)]):
        axes[r, 0].set_ylabel(title, rotation=0, ha="right", va="center", fontsize=9)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.tight_layout()
    save_figure(fig, path, dpi=80)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", help="directory of the MNIST IDX files (or GLN_DATA_DIR)")
    parser.add_argument("--quick", action="store_true",
                        help=f"learn the first {QUICK_TRAIN:,} training images only")
    parser.add_argument("--limit", type=int, default=None, help="learn the first N images")
    parser.add_argument("--per-class", type=int, default=100,
                        help="test digits of each class whose maps are compared")
    parser.add_argument("--input-scaling", choices=["unit", "standardize"], default="unit")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--figure", default=str(ROOT / "docs" / "figures" / "saliency.png"),
                        help="where the PNG goes; 'none': no figure (no matplotlib needed)")
    args = parser.parse_args(argv)

    directory = data_dir(args.data_dir)
    train_images, train_labels = load_mnist(directory, "train")
    test_images, test_labels = load_mnist(directory, "test")
    limit = args.limit or (QUICK_TRAIN if args.quick else None)
    train_images, train_labels = train_images[:limit], train_labels[:limit]
    X_train = (train_images.reshape(len(train_images), -1) / 255.0).astype(np.float32)
    X_test = (test_images.reshape(len(test_images), -1) / 255.0).astype(np.float32)

    model = appendix_model(args.input_scaling, args.seed)
    with tqdm(total=len(X_train), unit="ex", desc="one pass", file=sys.stderr) as bar:
        for lo in range(0, len(X_train), 1000):
            model.learn(X_train[lo:lo + 1000], train_labels[lo:lo + 1000])
            bar.update(len(X_train[lo:lo + 1000]))
    test_accuracy = float((model.predict(X_test) == test_labels).mean())

    # The first test digits of each class, in class order: the first of each is the figure's.
    chosen = np.concatenate([np.flatnonzero(test_labels == c)[:args.per_class]
                             for c in range(10)])
    X, y = X_test[chosen], test_labels[chosen]
    maps = own_class_maps(model, X, y)
    frame = (X_train == 0).all(axis=0)  # never nonzero in a training image
    seen = ~frame

    # Each pixel's base logit less that of a blank (0) pixel: what the digit's ink adds to the
    # input of the collapsed product, so that maps * ink is each pixel's term in the output
    # logit relative to a blank image.
    ink_logit = base_logit(X, X_train, args.input_scaling, model.config["pred_clip"])
    ink_logit -= base_logit(np.zeros_like(X[:1]), X_train, args.input_scaling,
                            model.config["pred_clip"])
    contribution = maps * ink_logit
    class_mean = np.stack([maps[y == c].mean(axis=0) for c in range(10)])
    per_input = maps - class_mean[y]

    result = {
        "benchmark": "paper_saliency",
        "n_train": len(X_train),
        "test_accuracy": test_accuracy,
        "maps_per_class": int(args.per_class),
        "map_correlation": pairwise_correlation(maps, y),
        "map_correlation_seen_pixels": pairwise_correlation(maps[:, seen], y),
        "digit_correlation": pairwise_correlation(X.astype(np.float64), y),
        "residual_correlation": residual_correlation(maps, X, y, seen),
        "contribution_correlation": pairwise_correlation(contribution, y),
        "contribution_digit_correlation": float(np.mean([
            np.corrcoef(contribution[i], X[i])[0, 1] for i in range(len(X))])),
        "frame": frame_figures(maps, frame),
        "config": model.config,
        "figure": None if args.figure == "none" else args.figure,
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
    }
    if args.figure != "none":
        first = np.searchsorted(y, np.arange(10))  # y is in class order
        plot(Path(args.figure), X[first], [
            ("saliency\n(bias dropped)", maps[first], None),
            ("never-seen\npixels masked", maps[first], frame),
            ("less the class's\nmean map", per_input[first], frame),
            ("saliency x ink\n(logit term)", contribution[first], None),
        ])
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
