"""Short calls of several models at once: one-row learns per second, by threads.

A server gives each model a worker thread of its own, so the calls of two models can overlap.
Each of ``--threads`` threads learns one-row calls (``GLN._learn_checked``, the call a model's
worker makes) on a model of its own (20 features, 2 classes, ``[32, 32, 1]`` by default), and
the total rate is printed, one JSON line, for each count of threads in turn, ``--rounds``
times (alternating, since a shared machine's rate drifts):

    python benchmarks/concurrent_models.py --threads 1 2 --calls 3000 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from typing import Any

import numpy as np

from gln import GLN


def learns_per_second(threads: int, calls: int, config: dict[str, Any]) -> float:
    """One-row learns per second in all, ``threads`` models learning ``calls`` rows each."""
    models = [GLN(**config, seed=0) for _ in range(threads)]
    rng = np.random.default_rng(0)
    X = rng.normal(size=(calls, config["num_features"])).astype(np.float32)
    y = rng.integers(0, config["num_classes"], calls)
    rows = []
    for model in models:
        model.warm_up()
        rows.append(model.check_input(X, y))

    def learn(model: GLN, X32: np.ndarray, labels: np.ndarray) -> None:
        for t in range(calls):
            model._learn_checked(X32[t:t + 1], labels[t:t + 1])

    workers = [threading.Thread(target=learn, args=(model, *checked))
               for model, checked in zip(models, rows, strict=True)]
    start = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return threads * calls / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--calls", type=int, default=3000, help="one-row learns per thread")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--features", type=int, default=20)
    parser.add_argument("--layer-sizes", default="32,32,1")
    args = parser.parse_args(argv)
    config = {"num_features": args.features, "num_classes": 2,
              "layer_sizes": [int(k) for k in args.layer_sizes.split(",")]}
    results = []
    for round_ in range(args.rounds):
        for threads in args.threads:
            result = {"benchmark": "concurrent_models", "round": round_, "threads": threads,
                      "learns_per_s": round(learns_per_second(threads, args.calls, config), 1),
                      "config": config, "cpus": os.cpu_count()}
            print(json.dumps(result), flush=True)
            results.append(result)
    return results


if __name__ == "__main__":
    main()
