"""pygln, a public GLN implementation, as a side-by-side peer for the speed benchmarks.

pygln (github.com/aiwabdn/pygln) is GPL-licensed and is never copied into this repository:
clone it anywhere and pass the checkout with ``--pygln-dir``. Its PyTorch backend is the one
that runs with today's libraries (its NumPy backend calls ``np.int``, removed in NumPy 1.24;
its JAX backend calls ``jax.jit(fun=...)``, which JAX no longer accepts), and it moves itself
to CUDA where PyTorch sees a GPU.

The peer is built with the same network as ours: layers [128, 128] plus pygln's implicit output
neuron, context dimension 4, halfspaces with random offsets (``context_bias``), the paper's
learning rate min(100 / t, 0.01), weights clipped to [-5, 5]. pygln's own defaults otherwise
(min-max scaled pixels as base predictions, predictions clipped to [1e-3, 1 - 1e-3]); the work
per example is the same: gate, gather the active rows, mix, update, scatter.

Exact online learning is one ``predict(x, target)`` call per example. pygln also takes a batch
per call, but then every example of the batch is predicted from the same weights and the
updates are summed: not Algorithm 1, and reported under its own name. Its batched mixing forms
all B x B products of a batch and keeps the diagonal, so batches stay small: its README learns
in batches of ~10 and predicts in batches of 100 (a batch of 4,096 would need ~86 GB for the
first layer alone).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def add_pygln_argument(parser: argparse.ArgumentParser) -> None:
    """``--pygln-dir`` (default: ``PYGLN_DIR``), the checkout a benchmark runs side by side."""
    parser.add_argument("--pygln-dir", type=Path, default=os.environ.get("PYGLN_DIR"),
                        help="a checkout of github.com/aiwabdn/pygln to run side by side "
                             "(or set PYGLN_DIR)")


def build_peer(pygln_dir: Path, num_features: int, num_classes: int, seed: int = 0) -> Any:
    """pygln's PyTorch GLN shaped like the benchmark's network ([128, 128, 1], context dim 4)."""
    if not (Path(pygln_dir) / "pygln" / "__init__.py").is_file():
        raise FileNotFoundError(f"{pygln_dir} is not a pygln checkout (no pygln/__init__.py)")
    if str(pygln_dir) not in sys.path:
        sys.path.insert(0, str(pygln_dir))
    from pygln.pytorch.gln import GLN, PaperLearningRate  # noqa: PLC0415 - a user's checkout

    np.random.seed(seed)  # pygln draws its hyperplanes from NumPy's global generator
    return GLN(layer_sizes=[128, 128], input_size=num_features, num_classes=num_classes,
               context_map_size=4, context_bias=True, learning_rate=PaperLearningRate(),
               weight_clipping=5.0)


def learn_rate(model: Any, X: np.ndarray, y: np.ndarray, batch: int = 1) -> tuple[float, float]:
    """Examples per second of online learning ``batch`` rows per call, and prequential accuracy.

    Each call's predicted classes are read back to the host, as a client of online learning
    would, which also waits for the device to finish the call.
    """
    correct = 0
    start = time.perf_counter()
    for lo in range(0, len(X), batch):
        classes = np.asarray(model.predict(X[lo:lo + batch], target=y[lo:lo + batch]))
        correct += int((classes == y[lo:lo + batch]).sum())
    return len(X) / (time.perf_counter() - start), correct / len(X)


def predict_rate(model: Any, X: np.ndarray, batch: int) -> float:
    """Examples per second of prediction without learning, ``batch`` rows per call."""
    start = time.perf_counter()
    for lo in range(0, len(X), batch):
        np.asarray(model.predict(X[lo:lo + batch], return_probs=True))
    return len(X) / (time.perf_counter() - start)


def measure(pygln_dir: Path, X: np.ndarray, y: np.ndarray, examples: int,
            learn_batch: int = 10, predict_batch: int = 100) -> list[dict]:
    """The peer's measurements on the stream ``X, y``, one record each.

    A warm-up model first learns and predicts a few rows, so that CUDA's start-up and the
    allocator's growth stay out of the timings; each timed model starts fresh.
    """
    n_classes = int(y.max()) + 1
    warm = build_peer(pygln_dir, X.shape[1], n_classes)
    learn_rate(warm, X[:4], y[:4])
    learn_rate(warm, X[:learn_batch], y[:learn_batch], learn_batch)
    predict_rate(warm, X[:predict_batch], predict_batch)

    common = {"examples": examples, "peer": "pygln (PyTorch backend)"}
    model = build_peer(pygln_dir, X.shape[1], n_classes)
    rate, accuracy = learn_rate(model, X[:examples], y[:examples])
    records = [{"measure": "learn", "implementation": "pygln", "call_rows": 1,
                "examples_per_second": rate, "prequential_accuracy": accuracy,
                "exact_per_example": True, **common}]
    model = build_peer(pygln_dir, X.shape[1], n_classes)
    rate, accuracy = learn_rate(model, X[:examples], y[:examples], learn_batch)
    records.append({"measure": "learn", "implementation": "pygln_batched",
                    "call_rows": learn_batch, "examples_per_second": rate,
                    "prequential_accuracy": accuracy, "exact_per_example": False, **common})
    records.append({"measure": "predict", "implementation": "pygln", "call_rows": predict_batch,
                    "examples_per_second": predict_rate(model, X[:examples], predict_batch),
                    **common})
    return records
