"""Online log loss for each floor of the input scaling's standard deviation (``min_std``).

    python benchmarks/min_std.py                       # 1e-3 (the old default) and 1e-9
    python benchmarks/min_std.py --floors 1e-3,1e-6,1e-9,1e-12 --seeds 8

One online pass per dataset and seed (rows shuffled by the seed), default model otherwise:
scikit-learn's breast cancer, wine and digits (the first 800 rows), a 50-feature
``make_classification``, and a generated set whose only informative feature has a spread of
1e-4 (a small-scale quantity that a floor above its spread hides). Prints one JSON line: the
mean prequential log loss per dataset and floor.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gln import GLN  # noqa: E402


def datasets() -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """(name, X, y) of each dataset compared."""
    from sklearn.datasets import (  # noqa: PLC0415 - a test dependency, not the library's
        load_breast_cancer,
        load_digits,
        load_wine,
        make_classification,
    )

    yield "breast_cancer", *load_breast_cancer(return_X_y=True)
    yield "wine", *load_wine(return_X_y=True)
    X, y = load_digits(return_X_y=True)
    yield "digits_800", X[:800], y[:800]
    yield "classification_50", *make_classification(2000, 50, n_informative=10, random_state=0)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 5))
    y = (X[:, 0] + 0.3 * rng.normal(size=2000) > 0).astype(int)
    X[:, 0] *= 1e-4
    yield "spread_1e-4", X, y


def online_log_loss(X: np.ndarray, y: np.ndarray, min_std: float, seed: int) -> float:
    """Mean prequential log loss of one pass over the rows in the seed's order."""
    order = np.random.default_rng(seed).permutation(len(y))
    model = GLN(num_features=X.shape[1], num_classes=int(y.max()) + 1, seed=seed,
                min_std=min_std)
    probs = model.learn(X[order], y[order])
    return float(-np.log(probs[np.arange(len(y)), y[order]]).mean())


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--floors", default="1e-3,1e-9", help="min_std values, comma-separated")
    parser.add_argument("--seeds", type=int, default=4)
    args = parser.parse_args(argv)
    floors = [float(f) for f in args.floors.split(",")]
    losses = {
        name: {f"{floor:g}": round(float(np.mean(
            [online_log_loss(X, y, floor, seed) for seed in range(args.seeds)])), 4)
            for floor in floors}
        for name, X, y in datasets()
    }
    result = {"benchmark": "min_std", "seeds": args.seeds, "log_loss": losses,
              "machine": f"{platform.machine()}"}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
