"""Prediction speed of several checkouts of the library, side by side on one machine.

    python benchmarks/gpu_compare.py OLD NEW [--data-dir DIR] [--rounds 3] [--device cuda]

OLD and NEW are directories that hold a ``gln`` package: a worktree, or a commit unpacked with
``git archive COMMIT gln | tar -x -C DIR``. Each checkout is imported by a process of its own,
in alternating rounds, so that the machine's drift falls on all of them alike. Each process
learns ``--learn-rows`` rows (MNIST's training images with ``--data-dir`` or ``GLN_DATA_DIR``,
random pixels otherwise) with the MNIST network of ``gpu_learn.py`` in calls of ``--chunk``
rows (timed from the second call: the first loads the kernels), predicts the ``--examples``
rows in such calls three times, and prints one JSON line: the learning rate, the three
prediction rates, and digests of the learning calls' outputs and of its first prediction's,
which are the same for checkouts whose code gives the same bytes. With ``--page-locked``, each
pass is followed by one inside ``GLN.page_locked`` over the rows (where the checkout has it):
their rates, and the block's lock and unlock times, outside the pass's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

REPOSITORY = Path(__file__).resolve().parent.parent


def measure(args: argparse.Namespace) -> dict:
    """One checkout's rates, in this process (whose ``gln`` is the checkout's)."""
    import gln  # noqa: PLC0415 - imported once the checkout leads the path
    from benchmarks.gpu_learn import (  # noqa: PLC0415
        NETWORK,
        SHORT_GEMM_ROWS,
        load_data,
        page_locked_passes,
        predict_rate,
    )
    from gln import GLN  # noqa: PLC0415

    X, y, data = load_data(args, max(args.learn_rows, args.examples))
    model = GLN(**NETWORK, device=args.device)
    learned, timed_rows, start = hashlib.sha256(), 0, 0.0
    for lo in range(0, args.learn_rows, args.chunk):
        if lo == args.chunk:
            start = time.perf_counter()
        hi = min(lo + args.chunk, args.learn_rows)
        learned.update(np.asarray(model.learn(X[lo:hi], y[lo:hi])).tobytes())
        timed_rows += (hi - lo) if lo else 0
    learn_rate = timed_rows / (time.perf_counter() - start) if timed_rows else None
    first = np.asarray(model.predict_proba(X[:args.chunk]))
    # A chunk too short for int8 gating (where a checkout has it): the float32 GEMM's first
    # call, whose cuBLAS kernels load lazily (about 90 ms once a process on an H200), untimed.
    model.predict_proba(X[:SHORT_GEMM_ROWS])
    rows = X[:args.examples]
    held = {}
    if args.page_locked and hasattr(model, "page_locked"):  # where the checkout has it
        passes = page_locked_passes(model, rows, args.chunk)
        rates = passes["plain"]
        held = {"page_locked_predict_per_second": [round(r) for r in passes["page_locked"]],
                "page_lock_ms": [round(ms, 2) for ms in passes["lock_ms"]],
                "page_unlock_ms": [round(ms, 2) for ms in passes["unlock_ms"]]}
    else:
        rates = [predict_rate(model, rows, args.chunk) for _ in range(3)]
    return {"benchmark": "gpu_compare", "device": args.device, "data": data,
            "gln": str(Path(gln.__file__).resolve().parent.parent),
            "learn_per_second": None if learn_rate is None else round(learn_rate),
            "predict_per_second": [round(rate) for rate in rates],
            "learn_digest": learned.hexdigest()[:16],
            "first_call_digest": hashlib.sha256(first.tobytes()).hexdigest()[:16], **held}


def compare(checkouts: list[str], rounds: int, options: list[str],
            run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> Iterator[dict]:
    """Each round, each checkout's ``measure`` in a process of its own, in turn."""
    for round_number in range(1, rounds + 1):
        for checkout in checkouts:
            done = run([sys.executable, __file__, "--one", checkout, *options],
                       capture_output=True, text=True, check=True)
            record = json.loads(done.stdout.strip().splitlines()[-1])
            yield {**record, "checkout": checkout, "round": round_number}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", nargs="*", help="directories holding a gln package")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process: this checkout
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data-dir", help="directory of the MNIST IDX files (or GLN_DATA_DIR)")
    parser.add_argument("--learn-rows", type=int, default=20480)
    parser.add_argument("--examples", type=int, default=60_000, help="rows predicted per pass")
    parser.add_argument("--chunk", type=int, default=4096, help="rows per call")
    parser.add_argument("--device", default="cuda", help="the model's device (cpu to try it)")
    parser.add_argument("--page-locked", action="store_true",
                        help="after each pass, one inside GLN.page_locked (where a checkout "
                        "has it)")
    args = parser.parse_args(argv)

    if args.one:
        sys.path[:0] = [str(Path(args.one).resolve()), str(REPOSITORY)]
        print(json.dumps(measure(args)), flush=True)
        return
    if len(args.checkouts) < 2:
        parser.error("give at least two checkouts to compare")
    options = ["--learn-rows", str(args.learn_rows), "--examples", str(args.examples),
               "--chunk", str(args.chunk), "--device", args.device]
    if args.page_locked:
        options.append("--page-locked")
    if args.data_dir:
        options += ["--data-dir", args.data_dir]
    for record in compare(args.checkouts, args.rounds, options):
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
