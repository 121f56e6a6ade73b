"""The paper's density experiment: binarized MNIST, one GLN per pixel, one online pass.

    python benchmarks/paper/density.py --data-dir DIR --quick
    python benchmarks/paper/density.py --data-dir DIR            # the full size

784 binary GLNs, one per pixel in row-major order, model P(x_i | x_<i) (``gln.density``:
a ``GLNFamily`` whose members are the pixels, mixing the predictions of count models of each
pixel's causal neighbourhood; an image is learned in one call). The images of train, valid
and test, concatenated, are learned in one online pass; each is predicted before it is
learned. Reported: nats per test image online (prequential; the paper's 79.0), nats per test
image with the parameters frozen on reaching the test set (the paper's 80.74), and images
learned per second. ``--quick`` takes the first images of each split (printed). ``--device
cuda`` puts the family on a GPU (the counts stay on the CPU).

DIR (or ``$GLN_DATA_DIR``) holds ``binarized_mnist/binarized_mnist.npz``: train (50000, 98),
valid (10000, 98) and test (10000, 98) uint8, each row 784 pixels packed into bits. Nothing is
downloaded. Prints one line of JSON; ``--results FILE`` adds it as a row, ``--figure FILE``
draws nats per image against images learned.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.paper.common import (  # noqa: E402
    add_mnist_arguments,
    append_runs,
    machine,
    recorded_command,
    save_figure,
    synthetic_digits,
)
from gln.density import GLNDensity  # noqa: E402

SPLITS = ("train", "valid", "test")
PAPER = {"online": 79.0, "frozen": 80.74}  # nats per test image
# One setting, chosen by the online nats of the first 4,000 training images (never the test
# set): with count models as inputs, a rate of min(3/t, 0.02) beat 10/t capped at 0.1, 0.02
# or 0.01 and a constant 0.005 (commit message: the figures).
NETWORK = {"layer_sizes": (16, 1), "context_dim": 4,
           "learning_rate": {"schedule": "inverse_time", "scale": 3.0, "cap": 0.02}}
QUICK = {"train": 10000, "valid": 1000, "test": 1000}  # about three minutes on two cores
BATCH = 16  # images a learn call (invisible in the results: a family learns rows in order)
CURVE_POINTS = 50  # the figure's points: mean nats over each of as many runs of images


def binarized_mnist(directory: str | None, synthetic: bool) -> dict[str, np.ndarray]:
    """Each split's images (n, 784) uint8 of 0 and 1: from ``directory`` (or
    ``$GLN_DATA_DIR``)'s ``binarized_mnist/binarized_mnist.npz``, or with ``synthetic``
    generated digits (``synthetic_digits`` thresholded: 600 / 100 / 100) that need no files."""
    if synthetic:
        X, _ = synthetic_digits(800)
        pixels = (X > 0.5).astype(np.uint8)
        return {"train": pixels[:600], "valid": pixels[600:700], "test": pixels[700:]}
    chosen = directory or os.environ.get("GLN_DATA_DIR")
    if not chosen:
        raise SystemExit("give --data-dir, set GLN_DATA_DIR, or pass --synthetic")
    path = Path(chosen) / "binarized_mnist" / "binarized_mnist.npz"
    if not path.exists():
        raise SystemExit(f"{path} not found (nothing is downloaded)")
    with np.load(path) as packed:
        return {split: np.unpackbits(packed[split], axis=1)[:, :784] for split in SPLITS}


def run(data: dict[str, np.ndarray], args: argparse.Namespace) -> dict:
    """One online pass over train, valid and test; the test set also frozen. Returns the
    run's figures."""
    network = {**NETWORK, "layer_sizes": tuple(args.layer_sizes)}
    density = GLNDensity((28, 28), seed=args.seed, device=args.device, **network)
    online, frozen_nats, learning_seconds = [], [], 0.0
    total = sum(len(data[split]) for split in SPLITS)
    with tqdm(total=total, unit="image", desc="binarized MNIST", file=sys.stderr) as bar:
        for split in SPLITS:
            images = data[split]
            frozen = density.frozen() if split == "test" else None
            for start in range(0, len(images), BATCH):
                batch = images[start:start + BATCH]
                if frozen is not None:
                    frozen_nats.append(frozen.nats(batch))
                began = time.perf_counter()
                online.append(density.learn(batch))
                learning_seconds += time.perf_counter() - began
                bar.update(len(batch))
    nats = np.concatenate(online)
    test = nats[-len(data["test"]):]
    return {
        "model": "gln density", "seed": args.seed,
        **{split: len(data[split]) for split in SPLITS},
        "layer_sizes": list(network["layer_sizes"]), "context_dim": network["context_dim"],
        "learning_rate": network["learning_rate"],
        "pred_clip": density.family.config["pred_clip"],
        "count_models": [list(m) for m in density.counts.models], "device": args.device,
        "base_predictions": f"{len(density.counts.models)} count models",
        "test_nats_online": round(float(test.mean()), 2),
        "test_nats_frozen": round(float(np.concatenate(frozen_nats).mean()), 2),
        "train_nats_online": round(float(nats[:len(data["train"])].mean()), 2),
        "images_per_second": round(total / learning_seconds, 1),
        "curve": curve(nats),
    }


def curve(nats: np.ndarray) -> list[list[float]]:
    """[images learned, mean nats per image over the run of images ending there], at about
    ``CURVE_POINTS`` points."""
    bounds = np.unique(np.linspace(0, len(nats), CURVE_POINTS + 1).astype(int))
    return [[int(b), round(float(nats[a:b].mean()), 2)]
            for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def draw(figures: dict, path: Path) -> None:
    """Nats per image (online, mean over runs of images) against images learned, with the
    splits' boundaries, the frozen test figure and the paper's two figures."""
    import matplotlib  # noqa: PLC0415 - a benchmark-only extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    seen, nats = zip(*figures["curve"], strict=True)
    ax.plot(seen, nats, marker="o", ms=2, label="online (each image before learning it)")
    end = figures["train"] + figures["valid"]
    ax.axvline(figures["train"], color="grey", lw=0.6)
    ax.axvline(end, color="grey", lw=0.6)
    ax.plot([end, end + figures["test"]], [figures["test_nats_frozen"]] * 2, color="C1",
            lw=2, label=f"test, frozen: {figures['test_nats_frozen']:.1f}")
    ax.axhline(PAPER["online"], color="C2", ls="--", lw=1, label="paper, test online: 79.0")
    ax.axhline(PAPER["frozen"], color="C3", ls=":", lw=1, label="paper, test frozen: 80.74")
    ax.set_xlabel("images learned (train, valid, test)")
    ax.set_ylabel("nats per image")
    ax.set_ylim(0, max(200.0, min(float(max(nats)), 400.0)))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(f"Binarized MNIST, 784 pixel GLNs, one pass ({figures['train']:,} / "
                 f"{figures['valid']:,} / {figures['test']:,} images)", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_mnist_arguments(parser, QUICK, data="directory holding binarized_mnist/ "
                        "(or GLN_DATA_DIR)")
    for split in SPLITS:
        parser.add_argument(f"--{split}", type=int,
                            help=f"the first images of {split} (default: all, or --quick's)")
    parser.add_argument("--seed", type=int, default=0, help="the hyperplanes' seed")
    parser.add_argument("--device", default="cpu", help="the family's device: cpu or cuda")
    parser.add_argument("--layer-sizes", type=lambda text: [int(n) for n in text.split(",")],
                        default=list(NETWORK["layer_sizes"]),
                        help="each pixel's network, e.g. 64,32,1 (default: %(default)s)")
    parser.add_argument("--results", type=Path, help="add the run to this results file")
    parser.add_argument("--figure", type=Path, help="draw the run (PNG)")
    parser.add_argument("--machine", default=machine(), help="the machine, for --results")
    args = parser.parse_args(argv)
    data = binarized_mnist(args.data_dir, args.synthetic)
    for split in SPLITS:
        count = getattr(args, split) or (QUICK[split] if args.quick else None)
        data[split] = data[split][:count]
    if args.quick or any(getattr(args, split) for split in SPLITS):
        print(f"a subset: the first {len(data['train'])} train, {len(data['valid'])} valid "
              f"and {len(data['test'])} test images", file=sys.stderr)
    figures = run(data, args)
    print(json.dumps({k: v for k, v in figures.items() if k != "curve"}), flush=True)
    if args.results:
        command = recorded_command("benchmarks/paper/density.py",
                                   sys.argv[1:] if argv is None else argv, args.data_dir)
        append_runs(args.results, command, args.machine, [figures])
    if args.figure:
        draw(figures, args.figure)
    return figures


if __name__ == "__main__":
    main()
