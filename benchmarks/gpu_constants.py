"""The launch constants of ``gln.kernels.cuda``, read off the ``layer_pass`` lines of a
``gpu_learn.py`` run.

    python benchmarks/gpu_constants.py gpu_learn.jsonl

* ``RESIDENT_MIN_ROWS``: the shortest measured chunk from which the resident kernel learns the
  network at least as fast as the streaming one, at that length and every longer one measured.
  A chunk runs every layer, so the times are summed over the layers.
* ``PREDICT_ROWS_PER_WARP``: the value with which prediction of the longest measured chunk is
  fastest, summed over the layers.

Prints one JSON line: both values, the library's current ones, and the summed timings they were
chosen from. Either value is null when the lines to choose it are missing (or, for the first,
when resident never wins: keep chunks streaming).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gln.kernels import cuda  # noqa: E402


def recommend(records: Iterable[dict]) -> dict:
    """Both constants from ``layer_pass`` records (see the module docstring)."""
    learn: dict[tuple[str, int], float] = defaultdict(float)
    predict: dict[tuple[int, int], float] = defaultdict(float)
    for r in records:
        if r.get("measure") != "layer_pass":
            continue
        if r["learn"]:
            learn[(r["kernel"], r["rows"])] += r["microseconds"]
        else:
            predict[(r["rows"], r["rows_per_warp"])] += r["microseconds"]

    lengths = sorted({rows for kernel, rows in learn
                      if ("streaming", rows) in learn and ("resident", rows) in learn})
    resident_wins = [learn[("resident", n)] <= learn[("streaming", n)] for n in lengths]
    resident_min_rows = next(
        (n for i, n in enumerate(lengths) if all(resident_wins[i:])), None
    )
    longest = max((rows for rows, _ in predict), default=None)
    at_longest = {per_warp: us for (rows, per_warp), us in predict.items() if rows == longest}
    rows_per_warp = min(at_longest, key=at_longest.get) if at_longest else None
    return {
        "RESIDENT_MIN_ROWS": resident_min_rows,
        "PREDICT_ROWS_PER_WARP": rows_per_warp,
        "current": {"RESIDENT_MIN_ROWS": cuda.RESIDENT_MIN_ROWS,
                    "PREDICT_ROWS_PER_WARP": cuda.PREDICT_ROWS_PER_WARP},
        "learn_us_by_rows": {n: {"streaming": learn[("streaming", n)],
                                 "resident": learn[("resident", n)]} for n in lengths},
        "predict_us_by_rows_per_warp": {"rows": longest, **at_longest},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("jsonl", type=Path, help="output of benchmarks/gpu_learn.py")
    args = parser.parse_args(argv)
    lines = args.jsonl.read_text().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    print(json.dumps({"benchmark": "gpu_constants", **recommend(records)}))


if __name__ == "__main__":
    main()
