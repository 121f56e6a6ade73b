"""GPU headline rates of exact online learning, beside the plain CuPy path and pygln.

    python benchmarks/gpu_learn.py                        # random MNIST-shaped rows
    python benchmarks/gpu_learn.py --data-dir DIR         # MNIST's training images
                                                          # (or set GLN_DATA_DIR)
    python benchmarks/gpu_learn.py --pygln-dir DIR        # pygln's PyTorch GLN too

The network is the paper's MNIST one: 784 features, 10 classes, [128, 128, 1], context
dimension 4, learning rate min(100 / t, 0.01). Prints one JSON line per measurement, each
naming the device, then a ``summary`` line whose figures are those of
``benchmarks/results/gpu_learn.json``:

* ``learn``: ``GLN.learn`` examples per second, ``--chunk`` rows a call (the service's
  coalesced queue; the same bytes as one row a call), with the prequential accuracy; with the
  kernels and with ``use_kernels=False`` (``plain_cupy``: the reference layer pass of
  ``gln/network.py`` in CuPy, one example at a time, on fewer rows), and ``agreement``: whether
  the two predicted the same stream alike;
* ``predict``: ``GLN.predict_proba`` rows per second in batches of ``--chunk`` rows: float32
  rows, the same rows inside ``GLN.page_locked`` (a dataset held page-locked across its
  batches), and pixels (0-255) as uint8, which travel in a quarter of the bytes, checked to
  predict what their float32 values predict; medians of ``--rounds`` alternating passes;
* ``learn_latency`` / ``predict_latency``: one-example calls, median and p99 microseconds;
* with ``--pygln-dir DIR`` (a checkout of the public pygln, never vendored here): pygln's
  ``learn`` one example a call (exact) and in batches of 10 (not Algorithm 1), and its
  ``predict`` in batches of 100 (``benchmarks/pygln_peer.py``).

Needs CuPy and a GPU (docs/gpu.md); the tests run it on the emulated device.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.pygln_peer import add_pygln_argument, measure  # noqa: E402
from gln import GLN  # noqa: E402

# The library's defaults otherwise (standardised inputs, whole-input gating): the path that the
# service's models take unless configured.
NETWORK = dict(num_features=784, num_classes=10, layer_sizes=(128, 128, 1), context_dim=4,
               learning_rate={"schedule": "inverse_time", "scale": 100, "cap": 0.01}, seed=0)
# Rows of a warm-up call that takes the float32 gating GEMM rather than the int8 one: its
# cuBLAS kernels load lazily (about 90 ms once a process on an H200), outside the timings.
SHORT_GEMM_ROWS = 600


def emit(record: dict, device: str) -> None:
    print(json.dumps({"benchmark": "gpu_learn", "device": device, **record}), flush=True)


def load_data(data_dir: str | None, n: int) -> tuple[np.ndarray, np.ndarray, str]:
    """``n`` rows of pixels in [0, 1] (MNIST's training set, repeated if needed, or random)."""
    directory = data_dir or os.environ.get("GLN_DATA_DIR")
    if directory:
        from benchmarks.mnist import load_mnist  # noqa: PLC0415

        images, labels = load_mnist(Path(directory), "train")
        X = images.reshape(len(images), -1).astype(np.float32) / 255.0
        repeats = -(-n // len(X))
        return np.tile(X, (repeats, 1))[:n], np.tile(labels, repeats)[:n], "mnist"
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 1, (n, NETWORK["num_features"])).astype(np.float32)
    return X, rng.integers(0, NETWORK["num_classes"], n), "random"


def device_name(cp) -> str:
    """The GPU's name, as every line names it (CuPy gives bytes or str)."""
    name = cp.cuda.runtime.getDeviceProperties(0)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def warmed_model(X: np.ndarray, y: np.ndarray, chunk: int, use_kernels: bool) -> GLN:
    """A new model, after a throwaway one has made every call the timings make (compiling the
    kernels, loading cuBLAS's), so that only the steady state is timed."""
    warm = GLN(**NETWORK, device="cuda", use_kernels=use_kernels)
    warm.learn(X[:chunk], y[:chunk])
    warm.learn(X[:1], y[:1])
    warm.predict_proba(X[:chunk])
    warm.predict_proba(X[:SHORT_GEMM_ROWS])
    warm.predict_proba(X[:1])
    return GLN(**NETWORK, device="cuda", use_kernels=use_kernels)


def learn_rate(model: GLN, X: np.ndarray, y: np.ndarray, chunk: int) -> tuple[float, np.ndarray]:
    """Examples per second learning ``X`` in calls of ``chunk`` rows, and the outputs (each
    row predicted before it was learned)."""
    outputs = []
    start = time.perf_counter()
    for lo in range(0, len(X), chunk):
        outputs.append(model.learn(X[lo:lo + chunk], y[lo:lo + chunk]))  # host arrays
    return len(X) / (time.perf_counter() - start), np.concatenate(outputs)


def predict_rate(model: GLN, X: np.ndarray, chunk: int) -> float:
    """Rows per second predicting ``X`` in calls of ``chunk`` rows."""
    start = time.perf_counter()
    for lo in range(0, len(X), chunk):
        model.predict_proba(X[lo:lo + chunk])
    return len(X) / (time.perf_counter() - start)


def predict_rates(model: GLN, X: np.ndarray, y: np.ndarray, chunk: int,
                  rounds: int) -> tuple[dict[str, float], bool]:
    """Prediction rates by way of sending the rows, medians of ``rounds`` alternating passes:
    ``float32`` (``X`` as it is), ``page_locked`` (``X`` held page-locked by the block) and
    ``uint8`` (``X``'s pixels, 0-255, on a model that learned their float32 values); and
    whether the uint8 pixels predicted their float32 values' outputs to the last bit."""
    pixels = np.rint(X * 255).astype(np.uint8)
    pixel_model = GLN(**NETWORK, device="cuda")
    pixel_model.learn(pixels[:chunk].astype(np.float32), y[:chunk])
    tail = slice(len(X) - chunk, None)
    same = np.array_equal(pixel_model.predict_proba(pixels[tail]),
                          pixel_model.predict_proba(pixels[tail].astype(np.float32)))
    rates: dict[str, list[float]] = {"float32": [], "page_locked": [], "uint8": []}
    for _ in range(rounds):
        rates["float32"].append(predict_rate(model, X, chunk))
        with model.page_locked(X) as held:
            rates["page_locked"].append(predict_rate(model, held, chunk))
        rates["uint8"].append(predict_rate(pixel_model, pixels, chunk))
    return {way: float(np.median(values)) for way, values in rates.items()}, bool(same)


def latency_us(model: GLN, X: np.ndarray, y: np.ndarray | None, calls: int) -> dict:
    """Single-example ``learn`` calls (``predict_proba`` when ``y`` is None), timed one by one:
    median and p99 microseconds."""
    times = []
    for t in range(calls):
        start = time.perf_counter()
        if y is None:
            model.predict_proba(X[t:t + 1])
        else:
            model.learn(X[t:t + 1], y[t:t + 1])
        times.append(time.perf_counter() - start)
    us = np.array(times) * 1e6
    return {"median_us": float(np.median(us)), "p99_us": float(np.percentile(us, 99)),
            "calls": calls}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", help="directory of the MNIST IDX files (or GLN_DATA_DIR)")
    parser.add_argument("--examples", type=int, default=60_000, help="rows learned, kernels")
    parser.add_argument("--plain-examples", type=int, default=2_000,
                        help="rows learned by the plain per-example CuPy path")
    parser.add_argument("--chunk", type=int, default=4096, help="rows per learn/predict call")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating passes of each way of predicting")
    parser.add_argument("--latency-calls", type=int, default=1000)
    parser.add_argument("--plain-latency-calls", type=int, default=200)
    add_pygln_argument(parser)
    parser.add_argument("--pygln-examples", type=int, default=2_000,
                        help="rows learned by pygln, one per call")
    args = parser.parse_args(argv)

    import cupy as cp  # noqa: PLC0415 - the benchmark needs a GPU

    device = device_name(cp)
    peer_rows = args.pygln_examples if args.pygln_dir else 0
    total = max(args.examples, args.plain_examples, peer_rows, args.chunk) \
        + args.latency_calls
    X, y, data = load_data(args.data_dir, total)
    tail = slice(len(X) - args.latency_calls, None)  # rows unseen, for the latencies
    common = {"data": data, "call_rows": args.chunk}
    summary: dict = {}

    model = warmed_model(X, y, args.chunk, use_kernels=True)
    rate, outputs = learn_rate(model, X[:args.examples], y[:args.examples], args.chunk)
    accuracy = float((outputs.argmax(axis=1) == y[:args.examples]).mean())
    emit({"measure": "learn", "implementation": "kernels", "examples": args.examples,
          "examples_per_second": rate, "prequential_accuracy": accuracy, **common}, device)
    summary.update(learn_examples_per_second=rate, prequential_accuracy=accuracy)

    rows = X[:max(args.examples, args.chunk)]
    rates, same = predict_rates(model, rows, y, args.chunk, args.rounds)
    for way, rate in rates.items():
        emit({"measure": "predict", "implementation": "kernels", "rows": way,
              "examples": len(rows), "examples_per_second": rate, "rounds": args.rounds,
              **({"same_outputs_as_float32": same} if way == "uint8" else {}), **common},
             device)
        summary[f"predict_{way}_rows_per_second"] = rate
    for verb, labels in (("learn", y[tail]), ("predict", None)):
        latency = latency_us(model, X[tail], labels, args.latency_calls)
        emit({"measure": f"{verb}_latency", "implementation": "kernels", **latency}, device)
        summary[f"{verb}_latency_median_us"] = latency["median_us"]
        summary[f"{verb}_latency_p99_us"] = latency["p99_us"]

    plain = warmed_model(X, y, args.chunk, use_kernels=False)
    n = args.plain_examples
    rate, plain_outputs = learn_rate(plain, X[:n], y[:n], args.chunk)
    emit({"measure": "learn", "implementation": "plain_cupy", "examples": n,
          "examples_per_second": rate, **common}, device)
    difference = float(np.abs(plain_outputs - outputs[:n]).max())  # same stream, same state
    emit({"measure": "agreement", "rows": n, "max_abs_difference": difference,
          "agree": difference < 1e-3}, device)
    summary["plain_cupy_learn_examples_per_second"] = rate
    rate = predict_rate(plain, X[:n], args.chunk)
    emit({"measure": "predict", "implementation": "plain_cupy", "rows": "float32",
          "examples": n, "examples_per_second": rate, **common}, device)
    summary["plain_cupy_predict_rows_per_second"] = rate
    latency = latency_us(plain, X[tail], y[tail], min(args.plain_latency_calls,
                                                      args.latency_calls))
    emit({"measure": "learn_latency", "implementation": "plain_cupy", **latency}, device)
    summary["plain_cupy_learn_latency_median_us"] = latency["median_us"]

    if args.pygln_dir:
        for record in measure(args.pygln_dir, X, y, args.pygln_examples):
            emit({**record, "data": data}, device)
            unit = "examples" if record["measure"] == "learn" else "rows"
            summary[f"{record['implementation']}_{record['measure']}_{unit}_per_second"] = \
                record["examples_per_second"]
    emit({"measure": "summary", **common, **summary}, device)
    return summary


if __name__ == "__main__":
    main()
