"""The paper's continual-learning experiment: permuted MNIST, one pass a task, no task labels.

    python benchmarks/paper/permuted_mnist.py --data-dir DIR --quick
    python benchmarks/paper/permuted_mnist.py --data-dir DIR --device cuda    # the full size

Each task is MNIST with its pixels in an order of its own (task 1: the original order); the
models learn the tasks one after another, one pass each, and after each task are tested on
every task so far. The peers are the paper's appendix: a ReLU MLP of [1000, 250, 10] trained
by Adam (rate 1e-4, mini-batches of 20, no dropout: the paper's chosen settings) and the same
MLP with EWC (lambda 1e3, Fisher diagonals from 100 examples of each task). The GLN is the
appendix's: one-vs-all, [100, 25, 1] neurons, context dimension 6, constant rate 0.01.

Prints one line of JSON a run; ``--results FILE`` adds them as rows (one per model and seed),
``--figure FILE`` draws the accuracy on tasks 1, 2 and 4, and the mean over the tasks learned,
as the tasks go by.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.paper.common import (  # noqa: E402
    add_mnist_arguments,
    append_runs,
    ci95,
    machine,
    mlp,
    mlp_accuracy,
    mnist_pixels,
    recorded_command,
    save_figure,
    torch_or_none,
)
from gln import GLN  # noqa: E402

MODELS = ("gln", "mlp", "ewc")
GLN_NETWORK = {"layer_sizes": (100, 25, 1), "context_dim": 6, "learning_rate": 0.01}
MLP_SIZES = [784, 1000, 250, 10]
MLP_RATE, MLP_BATCH = 1e-4, 20  # the appendix's Adam rate and mini-batch
EWC_LAMBDA, EWC_SAMPLES = 1e3, 100  # the appendix's lambda (log10 3) and Fisher samples
QUICK = {"tasks": 8, "train_per_task": 2000, "test_per_task": 500, "seeds": 2}
FULL = {"tasks": 8, "train_per_task": 60000, "test_per_task": 10000, "seeds": 10}


def permutations(tasks: int, seed: int) -> list[np.ndarray]:
    """The pixel order of each task: the original first, then random ones of ``seed``."""
    rng = np.random.default_rng(seed)
    return [np.arange(784)] + [rng.permutation(784) for _ in range(tasks - 1)]


def run_gln(data: dict, orders: list[np.ndarray], seed: int, args: argparse.Namespace,
            bar: tqdm) -> list[list[float]]:
    """The GLN through the tasks: accuracy[k][j] on task j after learning tasks 0..k."""
    rate: float | dict = args.gln_rate
    if args.gln_rate_scale:
        rate = {"schedule": "inverse_time", "scale": args.gln_rate_scale, "cap": args.gln_rate}
    model = GLN(num_features=784, num_classes=10, input_scaling=args.input_scaling,
                side_info=args.side_info, seed=seed, device=args.device,
                **{**GLN_NETWORK, "learning_rate": rate, "context_dim": args.context_dim})
    accuracy = []
    for order in orders:
        X, y = data["X_train"][:, order], data["y_train"]
        for lo in range(0, len(X), 1000):
            model.learn(X[lo:lo + 1000], y[lo:lo + 1000])
            bar.update(len(X[lo:lo + 1000]))
        accuracy.append([float((model.predict(data["X_test"][:, seen]) == data["y_test"]).mean())
                         for seen in orders[:len(accuracy) + 1]])
    return accuracy


def run_mlp(torch: Any, data: dict, orders: list[np.ndarray], seed: int, ewc: bool,
            bar: tqdm, ewc_samples: int = EWC_SAMPLES) -> list[list[float]]:
    """The appendix's MLP (with EWC where ``ewc``) through the tasks, one pass each."""
    net = mlp(torch, MLP_SIZES, seed)
    optimiser = torch.optim.Adam(net.parameters(), lr=MLP_RATE)
    generator = np.random.default_rng(seed)
    # EWC's penalty sum_k F_k (w - w_k)^2 over the tasks before, kept as sum_k F_k and
    # sum_k F_k w_k: the same gradient, one term a weight however many tasks there were.
    fisher_sum = [torch.zeros_like(p) for p in net.parameters()]
    weighted_sum = [torch.zeros_like(p) for p in net.parameters()]
    accuracy = []
    for order in orders:
        X = torch.from_numpy(np.ascontiguousarray(data["X_train"][:, order]))
        y = torch.from_numpy(data["y_train"])
        for lo in generator.permutation(np.arange(0, len(X), MLP_BATCH)):
            loss = torch.nn.functional.cross_entropy(net(X[lo:lo + MLP_BATCH]),
                                                     y[lo:lo + MLP_BATCH])
            if ewc and len(accuracy):
                loss = loss + EWC_LAMBDA / 2 * sum(
                    (f * p * p - 2 * fw * p).sum()
                    for f, fw, p in zip(fisher_sum, weighted_sum, net.parameters(), strict=True))
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            bar.update(len(X[lo:lo + MLP_BATCH]))
        if ewc:
            fisher, weights = fisher_diagonal(torch, net, X, generator, ewc_samples)
            for f_sum, fw_sum, f, w in zip(fisher_sum, weighted_sum, fisher, weights,
                                           strict=True):
                f_sum += f
                fw_sum += f * w
        accuracy.append([mlp_accuracy(torch, net, data["X_test"][:, seen], data["y_test"])
                         for seen in orders[:len(accuracy) + 1]])
    return accuracy


def fisher_diagonal(torch: Any, net: Any, X: Any, generator: np.random.Generator,
                    samples: int = EWC_SAMPLES) -> tuple[list[Any], list[Any]]:
    """EWC's anchor: the diagonal of the Fisher information at ``samples`` examples of the
    task (labels drawn from the network's own predictions) and the weights it was taken at."""
    fisher = [torch.zeros_like(p) for p in net.parameters()]
    rows = generator.choice(len(X), size=min(samples, len(X)), replace=False)
    for row in rows:
        log_p = torch.log_softmax(net(X[row:row + 1]), dim=1)
        label = torch.multinomial(log_p.exp().detach(), 1)[0, 0]
        net.zero_grad()
        log_p[0, label].backward()
        for f, p in zip(fisher, net.parameters(), strict=True):
            f += p.grad.detach() ** 2 / len(rows)
    return fisher, [p.detach().clone() for p in net.parameters()]


def summary(model: str, seed: int, accuracy: list[list[float]], args: argparse.Namespace
            ) -> dict:
    """One run's figures: the headline numbers and the whole accuracy triangle."""
    return {
        "model": model if model != "gln" else gln_name(args),
        "seed": seed, "tasks": args.tasks, "train_per_task": args.train_per_task,
        "test_per_task": args.test_per_task,
        **({"scored_on": "validation"} if args.validation else {}),
        "task1_after_task1": round(accuracy[0][0], 4),
        "task1_after_last": round(accuracy[-1][0], 4),
        "mean_new_task": round(float(np.mean([row[-1] for row in accuracy])), 4),
        "mean_after_last": round(float(np.mean(accuracy[-1])), 4),
        "accuracy": [[round(a, 4) for a in row] for row in accuracy],
    }


def gln_name(args: argparse.Namespace) -> str:
    """The GLN's row name: its input scaling, and its gating input and rate where not the
    script's defaults."""
    rate = f"rate {args.gln_rate:g}" if args.gln_rate != GLN_NETWORK["learning_rate"] else ""
    if args.gln_rate_scale:
        rate = f"rate min({args.gln_rate_scale:g}/t, {args.gln_rate:g})"
    context = (f"context {args.context_dim}"
               if args.context_dim != GLN_NETWORK["context_dim"] else "")
    details = [args.input_scaling] + [d for d in (
        "per_row" if args.side_info == "per_row" else "", context, rate) if d]
    return f"gln ({', '.join(details)})"


def draw(figures: list[dict], path: Path) -> None:
    """Accuracy on tasks 1, 2 and 4 and the mean over the tasks learned (columns) against
    tasks learned, mean and 95% CI over seeds, one line per model."""
    import matplotlib  # noqa: PLC0415 - a benchmark-only extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    tasks = figures[0]["tasks"]
    shown = [j for j in (1, 2, 4) if j < tasks] + [0]  # 0: the mean over the tasks so far
    fig, axes = plt.subplots(1, len(shown), figsize=(3.2 * len(shown), 3.2), sharey=True,
                             squeeze=False)
    for ax, j in zip(axes[0], shown, strict=True):
        for model in dict.fromkeys(f["model"] for f in figures):
            runs = [f["accuracy"] for f in figures if f["model"] == model]
            after = list(range(max(j, 1), tasks + 1))
            seen = [[r[k - 1][j - 1] if j else float(np.mean(r[k - 1])) for r in runs]
                    for k in after]
            ax.errorbar(after, [np.mean(a) for a in seen], yerr=[ci95(a) for a in seen],
                        marker="o", ms=3, capsize=2, label=model)
        ax.set_title(f"task {j}" if j else "all tasks learned, mean")
        ax.set_xlabel("tasks learned")
        ax.set_xlim(0.5, tasks + 0.5)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("test accuracy")
    axes[0][-1].legend(fontsize=7)
    runs = figures[0]
    fig.suptitle(f"Permuted MNIST, one pass a task ({runs['train_per_task']:,} examples a "
                 f"task, {len({f['seed'] for f in figures})} seeds)", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_mnist_arguments(parser, QUICK)
    parser.add_argument("--tasks", type=int)
    parser.add_argument("--train-per-task", type=int)
    parser.add_argument("--test-per-task", type=int)
    parser.add_argument("--seeds", type=int)
    parser.add_argument("--models", default=",".join(MODELS),
                        help="comma-separated, of gln, mlp, ewc (the peers need PyTorch)")
    parser.add_argument("--ewc-samples", type=int, default=EWC_SAMPLES,
                        help="examples a task EWC's Fisher diagonals are taken from")
    parser.add_argument("--input-scaling", default="unit_fixed",
                        choices=["unit_fixed", "unit", "standardize"])
    parser.add_argument("--side-info", default="scaled", choices=["scaled", "per_row"],
                        help="the GLN's gating input (GLN(side_info=...))")
    parser.add_argument("--gln-rate", type=float, default=GLN_NETWORK["learning_rate"],
                        help="the GLN's constant learning rate (the appendix's: 0.01)")
    parser.add_argument("--gln-rate-scale", type=float,
                        help="instead, the GLN's rate min(s / t, --gln-rate) (t: examples "
                        "learned, over all tasks)")
    parser.add_argument("--context-dim", type=int, default=GLN_NETWORK["context_dim"],
                        help="the GLN's context dimension (the appendix's: 6)")
    parser.add_argument("--validation", action="store_true",
                        help="score on the last training images (never learned here) instead "
                        "of the test set: for choosing settings")
    parser.add_argument("--device", default="cpu", help="the GLN's device (GLN(device=...))")
    parser.add_argument("--results", type=Path, help="add the runs to this results file")
    parser.add_argument("--figure", type=Path, help="draw the runs (PNG)")
    parser.add_argument("--machine", default=machine(), help="the machine, for --results")
    parser.add_argument("--redraw", action="store_true",
                        help="run nothing: draw --figure from the runs of --results of this size")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.redraw:
        size = {"tasks": args.tasks, "train_per_task": args.train_per_task,
                "test_per_task": args.test_per_task}
        figures = same_size([size], args.results)
        draw(figures, args.figure)
        return figures

    models = [m for m in args.models.split(",") if m]
    torch = torch_or_none() if set(models) - {"gln"} else None
    if torch is None and set(models) - {"gln"}:
        print("PyTorch is not installed: the MLP and EWC are skipped", file=sys.stderr)
        models = [m for m in models if m == "gln"]
    if torch is not None:
        torch.set_num_threads(max(1, torch.get_num_threads()))
    X_train, y_train, X_test, y_test = mnist_pixels(args.data_dir, args.synthetic)
    if args.validation:  # held out from the end of the training set; tasks learn its start
        held = min(len(X_test), len(X_train) - args.train_per_task)
        if held < 1:
            raise SystemExit("--validation needs --train-per-task below the training set's size")
        X_train, y_train, X_test, y_test = (X_train[:-held], y_train[:-held],
                                            X_train[-held:], y_train[-held:])
    data = {"X_train": X_train[:args.train_per_task], "y_train": y_train[:args.train_per_task],
            "X_test": X_test[:args.test_per_task], "y_test": y_test[:args.test_per_task]}
    args.train_per_task, args.test_per_task = len(data["X_train"]), len(data["X_test"])

    figures = []
    total = len(models) * args.seeds * args.tasks * args.train_per_task
    with tqdm(total=total, unit="ex", desc="permuted MNIST", file=sys.stderr) as bar:
        for seed in range(args.seeds):
            orders = permutations(args.tasks, seed)
            for model in models:
                if model == "gln":
                    accuracy = run_gln(data, orders, seed, args, bar)
                else:
                    accuracy = run_mlp(torch, data, orders, seed, model == "ewc", bar,
                                       args.ewc_samples)
                figures.append(summary(model, seed, accuracy, args))
                print(json.dumps(figures[-1]), flush=True)
    if args.results:
        command = recorded_command("benchmarks/paper/permuted_mnist.py",
                                   sys.argv[1:] if argv is None else argv, args.data_dir)
        append_runs(args.results, command, args.machine, figures)
    if args.figure:
        draw(same_size(figures, args.results), args.figure)
    return figures


def same_size(figures: list[dict], results: Path | None) -> list[dict]:
    """What to draw: every run of ``results`` (all of them, of this and earlier commands) of
    the size of ``figures`` and scored on the same images (test or validation), or
    ``figures`` alone without a results file."""
    if results is None:
        return figures
    size = {key: figures[0].get(key) for key in ("tasks", "train_per_task", "test_per_task",
                                                  "scored_on")}
    return [run["figures"] for run in json.loads(results.read_text())
            if all(run["figures"].get(key) == value for key, value in size.items())]


if __name__ == "__main__":
    main()
