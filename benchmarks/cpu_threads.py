"""CPU learn and predict time per call size: the default gating against its two peers.

    python benchmarks/cpu_threads.py                    # the MNIST network, call sizes 1..256

Three ways to decide a call's contexts, each with the layer pass as it is:

* ``default``: calls of at most ``INT16_MAX_ROWS`` rows multiply with a 16-bit copy of the
  normals on the kernel threads (``gln.kernels.cpu_int16_gating``); longer calls split their
  float32 product over threads of their own, each on single-threaded BLAS
  (``gln.kernels.cpu_gating``);
* ``float32_split``: every call split that way (``INT16_MAX_ROWS = 0``);
* ``threaded_blas``: one product on the threaded BLAS, whose idle threads spin for a while
  afterwards.

All learn the same stream from the same weights, in alternating rounds, so the machine's load
falls on each; between two modes a pause lets spinning threads go idle. Prints one JSON line
per mode with the median milliseconds per learn call for each call size, learn examples/s at
the largest size, predict rows/s, and whether it learned the default's bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import platform
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gln.kernels.cpu as cpu_kernels  # noqa: E402
import gln.kernels.cpu_gating as cpu_gating  # noqa: E402
from gln import GLN  # noqa: E402
from gln.gating import layer_contexts  # noqa: E402

MODES = ("default", "float32_split", "threaded_blas")


@contextlib.contextmanager
def mode_of(model: GLN, mode: str) -> Iterator[None]:
    """Run ``model`` as ``mode`` inside the block."""
    saved_contexts, saved_rows = model._layer_contexts, cpu_gating.INT16_MAX_ROWS
    if mode == "float32_split":
        cpu_gating.INT16_MAX_ROWS = 0
    elif mode == "threaded_blas":
        model._layer_contexts = functools.partial(layer_contexts, np,
                                                  dots=cpu_kernels.cpu_exact_dots)
    try:
        yield
    finally:
        model._layer_contexts, cpu_gating.INT16_MAX_ROWS = saved_contexts, saved_rows


def time_mode(start: bytes, mode: str, X: np.ndarray, y: np.ndarray, sizes: list[int],
              calls: int, predict_rows: int) -> dict:
    """Milliseconds per learn call for each size, and predict rows/s, for one mode."""
    model = GLN.from_bytes(start)
    per_call, offset = {}, 0
    with mode_of(model, mode):
        for size in sizes:
            times = []
            for _ in range(max(3, calls // size)):
                rows = slice(offset % (len(X) - size), offset % (len(X) - size) + size)
                offset += size
                t0 = time.perf_counter()
                model.learn(X[rows], y[rows])
                times.append(time.perf_counter() - t0)
            per_call[size] = float(np.median(times)) * 1e3
        t0 = time.perf_counter()
        model.predict_proba(X[:predict_rows])
        predict_rate = predict_rows / (time.perf_counter() - t0)
    return {"ms_per_call": per_call, "predict_rows_per_second": predict_rate,
            "sha256": hashlib.sha256(model.to_bytes()).hexdigest()}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features", type=int, default=784)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--layer-sizes", default="128,128,1")
    parser.add_argument("--call-sizes", default="1,2,3,4,8,16,32,256",
                        help="rows per learn call, comma-separated")
    parser.add_argument("--calls", type=int, default=256,
                        help="rows learned per call size (at least 3 calls)")
    parser.add_argument("--predict-rows", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.call_sizes.split(",")]

    rng = np.random.default_rng(0)
    X = rng.uniform(0, 1, (max(args.predict_rows, 4096), args.features)).astype(np.float32)
    y = rng.integers(0, args.classes, len(X))
    model = GLN(num_features=args.features, num_classes=args.classes,
                layer_sizes=tuple(int(k) for k in args.layer_sizes.split(",")), context_dim=4)
    model.learn(X[:512], y[:512])  # compiles the kernels, sets the input statistics
    start = model.to_bytes()

    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for _ in tqdm(range(args.rounds), desc="rounds", file=sys.stderr):
        for mode in MODES:
            time.sleep(0.5)  # spinning threads of the mode before go idle
            runs[mode].append(time_mode(start, mode, X, y, sizes, args.calls, args.predict_rows))

    results = []
    for mode in MODES:
        ms = {size: float(np.median([r["ms_per_call"][size] for r in runs[mode]]))
              for size in sizes}
        results.append({
            "benchmark": "cpu_threads", "mode": mode,
            "ms_per_learn_call": {str(size): round(ms[size], 3) for size in sizes},
            "learn_examples_per_second_at_largest": sizes[-1] / ms[sizes[-1]] * 1e3,
            "predict_rows_per_second": float(np.median(
                [r["predict_rows_per_second"] for r in runs[mode]])),
            "same_bytes_as_default": all(
                a["sha256"] == b["sha256"]
                for a, b in zip(runs[mode], runs["default"], strict=True)),
            "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
        })
    for result in results:
        print(json.dumps(result))
    return results


if __name__ == "__main__":
    main()
