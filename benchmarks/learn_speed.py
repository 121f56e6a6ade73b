"""Learning speed of ``gln.GLN`` side by side with a plain per-example NumPy GLN, in one run.

    python benchmarks/learn_speed.py            # the MNIST network: 784 inputs, 10 classes,
                                                # [128, 128, 1], context dimension 4

The plain peer is the textbook implementation: for every example, gate with a matrix-vector
product, gather the active weight rows by fancy indexing, mix, update, project and scatter
them back. It shares the model's hyperplanes, scaling and initial weights, so both do the same
arithmetic; the run reports how often their predicted classes agree. (Not always bit-equal:
the peer gates with a plain float32 product, which now and then rounds a borderline halfspace
decision the other way than ``gln``'s exact one, and the paths then drift apart slightly.)
With ``--pygln-dir DIR`` (a checkout of the public pygln, never vendored here) the run also
learns the stream with pygln's PyTorch GLN, one example per call, and reports its rate.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.pygln_peer import add_pygln_argument, build_peer, learn_rate  # noqa: E402
from gln import GLN  # noqa: E402
from gln.scaling import moments_before_each_row, scale_inputs  # noqa: E402


class PlainGLN:
    """Algorithm 1 one example at a time, with per-example gating (the usual NumPy GLN)."""

    def __init__(self, model: GLN) -> None:
        self.model = model  # hyperplanes, scaling settings and weights are taken from it
        self.weights = [w.copy() for w in model.weights]

    def learn_one(self, x: np.ndarray, label: int) -> np.ndarray:
        m = self.model
        x64 = x[None, :].astype(np.float64)
        if m.moments.count == 0:
            m._anchor_moments(x)  # the running sums are of x less the first row learned
        counts, sums, sums_sq, m.moments = moments_before_each_row(
            np, m.moments, x64, shift=m.moments_shift)
        z, base = scale_inputs(np, x64, counts, sums, sums_sq, mode=m.input_scaling,
                               pred_clip=m.pred_clip, min_std=m.min_std, shift=m.moments_shift)
        bits = (m.normals @ z[0] >= m.offsets).reshape(m.num_glns, -1, m.context_dim)
        contexts = (bits * (1 << np.arange(m.context_dim))).sum(-1)
        rate = float(m.schedule(np.array([m.examples_seen + 1]))[0])
        target = (np.arange(m.num_glns) == label).astype(np.float32)
        inputs = np.concatenate([[m._config.bias_logit], base[0]]).astype(np.float32)[None, :]
        start, glns = 0, np.arange(m.num_glns)[:, None]
        for w in self.weights:
            k = w.shape[1]
            ctx, start = contexts[:, start:start + k], start + k
            active = w[glns, np.arange(k)[None, :], ctx]
            p = np.clip(1 / (1 + np.exp(-(active * inputs[:, None, :]).sum(-1))),
                        m.pred_clip, 1 - m.pred_clip)
            update = active - (rate * (p - target[:, None]))[..., None] * inputs[:, None, :]
            w[glns, np.arange(k)[None, :], ctx] = np.clip(update, -m.weight_clip, m.weight_clip)
            logits = np.log(p / (1 - p)).astype(np.float32)
            inputs = np.concatenate([np.full((m.num_glns, 1), m._config.bias_logit, np.float32),
                                     logits], axis=1)
        m.examples_seen += 1
        return p[:, 0]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features", type=int, default=784)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--layer-sizes", default="128,128,1")
    parser.add_argument("--context-dim", type=int, default=4)
    parser.add_argument("--examples", type=int, default=4096, help="examples for gln.GLN")
    parser.add_argument("--plain-examples", type=int, default=300, help="examples for the peer")
    add_pygln_argument(parser)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    X = rng.uniform(0, 1, (args.examples + args.plain_examples, args.features))
    y = rng.integers(0, args.classes, len(X))
    config = dict(num_features=args.features, num_classes=args.classes,
                  layer_sizes=tuple(int(k) for k in args.layer_sizes.split(",")),
                  context_dim=args.context_dim,
                  learning_rate={"schedule": "inverse_time", "scale": 100, "cap": 0.01})

    fast = GLN(**config)
    fast.learn(X[:8], y[:8])  # compile the kernel outside the timing
    start = time.perf_counter()
    fast.learn(X[8:args.examples], y[8:args.examples])
    fast_rate = (args.examples - 8) / (time.perf_counter() - start)

    # The peer learns the same stream from the same state; outputs must agree.
    checked = GLN(**config)
    checked.learn(X[:8], y[:8])
    peer = PlainGLN(GLN.from_bytes(checked.to_bytes()))
    tail = slice(8, 8 + args.plain_examples)
    expected = checked.learn(X[tail], y[tail])
    start = time.perf_counter()
    rows = zip(X[tail], y[tail], strict=True)
    plain_outputs = np.array([peer.learn_one(x, int(label)) for x, label in rows])
    plain_rate = args.plain_examples / (time.perf_counter() - start)
    q = plain_outputs.astype(np.float64)
    plain_probs = q / q.sum(axis=1, keepdims=True) if args.classes > 2 else np.hstack([1 - q, q])
    class_agreement = float((plain_probs.argmax(axis=1) == expected.argmax(axis=1)).mean())

    result = {
        "benchmark": "learn_speed",
        "network": config["layer_sizes"], "features": args.features, "classes": args.classes,
        "context_dim": args.context_dim,
        "gln_examples_per_second": fast_rate,
        "plain_numpy_examples_per_second": plain_rate,
        "speedup": fast_rate / plain_rate,
        "predicted_class_agreement": class_agreement,
        "max_probability_difference": float(np.abs(plain_probs - expected).max()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
    }
    if args.pygln_dir:
        pygln = build_peer(args.pygln_dir, args.features, args.classes)
        learn_rate(pygln, X[:8].astype(np.float32), y[:8])  # warm-up, outside the timing
        pygln_rate, _ = learn_rate(pygln, X[tail].astype(np.float32), y[tail])
        result.update(pygln_examples_per_second=pygln_rate,
                      speedup_over_pygln=fast_rate / pygln_rate)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
