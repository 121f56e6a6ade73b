"""What one-row ``GLN.learn`` and ``GLN.predict_proba`` calls cost: time, or instructions.

    python benchmarks/one_row_cost.py                   # 6 features, 2 classes, [8, 4, 1]
    python benchmarks/one_row_cost.py --features 784 --classes 10 --layer-sizes 128,128,1 \\
        --calls 500

prints the median microseconds per call of each verb (after 200 learned rows), one JSON line.
Wall clock on a shared machine is noisy: compare two checkouts in alternating runs.

Instruction counts are steadier. Under callgrind, ``--callgrind learn`` (or ``predict``)
collects only the timed loop of that verb (through callgrind's client requests, from a small C
shim compiled with ``cc`` against ``valgrind/callgrind.h``) and dumps it to ``cg.PID.1``:

    valgrind --tool=callgrind --instr-atstart=no --collect-atstart=no \\
        --callgrind-out-file=cg.%p python benchmarks/one_row_cost.py --callgrind learn

Instructions per call: the dump's ``summary:`` divided by ``--calls``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from gln import GLN

_SHIM = """
#include <valgrind/callgrind.h>
void start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION;
                   CALLGRIND_TOGGLE_COLLECT; }
void stop(void) { CALLGRIND_TOGGLE_COLLECT; CALLGRIND_DUMP_STATS;
                  CALLGRIND_STOP_INSTRUMENTATION; }
"""


def _callgrind_shim(directory: str) -> ctypes.CDLL:
    source, library = Path(directory, "shim.c"), Path(directory, "shim.so")
    source.write_text(_SHIM)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(library), str(source)],
                   check=True)
    return ctypes.CDLL(str(library))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features", type=int, default=6)
    parser.add_argument("--classes", type=int, default=2)
    parser.add_argument("--layer-sizes", default="8,4,1")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--callgrind", choices=["learn", "predict"],
                        help="run under callgrind, collecting only this verb's loop")
    args = parser.parse_args()
    layer_sizes = tuple(int(k) for k in args.layer_sizes.split(","))
    model = GLN(num_features=args.features, num_classes=args.classes, layer_sizes=layer_sizes,
                seed=0)
    model.warm_up()
    rng = np.random.default_rng(0)
    X = rng.normal(size=(args.calls + 200, args.features))
    y = rng.integers(0, args.classes, len(X))
    for t in range(200):
        model.learn(X[t:t + 1], y[t:t + 1])
    if args.callgrind:
        with tempfile.TemporaryDirectory() as directory:
            shim = _callgrind_shim(directory)
            shim.start()
            for t in range(200, 200 + args.calls):
                if args.callgrind == "learn":
                    model.learn(X[t:t + 1], y[t:t + 1])
                else:
                    model.predict_proba(X[t:t + 1])
            shim.stop()
        return
    learn, predict = [], []
    for t in range(200, 200 + args.calls):
        start = time.perf_counter()
        model.learn(X[t:t + 1], y[t:t + 1])
        learn.append(time.perf_counter() - start)
    for t in range(200, 200 + args.calls):
        start = time.perf_counter()
        model.predict_proba(X[t:t + 1])
        predict.append(time.perf_counter() - start)
    print(json.dumps({"benchmark": "one_row_cost", "features": args.features,
                      "classes": args.classes, "layer_sizes": list(layer_sizes),
                      "learn_us": round(float(np.median(learn)) * 1e6, 1),
                      "predict_us": round(float(np.median(predict)) * 1e6, 1)}))


if __name__ == "__main__":
    main()
