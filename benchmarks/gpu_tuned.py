"""The headline rates with the constants that ``gpu_constants.py`` recommends, side by side with
the library's own, in alternating rounds on one GPU.

    python benchmarks/gpu_constants.py gpu_learn.jsonl > constants.json
    python benchmarks/gpu_tuned.py constants.json [--data-dir DIR] [--rounds 3] [--chunk 4096]

Why: a GPU session reads the constants off its measurements, but a default changed on that
evidence alone would reach the headline figures only in a later session, and GPU sessions are
rare. This measures, in the same session, what the recommended values give together: learning
and 4,096-row predictions of the MNIST network of ``gpu_learn.py``, each round one model with
the library's values and one with the recommended ones (``gpu_learn.alternating_rates``), and
whether both learned the same outputs and bytes, as they must.

Prints one JSON line per verb and setting (``learn_tuned``, ``predict_tuned``), each naming the
values changed; or one ``tuned`` line saying that none differs from the library's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gpu_constants import CONSTANTS  # noqa: E402
from benchmarks.gpu_learn import (  # noqa: E402
    alternating_rates,
    device_name,
    load_data,
    module_constant,
)


def emit(record: dict, device: str) -> None:
    print(json.dumps({"benchmark": "gpu_tuned", "device": device, **record}), flush=True)


def changes(recommended: dict) -> dict[str, Any]:
    """The recommended values that differ from the library's now (a null recommendation, for
    want of measurements, changes nothing)."""
    return {name: recommended[name] for name, module in CONSTANTS.items()
            if recommended.get(name) is not None and recommended[name] != getattr(module, name)}


@contextlib.contextmanager
def constants_set(values: dict[str, Any]) -> Iterator[None]:
    """The library's constants set to ``values`` for a while, restored afterwards."""
    with contextlib.ExitStack() as stack:
        for name, value in values.items():
            stack.enter_context(module_constant(CONSTANTS[name], name, value))
        yield


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("constants", type=Path, help="gpu_constants.py's JSON line")
    parser.add_argument("--data-dir", help="directory of the MNIST IDX files (or GLN_DATA_DIR)")
    parser.add_argument("--rows", type=int, default=60_000,
                        help="rows predicted each round (the first five chunks also learned)")
    parser.add_argument("--chunk", type=int, default=4096, help="rows per learn/predict call")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    lines = args.constants.read_text().splitlines()
    recommended = json.loads(next(line for line in lines if line.startswith("{")))

    import cupy as cp  # noqa: PLC0415 - the benchmark needs a GPU

    device = device_name(cp)
    changed = changes(recommended)
    if not changed:
        emit({"measure": "tuned", "changed": {}}, device)
        return
    X, y, data = load_data(args, max(args.rows, 6 * args.chunk))
    settings = {"library": contextlib.nullcontext,
                "recommended": lambda: constants_set(changed)}
    rates, same = alternating_rates(settings, X, y, args.chunk, args.rounds)
    for verb in ("learn", "predict"):
        for name in settings:
            emit({"measure": f"{verb}_tuned", "constants": name, "changed": changed,
                  "examples_per_second": rates[(verb, name)], "rounds": args.rounds,
                  "call_rows": args.chunk, "data": data, "same_outputs_and_bytes": same},
                 device)


if __name__ == "__main__":
    main()
