"""The paper's capacity experiment: how well a GLN fits random labels, beside an MLP of as many
weights.

    python benchmarks/paper/capacity.py --data-dir DIR --quick
    python benchmarks/paper/capacity.py --data-dir DIR --device cuda    # the full size

Two datasets of random labels: MNIST's images with their labels shuffled, and images of
uniform noise of the same shape. Nothing generalises, so training accuracy above chance (0.1)
is memorised: capacity. GLNs of layers 128 wide (one and two of them before the output
neuron) at context dimensions 1, 2 and 4 learn in passes over the data at the paper's constant
rate 1e-4; the MLP (two ReLU layers, softmax) has as many weights as the deepest GLN of context
dimension 4 and learns by Adam at the paper's rate 1e-5 (mini-batches of 32). After each pass,
every model's accuracy on the whole training set is measured.

Prints one line of JSON a run; ``--results FILE`` adds them as rows (one per dataset and
model), ``--figure FILE`` draws training accuracy against examples learned.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.paper.common import (  # noqa: E402
    add_mnist_arguments,
    append_runs,
    machine,
    mlp,
    mlp_accuracy,
    mnist_pixels,
    recorded_command,
    save_figure,
    torch_or_none,
)
from gln import GLN  # noqa: E402

WIDTH = 128  # the paper's layer width
DEPTHS = (1, 2)  # layers of WIDTH before the output neuron
CONTEXT_DIMS = (1, 2, 4)
GLN_RATE, MLP_RATE, MLP_BATCH = 1e-4, 1e-5, 32  # the paper's rates (its sweep's best)
QUICK = {"examples": 2000, "passes": 5}
FULL = {"examples": 60000, "passes": 20}


def datasets(args: argparse.Namespace) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Shuffled-label MNIST and uniform noise, ``args.examples`` rows each, labels random."""
    rng = np.random.default_rng(args.seed)
    X, y, _, _ = mnist_pixels(args.data_dir, args.synthetic)
    X, y = X[:args.examples], rng.permutation(y[:args.examples])
    noise = rng.random(X.shape, dtype=np.float32)
    return {"shuffled MNIST": (X, y), "uniform noise": (noise, rng.permutation(y))}


def gln_weights(depth: int, context_dim: int, classes: int = 10, d: int = 784) -> int:
    """Weights of one-vs-all GLNs of ``depth`` layers of WIDTH and an output neuron."""
    inputs = [d] + [WIDTH] * depth
    sizes = [WIDTH] * depth + [1]
    return classes * 2**context_dim * sum(k * (i + 1) for k, i in zip(sizes, inputs, strict=True))


def mlp_width(weights: int, classes: int = 10, d: int = 784) -> int:
    """Width h of two hidden layers whose MLP has about ``weights`` weights (with biases)."""
    # (d + 1) h + (h + 1) h + (h + 1) classes = weights, solved for h.
    a, b, c = 1.0, d + 2.0 + classes, classes - weights
    return int((-b + math.sqrt(b * b - 4 * a * c)) / (2 * a))


def run_gln(X: np.ndarray, y: np.ndarray, depth: int, context_dim: int,
            args: argparse.Namespace, bar: tqdm) -> list[list[float]]:
    """(examples learned, training accuracy) after each pass."""
    model = GLN(num_features=X.shape[1], num_classes=10,
                layer_sizes=(WIDTH,) * depth + (1,), context_dim=context_dim,
                learning_rate=GLN_RATE, seed=args.seed, device=args.device)
    curve = []
    for p in range(args.passes):
        for lo in range(0, len(X), 1000):
            model.learn(X[lo:lo + 1000], y[lo:lo + 1000])
            bar.update(len(X[lo:lo + 1000]))
        curve.append([(p + 1) * len(X), round(float((model.predict(X) == y).mean()), 4)])
    return curve


def run_mlp(torch, X: np.ndarray, y: np.ndarray, width: int, args: argparse.Namespace,
            bar: tqdm) -> list[list[float]]:
    """(examples learned, training accuracy) after each pass of the MLP."""
    net = mlp(torch, [X.shape[1], width, width, 10], args.seed)
    optimiser = torch.optim.Adam(net.parameters(), lr=MLP_RATE)
    Xt, yt = torch.from_numpy(X), torch.from_numpy(y)
    rng = np.random.default_rng(args.seed)
    curve = []
    for p in range(args.passes):
        for lo in rng.permutation(np.arange(0, len(X), MLP_BATCH)):
            loss = torch.nn.functional.cross_entropy(net(Xt[lo:lo + MLP_BATCH]),
                                                     yt[lo:lo + MLP_BATCH])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            bar.update(len(Xt[lo:lo + MLP_BATCH]))
        curve.append([(p + 1) * len(X), round(mlp_accuracy(torch, net, X, y), 4)])
    return curve


def draw(figures: list[dict], path: Path) -> None:
    """Training accuracy against examples learned, a panel per dataset, a line per model."""
    import matplotlib  # noqa: PLC0415 - a benchmark-only extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    names = list(dict.fromkeys(f["dataset"] for f in figures))
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 3.6), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        for run in (f for f in figures if f["dataset"] == name):
            examples, accuracy = zip(*run["curve"], strict=True)
            ax.plot(examples, accuracy, marker="o", ms=3, label=run["model"],
                    linestyle="--" if run["model"].startswith("MLP") else "-")
        ax.set_title(f"{name} ({figures[0]['examples']:,} examples)")
        ax.set_xlabel("examples learned")
        ax.set_ylabel("training accuracy")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_mnist_arguments(parser, QUICK)
    parser.add_argument("--examples", type=int)
    parser.add_argument("--passes", type=int)
    parser.add_argument("--depths", default=",".join(map(str, DEPTHS)))
    parser.add_argument("--context-dims", default=",".join(map(str, CONTEXT_DIMS)))
    parser.add_argument("--no-mlp", action="store_true", help="the GLNs only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="the GLN's device (GLN(device=...))")
    parser.add_argument("--results", type=Path, help="add the runs to this results file")
    parser.add_argument("--figure", type=Path, help="draw the runs (PNG)")
    parser.add_argument("--machine", default=machine(), help="the machine, for --results")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    depths = [int(v) for v in args.depths.split(",")]
    context_dims = [int(v) for v in args.context_dims.split(",")]
    torch = None if args.no_mlp else torch_or_none()
    if torch is None and not args.no_mlp:
        print("PyTorch is not installed: the MLP is skipped", file=sys.stderr)

    data = datasets(args)
    args.examples = len(next(iter(data.values()))[0])
    runs = len(depths) * len(context_dims) + (torch is not None)
    figures = []
    with tqdm(total=len(data) * runs * args.passes * args.examples, unit="ex",
              desc="capacity", file=sys.stderr) as bar:
        for name, (X, y) in data.items():
            for depth in depths:
                for m in context_dims:
                    curve = run_gln(X, y, depth, m, args, bar)
                    figures.append(row(name, f"GLN {depth}x{WIDTH} ({m})", depth, m,
                                       gln_weights(depth, m), curve, args))
            if torch is not None:
                weights = gln_weights(max(depths), max(context_dims))
                width = mlp_width(weights)
                curve = run_mlp(torch, X, y, width, args, bar)
                actual = sum(p.numel() for p in mlp(torch, [784, width, width, 10], 0)
                             .parameters())
                figures.append(row(name, f"MLP 2x{width}", 2, None, actual, curve, args))
            for run in figures[-runs:]:
                print(json.dumps(run), flush=True)
    if args.results:
        command = recorded_command("benchmarks/paper/capacity.py",
                                   sys.argv[1:] if argv is None else argv, args.data_dir)
        append_runs(args.results, command, args.machine, figures)
    if args.figure:
        draw(figures, args.figure)
    return figures


def row(dataset: str, model: str, layers: int, context_dim: int | None, weights: int,
        curve: list[list[float]], args: argparse.Namespace) -> dict:
    """One run's figures: the final training accuracy and the curve."""
    return {"dataset": dataset, "model": model, "layers": layers, "context_dim": context_dim,
            "weights": weights, "examples": args.examples, "passes": args.passes,
            "seed": args.seed, "final_train_accuracy": curve[-1][1], "curve": curve}


if __name__ == "__main__":
    main()
