"""One prediction chunk and one learning chunk, marked for a profiler: what Nsight Compute
reads the kernels of.

    ncu --profile-from-start off --clock-control none [--section ...] \\
        python benchmarks/gpu_profile.py [--rows 2048] [--learn-rows 4096] [--data-dir DIR]

The MNIST network of ``gpu_learn.py`` learns ``--learn-rows`` rows (MNIST's with
``--data-dir`` or ``GLN_DATA_DIR``, random pixels otherwise), so that its inputs are
standardised and some gating margins are close as in service, and predicts ``--rows`` of them,
which loads every kernel. Then, each between ``cudaProfilerStart`` and ``cudaProfilerStop``,
so that with ``--profile-from-start off`` the profiler sees those calls' kernels alone: a
prediction of the ``--rows`` rows (one chunk of ``gln.staging.PREDICT_CHUNK_ROWS_GPU`` by
default: the scaling, the gating GEMM and kernels, the shared prediction kernel's three layer
passes), a call learning the next ``--learn-rows`` rows (one chunk of
``gln.model.CHUNK_ROWS_GPU`` by default, whose first two layers the resident kernel learns),
and one learning the ``--learn-rows`` after them with a warp per row (``learn_by_rows``:
``gln_row_counts``, ``gln_row_order`` and ``gln_layer_pass_rows`` for every layer).
``benchmarks/gpu_session.sh`` runs it under ncu where ncu is found, for each kernel's achieved
bandwidths, issue and warp stalls: whether a kernel is bound by memory, by issuing
instructions or by latency says which change can speed it up. Prints one JSON line per
profiled call (its rows, its outputs' digest); needs CuPy and a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gln.staging  # noqa: E402
from benchmarks.gpu_learn import NETWORK, load_data, row_warps  # noqa: E402
from gln import GLN  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=gln.staging.PREDICT_CHUNK_ROWS_GPU,
                        help="rows of the profiled prediction")
    parser.add_argument("--learn-rows", type=int, default=4096)
    parser.add_argument("--data-dir", help="directory of the MNIST IDX files (or GLN_DATA_DIR)")
    args = parser.parse_args(argv)

    import cupy as cp  # noqa: PLC0415 - the benchmark needs a GPU

    learned = args.learn_rows
    X, y, data = load_data(args, max(args.rows, 3 * learned))
    model = GLN(**NETWORK, device="cuda")
    model.learn(X[:learned], y[:learned])
    rows = X[:args.rows]
    model.predict_proba(rows)  # every kernel compiled and loaded before the profiled calls
    by_rows = X[2 * learned:3 * learned], y[2 * learned:3 * learned]
    calls = [("predict", args.rows, lambda: model.predict_proba(rows), contextlib.nullcontext),
             ("learn", learned, lambda: model.learn(X[learned:2 * learned],
                                                    y[learned:2 * learned]),
              contextlib.nullcontext),
             ("learn_by_rows", learned, lambda: model.learn(*by_rows), row_warps)]
    for verb, count, call, setting in calls:
        cp.cuda.Device().synchronize()
        cp.cuda.runtime.profilerStart()
        with setting():
            outputs = np.asarray(call())
        cp.cuda.Device().synchronize()
        cp.cuda.runtime.profilerStop()
        print(json.dumps({"benchmark": "gpu_profile", "data": data, "verb": verb,
                          "rows": count,
                          "outputs_digest": hashlib.sha256(outputs.tobytes()).hexdigest()[:16]}),
              flush=True)


if __name__ == "__main__":
    main()
