"""One prediction chunk, marked for a profiler: what Nsight Compute reads the kernels of.

    ncu --profile-from-start off --clock-control none [--section ...] \\
        python benchmarks/gpu_profile.py [--rows 2048] [--data-dir DIR]

The MNIST network of ``gpu_learn.py`` learns ``--learn-rows`` rows (MNIST's with
``--data-dir`` or ``GLN_DATA_DIR``, random pixels otherwise), so that its inputs are
standardised and some gating margins are close as in service, predicts ``--rows`` of them once
to load every kernel, then predicts them again between ``cudaProfilerStart`` and
``cudaProfilerStop``: with ``--profile-from-start off`` the profiler sees that call's kernels
alone (one chunk of ``gln.staging.PREDICT_CHUNK_ROWS_GPU`` rows by default: the scaling, the
gating GEMM and kernels, the three layer passes). ``benchmarks/gpu_session.sh`` runs it under
ncu where ncu is found, for each kernel's achieved bandwidths, issue and warp stalls: whether
a kernel is bound by memory, by issuing instructions or by latency says which change can
speed it up. Prints one JSON line (the rows, the outputs' digest); needs CuPy and a GPU.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gln.staging  # noqa: E402
from benchmarks.gpu_learn import NETWORK, load_data  # noqa: E402
from gln import GLN  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=gln.staging.PREDICT_CHUNK_ROWS_GPU,
                        help="rows of the profiled prediction")
    parser.add_argument("--learn-rows", type=int, default=4096)
    parser.add_argument("--data-dir", help="directory of the MNIST IDX files (or GLN_DATA_DIR)")
    args = parser.parse_args(argv)

    import cupy as cp  # noqa: PLC0415 - the benchmark needs a GPU

    X, y, data = load_data(args, max(args.rows, args.learn_rows))
    model = GLN(**NETWORK, device="cuda")
    model.learn(X[:args.learn_rows], y[:args.learn_rows])
    rows = X[:args.rows]
    model.predict_proba(rows)  # every kernel compiled and loaded before the profiled call
    cp.cuda.Device().synchronize()
    cp.cuda.profiler.start()
    outputs = np.asarray(model.predict_proba(rows))
    cp.cuda.Device().synchronize()
    cp.cuda.profiler.stop()
    print(json.dumps({"benchmark": "gpu_profile", "data": data, "rows": args.rows,
                      "outputs_digest": hashlib.sha256(outputs.tobytes()).hexdigest()[:16]}),
          flush=True)


if __name__ == "__main__":
    main()
