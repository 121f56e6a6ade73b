"""Single-example learns to many small models: one ``GLNFamily.learn`` per chunk of rows beside
one ``GLN.learn`` per row on separate models, in one run.

    python benchmarks/family_learn.py           # 1,000 models of 20 features, [32, 32, 1],
                                                # context dimension 4; chunks of 32 rows
    python benchmarks/family_learn.py --device cuda --models 10000 --chunk 1024
                                                # on a GPU: one launch a layer a chunk

Every row goes to a random model. The separate models learn the stream one row per call, as a
server without families calls the library; the family learns the same stream 32 rows a call,
each row tagged with its model. Rounds alternate between the two (and a second family run with
every kernel on one thread: a chunk of 32 rows crosses ``PARALLEL_MIN_WORK`` in the gating
kernel, whose threads, on a machine busy with other work, may wait milliseconds for a core).
On a GPU (``--device cuda``) the family and the models live in GPU memory, and the one-thread
run, a CPU matter, is left out.
Each rate is the median of its rounds, and the ratios are the medians of each round's ratio,
so that a machine shared with other work moves both sides of a ratio alike. At the end,
models sampled from the family are compared with their separate twins, byte for byte
(``members_equal``). Prints one JSON line.
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

from gln import GLN, GLNFamily  # noqa: E402
from gln.backend import resolve_device  # noqa: E402
from gln.kernels import cpu  # noqa: E402


def one_thread(learn):
    """``learn`` with every kernel on one thread (the threshold is read at each call)."""
    def learned(*args):
        saved, cpu.PARALLEL_MIN_WORK = cpu.PARALLEL_MIN_WORK, 2**62
        try:
            return learn(*args)
        finally:
            cpu.PARALLEL_MIN_WORK = saved
    return learned


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--features", type=int, default=20)
    parser.add_argument("--layer-sizes", default="32,32,1")
    parser.add_argument("--context-dim", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=32, help="rows per family call")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--round-rows", type=int, default=6400, help="rows per round and side")
    parser.add_argument("--check", type=int, default=50, help="models compared byte for byte")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda for a GPU")
    args = parser.parse_args(argv)

    config = dict(num_features=args.features, num_classes=2, context_dim=args.context_dim,
                  layer_sizes=tuple(int(k) for k in args.layer_sizes.split(",")),
                  device=args.device)
    on_cpu = resolve_device(args.device) == "cpu"
    rng = np.random.default_rng(0)
    n = args.rounds * args.round_rows
    X = rng.normal(0, 1, (n, args.features)).astype(np.float32)
    y = (X[:, 0] + rng.normal(0, 1, n) > 0).astype(np.int64)
    members = rng.integers(0, args.models, n)

    models = [GLN(**config) for _ in range(args.models)]
    for model in models:
        model.warm_up()  # compiled kernels and each model's 16-bit normals, as a server's
    families = {"family": GLNFamily(args.models, **config)}
    if on_cpu:
        families["family_one_thread"] = GLNFamily(args.models, **config)
    for family in families.values():  # each family's 16-bit normals
        family.predict_proba(X[:args.chunk], members[:args.chunk])
    GLNFamily(1, **config).learn(X[:args.chunk], y[:args.chunk], [0] * args.chunk)  # compiled

    def separate(rows: slice) -> None:
        for t in range(rows.start, rows.stop):
            models[members[t]].learn(X[t:t + 1], y[t:t + 1])

    def chunked(family: GLNFamily):
        def learn(rows: slice) -> None:
            for start in range(rows.start, rows.stop, args.chunk):
                stop = min(start + args.chunk, rows.stop)
                family.learn(X[start:stop], y[start:stop], members[start:stop])
        return learn

    sides = {"models": separate, "family": chunked(families["family"])}
    if on_cpu:
        sides["family_one_thread"] = one_thread(chunked(families["family_one_thread"]))
    rates: dict[str, list[float]] = {side: [] for side in sides}
    load_before = os.getloadavg()[0]
    for r in range(args.rounds):
        rows = slice(r * args.round_rows, (r + 1) * args.round_rows)
        for side, learn in sides.items():
            start = time.perf_counter()
            learn(rows)
            rates[side].append(args.round_rows / (time.perf_counter() - start))

    sample = np.random.default_rng(1).choice(args.models, min(args.check, args.models),
                                             replace=False)
    equal = all(family.member_bytes(int(i)) == models[i].to_bytes()
                for family in families.values() for i in sample)
    median = {side: float(np.median(r)) for side, r in rates.items()}
    ratio = {side: float(np.median(np.array(rates[side]) / np.array(rates["models"])))
             for side in families}
    result = {
        "models": args.models, "chunk_rows": args.chunk, "examples": n,
        "device": args.device,
        **{f"{side}_examples_per_second": round(median[side]) for side in families},
        "models_examples_per_second": round(median["models"]),
        **{f"{side}_over_models": round(ratio[side], 1) for side in families},
        "members_equal": equal,
        "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
