"""How long the row kernel's chains are on real data, on the CPU: per neuron, the examples of a
chunk that its most common context takes. ``gln_layer_pass_rows`` gives each row a warp, which
runs the examples of the row's context one after another, so a layer's chunk takes at least
its longest chain; the resident kernel runs every neuron through the whole chunk.

    python benchmarks/context_chains.py --data-dir DIR      # gpu_learn.py's network
    python benchmarks/context_chains.py --data-dir DIR --offset-scale 0.1 --side-info per_row \\
        --side-info-blur 1.5 --gating-window 10 --min-std 0.3  # mnist_online.py's settings

A model learns ``--learned`` MNIST training images, then gates the next ``--rows`` with the
moments it holds. Prints one JSON line per layer: the longest chain's median, 90th percentile
and maximum over the layer's neurons, the mean over all rows of the examples each takes, and
when the layer's rows would all be done if ``--slots`` warps at a time took them, each as soon
as a slot frees, every example taking the same time (a crude model: on a GPU the warps share
their schedulers and memory): in the kernel's natural order (neuron by neuron) and longest
first (``ROW_ORDER``), in examples.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.mnist import data_dir, load_mnist  # noqa: E402
from gln import GLN  # noqa: E402


def row_counts(contexts: np.ndarray, num_contexts: int) -> np.ndarray:
    """The examples of each row, (G * K * S,), in the row kernel's natural order: row c of
    neuron (g, k) at (g * K + k) * S + c."""
    return np.stack([(contexts == c).sum(axis=0) for c in range(num_contexts)], -1).ravel()


def longest_chains(contexts: np.ndarray, num_contexts: int) -> np.ndarray:
    """(G, K): for each neuron of (n, G, K) contexts, the examples of its most common one."""
    return row_counts(contexts, num_contexts).reshape(*contexts.shape[1:], -1).max(axis=-1)


def finish_time(chains: np.ndarray, slots: int) -> int:
    """When the last of ``chains`` (examples each, in the order given) ends if ``slots`` run at
    once, each taken by the first slot to free, every example one unit of time."""
    free = [0] * slots
    for chain in chains.tolist():
        heapq.heappush(free, heapq.heappop(free) + chain)
    return max(free)


def chunk_contexts(model: GLN, X: np.ndarray) -> list[np.ndarray]:
    """Each layer's contexts (n, G, K) of rows ``X``, gated as the model gates them now."""
    X32, _ = model.check_input(X)
    count = np.array([[float(model.moments.count)]])
    z, _, _ = model._scale(X32.astype(np.float64), count, False)
    return [np.asarray(layer) for layer in model._contexts(z)]


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", help="directory of the MNIST IDX files (or GLN_DATA_DIR)")
    parser.add_argument("--rows", type=int, default=4096, help="the chunk gated")
    parser.add_argument("--learned", type=int, default=2048, help="images learned before it")
    parser.add_argument("--offset-scale", type=float, default=1.0)
    parser.add_argument("--side-info", choices=["scaled", "per_row"], default="scaled")
    parser.add_argument("--side-info-blur", type=float, default=0.0)
    parser.add_argument("--gating-window", type=int, default=0)
    parser.add_argument("--input-scaling", choices=["standardize", "unit"], default="standardize")
    parser.add_argument("--min-std", type=float, default=1e-9)
    parser.add_argument("--slots", type=int, default=132 * 17,
                        help="row warps at a time (an H100: 132 SMs, 17 warps of 120 registers)")
    args = parser.parse_args(argv)

    images, labels = load_mnist(data_dir(args.data_dir), "train")
    X = images.reshape(len(images), -1).astype(np.float32) / 255.0
    model = GLN(num_features=X.shape[1], num_classes=10, layer_sizes=(128, 128, 1),
                context_dim=4, offset_scale=args.offset_scale, side_info=args.side_info,
                side_info_blur=args.side_info_blur, gating_window=args.gating_window,
                input_scaling=args.input_scaling, min_std=args.min_std,
                image_shape=images.shape[1:], seed=0)
    model.learn(X[:args.learned], labels[:args.learned])
    chunk = X[args.learned:args.learned + args.rows]
    records = []
    for layer, contexts in enumerate(chunk_contexts(model, chunk)):
        chains = longest_chains(contexts, 2 ** model.context_dim)
        rows = row_counts(contexts, 2 ** model.context_dim)
        records.append({
            "benchmark": "context_chains", "layer": layer, "rows": len(chunk),
            "longest_chain_median": float(np.median(chains)),
            "longest_chain_p90": round(float(np.percentile(chains, 90)), 1),
            "longest_chain_max": int(chains.max()),
            "mean_examples_per_row": len(chunk) / 2 ** model.context_dim,
            "slots": args.slots,
            "finish_natural_order": finish_time(rows, args.slots),
            "finish_longest_first": finish_time(np.sort(rows)[::-1], args.slots),
            "config": {name: getattr(args, name) for name in (
                "offset_scale", "side_info", "side_info_blur", "gating_window",
                "input_scaling", "min_std")}})
        print(json.dumps(records[-1]))
    return records


if __name__ == "__main__":
    main()
