"""What the paper's experiments share: MNIST pixels (or generated stand-ins), the peers'
networks in PyTorch, results rows and figures.

PyTorch and matplotlib are the ``paper`` extra (``pip install -e '.[paper]'``); the GLN side
needs neither, so a script asked for the GLN alone runs without them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.mnist import load_mnist

REPO = Path(__file__).resolve().parents[2]
FIGURES = REPO / "docs" / "figures"


def mnist_pixels(directory: str | None, synthetic: bool, seed: int = 0
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Train and test pixels (n, 784) float32 in [0, 1] and labels (n,) int64: MNIST from
    ``directory`` (or ``$GLN_DATA_DIR``), or with ``synthetic`` generated 28 x 28 digits
    (``synthetic_digits``: 2,000 train, 500 test) that need no files."""
    if synthetic:
        X, y = synthetic_digits(2500, seed)
        return X[:2000], y[:2000], X[2000:], y[2000:]
    chosen = directory or os.environ.get("GLN_DATA_DIR")
    if not chosen:
        raise SystemExit("give --data-dir, set GLN_DATA_DIR, or pass --synthetic")
    train_images, train_labels = load_mnist(Path(chosen), "train")
    test_images, test_labels = load_mnist(Path(chosen), "test")
    return (_flat(train_images), train_labels, _flat(test_images), test_labels)


def _flat(images: np.ndarray) -> np.ndarray:
    return (images.astype(np.float32) / 255.0).reshape(len(images), -1)


def synthetic_digits(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` 28 x 28 images of 10 classes in [0, 1], flattened: each class a blurred random
    stroke pattern, each image its class's pattern with pixel noise and a random brightness.
    A stand-in with MNIST's shape and sparsity for tests, learnable but not trivially."""
    rng = np.random.default_rng(seed)
    prototypes = np.zeros((10, 28, 28))
    for c in range(10):
        for _ in range(40):
            r, s = rng.integers(4, 24, size=2)
            prototypes[c, r - 2:r + 2, s - 2:s + 2] += 0.5
    prototypes = np.clip(prototypes, 0, 1).reshape(10, -1)
    labels = rng.integers(0, 10, size=n)
    noise = rng.random((n, 784)) < 0.05
    X = prototypes[labels] * rng.uniform(0.6, 1.0, size=(n, 1)) + 0.5 * noise
    return np.clip(X, 0, 1).astype(np.float32), labels.astype(np.int64)


def commit() -> str:
    """The short hash of the checkout measured ("unknown" outside a git checkout)."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                             capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> str:
    """The machine, as the results files name it."""
    return f"{platform.machine()}, {os.cpu_count()} cpus"


NOT_RECORDED = ("--results", "--machine", "--figure")  # where the runs went, not what ran


def recorded_command(script: str, argv: list[str], data_dir: str | None) -> str:
    """The command a results row names: ``script`` with ``argv``, the data directory written
    DIR and the options that only say where the results go left out."""
    words, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word in NOT_RECORDED:
            skip = True
        elif not word.startswith(NOT_RECORDED):
            words.append("DIR" if data_dir is not None and word == data_dir else word)
    return " ".join(["python", script, *words])


def append_runs(path: Path, command: str, machine_name: str, figures: list[dict]) -> None:
    """Add one row per run (``figures``) to the results file ``path`` (a JSON list, one row a
    line, as the other results files)."""
    runs = json.loads(path.read_text()) if path.exists() else []
    hash_ = commit()
    runs += [{"command": command, "machine": machine_name, "commit": hash_, "figures": f}
             for f in figures]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("[\n" + ",\n".join(json.dumps(run) for run in runs) + "\n]\n")


def torch_or_none() -> Any:
    """PyTorch, or None where it is not installed (the peers are then skipped)."""
    try:
        import torch  # noqa: PLC0415 - a benchmark-only extra
    except ImportError:
        return None
    return torch


def mlp(torch: Any, sizes: list[int], seed: int) -> Any:
    """A ReLU MLP of layer widths ``sizes`` (inputs first, classes last), seeded."""
    torch.manual_seed(seed)
    layers: list[Any] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(torch.nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def mlp_accuracy(torch: Any, net: Any, X: np.ndarray, y: np.ndarray) -> float:
    """The fraction of ``X`` that ``net`` classifies as ``y``."""
    with torch.no_grad():
        logits = torch.cat([net(torch.from_numpy(X[i:i + 4096]))
                            for i in range(0, len(X), 4096)])
    return float((logits.argmax(dim=1).numpy() == y).mean())


def ci95(values: list[float]) -> float:
    """Half-width of a normal 95% confidence interval of the mean of ``values``."""
    if len(values) < 2:
        return 0.0
    return float(1.96 * np.std(values, ddof=1) / np.sqrt(len(values)))


def add_mnist_arguments(parser: argparse.ArgumentParser, quick: Any,
                        data: str = "directory of the MNIST IDX files (or GLN_DATA_DIR)"
                        ) -> None:
    """The options of a script that learns MNIST: where the digits are (``data`` says what
    the directory holds), generated digits instead (for tests), and the quick size (``quick``
    says what it is)."""
    parser.add_argument("--data-dir", help=data)
    parser.add_argument("--synthetic", action="store_true",
                        help="generated 28 x 28 digits instead of MNIST (for tests)")
    parser.add_argument("--quick", action="store_true",
                        help=f"a few minutes on two cores: {quick}")


def save_figure(fig: Any, path: Path, dpi: int = 110) -> None:
    """Write a matplotlib figure to ``path`` (its folder made if missing), then close it."""
    import matplotlib.pyplot as plt  # noqa: PLC0415 - only the scripts that draw need it

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
