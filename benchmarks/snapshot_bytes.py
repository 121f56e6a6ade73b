"""Time a model's bytes both ways: ``GLN.to_bytes`` (a snapshot, an export) and
``GLN.from_bytes`` (a restore, an import).

    python benchmarks/snapshot_bytes.py                  # the MNIST network: 107 MB of state
    python benchmarks/snapshot_bytes.py --device cuda    # a GPU model (bytes to and from it)

A service snapshots (and exports) through ``gln.SnapshotBuffer``: the buffer is made while
the model learns on, ``capture`` copies the state under the model's lock (how long learning
waits for each snapshot), and ``seal`` checksums the copy after the lock is released; the
three are timed apart, beside ``to_bytes``, which did all of it under the lock before.
``from_bytes`` is most of what a restore or an import spends besides reading the bytes. Each
call's result is dropped before the next, as a service drops a snapshot once it is stored, so
the memory of one call is reused by the next and the figures leave out the cost of first
touching new memory (which a fresh process or a machine's first import pays on top). Prints
one JSON line with the median and fastest milliseconds of each.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gln import GLN, SnapshotBuffer  # noqa: E402


def summary(seconds: list[float]) -> dict[str, float]:
    """Median and fastest of a list of times, in milliseconds."""
    return {"median_ms": round(1e3 * statistics.median(seconds), 2),
            "min_ms": round(1e3 * min(seconds), 2)}


def milliseconds(call: Callable[[], object], runs: int) -> dict[str, float]:
    """Median and fastest time of ``runs`` calls, each result dropped before the next."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - start)
        del result
    return summary(times)


def buffered_steps(model: GLN, runs: int) -> dict[str, dict[str, float]]:
    """The steps of a snapshot through a new ``SnapshotBuffer`` each run, as a service takes
    one: making the buffer, ``capture`` (under the lock) and ``seal`` (after it)."""
    steps: dict[str, list[float]] = {"buffer": [], "capture": [], "seal": []}
    for _ in range(runs):
        start = time.perf_counter()
        buffer = SnapshotBuffer(model)
        made = time.perf_counter()
        buffer.capture(model)
        captured = time.perf_counter()
        blob = buffer.seal()
        steps["buffer"].append(made - start)
        steps["capture"].append(captured - made)
        steps["seal"].append(time.perf_counter() - captured)
        del blob, buffer
    return {step: summary(times) for step, times in steps.items()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features", type=int, default=784)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--layer-sizes", default="128,128,1")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args(argv)

    model = GLN(num_features=args.features, num_classes=args.classes,
                layer_sizes=tuple(int(k) for k in args.layer_sizes.split(",")), context_dim=4,
                device=args.device)
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 1, (256, args.features)).astype(np.float32)
    model.learn(X, rng.integers(0, args.classes, len(X)))  # statistics and weights not initial
    blob = model.to_bytes()
    if GLN.from_bytes(blob, args.device).to_bytes() != blob:
        raise AssertionError("a loaded model's bytes differ from the bytes it was loaded from")
    buffer = SnapshotBuffer(model)
    buffer.capture(model)
    if buffer.seal() != blob:
        raise AssertionError("a snapshot buffer's bytes differ from to_bytes")
    del buffer
    result = {
        "benchmark": "snapshot_bytes",
        "device": args.device,
        "layer_sizes": args.layer_sizes,
        "snapshot_bytes": len(blob),
        "to_bytes": milliseconds(model.to_bytes, args.runs),
        **buffered_steps(model, args.runs),
        "from_bytes": milliseconds(lambda: GLN.from_bytes(blob, args.device), args.runs),
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cpus",
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
