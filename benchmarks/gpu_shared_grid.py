"""The shared prediction kernel of each layer of ``gpu_learn.py``'s MNIST network under a grid
of its settings, alternating, on one GPU: what chooses ``PREDICT_SUM_BATCH``, ``PREDICT_WARPS``
and ``PREDICT_EXAMPLE_GROUP`` together.

    python benchmarks/gpu_shared_grid.py [--rows 2048] [--turns 3] [--repeats 20]
        [--sum-batches 1,8,16,32] [--warps 16,24,32] [--groups 1,2,4,8]

Why: ``gpu_learn.py`` times the sums batched at once alone (``shared_sum_batch``), but the
three settings meet in one kernel: the sums batched at once must hold whole groups of
examples, and a batch that suits one layer's rows may not suit another's. Each setting of
the grid that the kernel accepts is timed by CUDA events (``gpu_learn.mean_event_seconds``) on
random rows, in ``--turns`` turns that each time every setting once, so that the card's drift
falls on all.

Prints one JSON line per layer, setting and turn (``shared_grid``; None: the library's value).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gpu_learn import (  # noqa: E402
    NETWORK,
    device_name,
    int_list,
    layer_shapes,
    mean_event_seconds,
    module_constants,
    random_chunk,
)


def settings(batches: list[int], warps: list[int],
             groups: list[int]) -> list[tuple[int, int, int]]:
    """(sum batch, warps, examples at once) of the grid whose batch holds whole groups (one
    sum at a time takes no groups)."""
    return [(batch, count, group)
            for batch, count, group in itertools.product(batches, warps, groups)
            if batch % group == 0 and (batch > 1 or group == 1)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2048, help="rows of each launch")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20, help="timed launches per setting")
    parser.add_argument("--sum-batches", type=int_list, default=[1, 8, 16, 32])
    parser.add_argument("--warps", type=int_list, default=[16, 24, 32])
    parser.add_argument("--groups", type=int_list, default=[1, 2, 4, 8])
    args = parser.parse_args(argv)

    import cupy as cp  # noqa: PLC0415 - the benchmark needs a GPU

    import gln.kernels.cuda as cuda  # noqa: PLC0415

    device = device_name(cp)
    rng = np.random.default_rng(1)
    shapes = layer_shapes(NETWORK)
    grid = settings(args.sum_batches, args.warps, args.groups)
    for name, glns, neurons, inputs, groups in shapes:
        weights = cp.asarray(rng.uniform(-0.1, 0.1, (glns, neurons, 16, inputs)), cp.float32)
        contexts, x, targets, rates = random_chunk(cp, rng, args.rows, glns, neurons, inputs,
                                                   groups)
        probs = cp.empty((args.rows, glns, neurons), cp.float32)
        next_inputs = None if name == shapes[-1][0] else cp.empty(
            (args.rows, glns, neurons + 1), cp.float32)

        def predict(arrays=(weights, contexts, x, targets, rates), probs=probs,
                    next_inputs=next_inputs):
            cuda.cuda_layer_pass(*arrays, 0.01, 5.0, False, probs, mode="shared",
                                 next_inputs=next_inputs, bias_logit=1.0)

        for turn in range(args.turns):
            for batch, count, group in grid:
                with module_constants(cuda, PREDICT_SUM_BATCH=batch, PREDICT_WARPS=count,
                                      PREDICT_EXAMPLE_GROUP=group):
                    seconds = mean_event_seconds(cp, predict, args.repeats)
                print(json.dumps({"benchmark": "gpu_shared_grid", "device": device,
                                  "measure": "shared_grid", "layer": name, "inputs": inputs,
                                  "rows": args.rows, "sum_batch": batch, "warps": count,
                                  "example_group": group,
                                  "turn": turn, "microseconds": seconds * 1e6}), flush=True)


if __name__ == "__main__":
    main()
