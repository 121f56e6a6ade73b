"""What one call of ``GLN.learn`` / ``GLN.predict_proba`` costs on the CPU, by rows per call:
the fixed per-call cost of a short call (Python and NumPy on tiny arrays) against the work per
row of a long one. Prints one JSON line.

For each model (``small``: 6 features, 2 classes, ``[8, 4, 1]``; ``mnist``: 784 features, 10
classes, ``[128, 128, 1]``) and each call size, a fresh model (seed 0, warmed up, 256 rows
learned first) is called ``--calls`` times (fewer for long calls: at most ``--max-rows`` rows a
size) on rows it has not seen, and the median microseconds per call and per row are reported.
``learn_checked`` / ``predict_checked`` are the calls the service makes on rows it checked
already (``GLN._learn_checked``, ``_predict_proba_checked``), where the checkout has them.

``--compare PATH`` times another checkout too (this script run by PATH's ``.venv`` Python, or
``--compare-python``, in PATH, so that it imports PATH's ``gln``), in ``--rounds`` rounds that
alternate which checkout goes first, and reports both sides' medians over the rounds and the
ratio this / other per call size (below 1: this checkout is faster), also of each side's best
round. On a shared machine, alternating rounds is what makes the two comparable; a multi-thread
(MNIST-sized) call there may wait for a core for milliseconds, in whole rounds at a time.

    python benchmarks/call_cost.py
    python benchmarks/call_cost.py --models small --rows 1,2,8 --compare ../main --rounds 5

Instructions are steadier than wall clock. ``--callgrind VERB``, under callgrind, counts only
the timed calls of that verb (one model, one call size: through callgrind's client requests,
from a small C shim compiled with ``cc`` against ``valgrind/callgrind.h``) and dumps them to
``cg.PID.1``; instructions per call are that dump's ``summary:`` divided by the ``calls`` the
script prints:

    valgrind --tool=callgrind --instr-atstart=no --collect-atstart=no \\
        --callgrind-out-file=cg.%p python benchmarks/call_cost.py --models small --rows 1 \\
        --calls 1000 --callgrind learn
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

MODELS = {
    "small": {"num_features": 6, "num_classes": 2, "layer_sizes": [8, 4, 1]},
    "mnist": {"num_features": 784, "num_classes": 10, "layer_sizes": [128, 128, 1]},
}
VERBS = ("learn", "predict", "learn_checked", "predict_checked")
WARM_ROWS = 256  # learned before the timed calls: running statistics of some substance
_CALLGRIND_SHIM = """
#include <valgrind/callgrind.h>
void start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION;
                   CALLGRIND_TOGGLE_COLLECT; }
void stop(void) { CALLGRIND_TOGGLE_COLLECT; CALLGRIND_DUMP_STATS;
                  CALLGRIND_STOP_INSTRUMENTATION; }
"""


@contextlib.contextmanager
def callgrind_collecting() -> Iterator[None]:
    """Callgrind instruments and counts only inside this block, then dumps the counts (outside
    callgrind the client requests do nothing)."""
    with tempfile.TemporaryDirectory() as directory:
        source, library = Path(directory, "shim.c"), Path(directory, "shim.so")
        source.write_text(_CALLGRIND_SHIM)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(library), str(source)],
                       check=True)
        shim = ctypes.CDLL(str(library))
        shim.start()
        try:
            yield
        finally:
            shim.stop()


def call_times(config: dict[str, Any], verb: str, rows: int, calls: int,
               around: contextlib.AbstractContextManager | None = None) -> list[float]:
    """Seconds of each of ``calls`` calls of ``rows`` rows on a fresh, warmed-up model; the
    timed calls run inside ``around``, after one untimed call of the verb (so that what a first
    call does once, such as loading a kernel, is in neither the times nor the counts)."""
    from gln import GLN  # noqa: PLC0415 - whichever checkout's gln this Python imports

    model = GLN(**config, seed=0)
    model.warm_up()
    rng = np.random.default_rng(0)
    d, classes = config["num_features"], config["num_classes"]
    X = rng.normal(size=(WARM_ROWS + rows * (1 + calls), d)).astype(np.float32)
    y = rng.integers(0, classes, size=len(X))
    model.learn(X[:WARM_ROWS], y[:WARM_ROWS])
    X32, labels = model.check_input(X, y)  # what the service hands the checked calls
    call = {
        "learn": lambda a, b: model.learn(X[a:b], y[a:b]),
        "predict": lambda a, b: model.predict_proba(X[a:b]),
        "learn_checked": lambda a, b: model._learn_checked(X32[a:b], labels[a:b]),
        "predict_checked": lambda a, b: model._predict_proba_checked(X32[a:b]),
    }[verb]
    call(WARM_ROWS, WARM_ROWS + rows)
    times = []
    with around or contextlib.nullcontext():
        for start in range(WARM_ROWS + rows, len(X), rows):
            t0 = time.perf_counter()
            call(start, start + rows)
            times.append(time.perf_counter() - t0)
    return times


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Median us per call and per row, by model, verb and call size, in this Python's gln."""
    import gln  # noqa: PLC0415
    from gln import GLN  # noqa: PLC0415

    results: dict[str, Any] = {}
    for name in args.models:
        for verb in args.verbs:
            if verb.endswith("_checked") and not hasattr(GLN, "_learn_checked"):
                continue  # an older checkout: the service's calls were the public ones
            by_rows = results.setdefault(name, {}).setdefault(verb, {})
            for rows in args.rows:
                calls = max(args.min_calls, min(args.calls, args.max_rows // rows))
                median = statistics.median(call_times(MODELS[name], verb, rows, calls))
                by_rows[str(rows)] = {"us_per_call": round(1e6 * median, 2),
                                      "us_per_row": round(1e6 * median / rows, 3),
                                      "calls": calls}
    return {"gln": str(Path(gln.__file__).resolve().parent), "results": results}


def counted(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--callgrind`` verb's timed calls, collected by callgrind: what they were."""
    if len(args.models) != 1 or len(args.rows) != 1:
        raise SystemExit("--callgrind counts one model and one call size: give one of each")
    import gln  # noqa: PLC0415

    (name,), (rows,) = args.models, args.rows
    calls = max(args.min_calls, min(args.calls, args.max_rows // rows))
    call_times(MODELS[name], args.callgrind, rows, calls, around=callgrind_collecting())
    return {"gln": str(Path(gln.__file__).resolve().parent), "callgrind": args.callgrind,
            "model": name, "rows": rows, "calls": calls}


def _own_argv(args: argparse.Namespace) -> list[str]:
    """The options that choose what is measured, as another checkout's run is given them."""
    return ["--models", *args.models, "--verbs", *args.verbs,
            "--rows", ",".join(map(str, args.rows)), "--calls", str(args.calls),
            "--min-calls", str(args.min_calls), "--max-rows", str(args.max_rows)]


def measured_in(python: str, checkout: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``measure`` run by ``python`` in ``checkout`` (which its ``gln`` is then imported from)."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    out = subprocess.run([python, str(Path(__file__).resolve()), *_own_argv(args)],
                         cwd=checkout, env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def compared(args: argparse.Namespace) -> dict[str, Any]:
    """Both checkouts in alternating rounds: the median of each side's rounds, and the ratios."""
    here = Path(__file__).resolve().parent.parent
    other = Path(args.compare).resolve()
    other_python = args.compare_python or str(other / ".venv" / "bin" / "python")
    sides = {"this": (sys.executable, here), "other": (other_python, other)}
    rounds: dict[str, list[dict[str, Any]]] = {"this": [], "other": []}
    for round_ in range(args.rounds):
        for side in ("this", "other") if round_ % 2 == 0 else ("other", "this"):
            rounds[side].append(measured_in(*sides[side], args))
    summary: dict[str, Any] = {side: {"gln": runs[0]["gln"], "results": {}}
                               for side, runs in rounds.items()}
    ratio: dict[str, Any] = {}
    best: dict[str, Any] = {}  # a shared machine's stalls (a core taken) hit some rounds whole
    for side, runs in rounds.items():
        for name, verbs in runs[0]["results"].items():
            for verb, by_rows in verbs.items():
                for rows in by_rows:
                    each = [r["results"][name][verb][rows]["us_per_call"] for r in runs]
                    us = statistics.median(each)
                    summary[side]["results"].setdefault(name, {}).setdefault(verb, {})[rows] = {
                        "us_per_call": round(us, 2), "us_per_row": round(us / int(rows), 3),
                        "best_round_us": min(each), "rounds_us": each}
    for name, verbs in summary["this"]["results"].items():
        for verb, by_rows in verbs.items():
            theirs = summary["other"]["results"].get(name, {}).get(verb)
            if theirs is None:
                continue
            ratio.setdefault(name, {})[verb] = {
                rows: round(mine["us_per_call"] / theirs[rows]["us_per_call"], 3)
                for rows, mine in by_rows.items()}
            best.setdefault(name, {})[verb] = {
                rows: round(mine["best_round_us"] / theirs[rows]["best_round_us"], 3)
                for rows, mine in by_rows.items()}
    return {**summary, "ratio_this_to_other": ratio, "best_round_ratio": best,
            "rounds": args.rounds}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--verbs", nargs="+", choices=VERBS, default=list(VERBS))
    parser.add_argument("--rows", type=lambda s: [int(r) for r in s.split(",")],
                        default=[1, 2, 8, 64, 256], help="rows per call, comma-separated")
    parser.add_argument("--calls", type=int, default=300, help="timed calls per size, at most")
    parser.add_argument("--min-calls", type=int, default=10, help="timed calls per size, at least")
    parser.add_argument("--max-rows", type=int, default=4096,
                        help="rows per size, beyond which fewer calls are timed")
    parser.add_argument("--compare", metavar="PATH", help="another checkout to time as well")
    parser.add_argument("--compare-python", help="its Python (default: PATH/.venv/bin/python)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of --compare")
    parser.add_argument("--callgrind", choices=VERBS,
                        help="under callgrind: collect only this verb's timed calls")
    args = parser.parse_args(argv)
    if args.callgrind:
        result = counted(args)
    else:
        result = compared(args) if args.compare else measure(args)
    result.update(cpus=os.cpu_count(), python=platform.python_version(),
                  machine=platform.processor() or platform.machine())
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
