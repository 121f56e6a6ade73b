"""Time ``GLN.saliency`` (what ``POST /v1/models/{name}/explain`` serves) per row.

    python benchmarks/explain_speed.py                  # the MNIST network, 1, 16 and 256 rows

A saliency map is the product of every layer's active weights for a row; the time is the
gather of those rows and the products. Prints one JSON line with the median milliseconds per
call and per row for each call size.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gln import GLN  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features", type=int, default=784)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--layer-sizes", default="128,128,1")
    parser.add_argument("--rows", default="1,16,256", help="rows per call, comma-separated")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    sizes = [int(r) for r in args.rows.split(",")]
    X = rng.uniform(0, 1, (max(sizes + [256]), args.features)).astype(np.float32)
    model = GLN(num_features=args.features, num_classes=args.classes,
                layer_sizes=tuple(int(k) for k in args.layer_sizes.split(",")), context_dim=4,
                device=args.device)
    model.learn(X[:256], rng.integers(0, args.classes, 256))  # weights no longer all 1/K
    model.saliency(X[:1])  # compiles the kernels
    per_call = {}
    for size in sizes:
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            model.saliency(X[:size])
            times.append(time.perf_counter() - start)
        per_call[size] = statistics.median(times)
    result = {
        "benchmark": "explain_speed",
        "device": args.device,
        "layer_sizes": args.layer_sizes,
        "ms_per_call": {str(k): round(1e3 * v, 3) for k, v in per_call.items()},
        "ms_per_row": {str(k): round(1e3 * v / k, 3) for k, v in per_call.items()},
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cpus",
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
