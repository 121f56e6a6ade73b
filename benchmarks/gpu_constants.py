"""The launch constants of ``gln.kernels.cuda``, read off the ``layer_pass`` lines of a
``gpu_learn.py`` run (and the ``shared_grid`` lines of ``gpu_shared_grid.py`` appended to it).

    python benchmarks/gpu_constants.py gpu_learn.jsonl

* ``RESIDENT_MIN_ROWS``: the shortest measured chunk from which the resident kernel learns the
  network at least as fast as the streaming one, at that length and every longer one measured.
  A chunk runs every layer, so the times are summed over the layers.
* ``ROW_ORDER`` and ``ROW_WARPS_MIN_ROWS``: the order of the row kernel's rows that learns
  fastest at the longest measured chunk, and the length from which, in that order, it learns at
  least as fast as the faster of those two, on uneven contexts (as real data's are: the row
  kernel's chains are as long as their context is common, which uniform contexts would
  flatter).
* ``PREDICT_ROWS_PER_WARP`` and ``PREDICT_ROWS_PER_BLOCK``: the values with which prediction
  is fastest, by the streaming and by the shared kernel, summed over the layers: for the
  streaming kernel at the longest measured chunk that it predicts (shorter than
  ``PREDICT_SHARED_MIN_ROWS`` below, else the library's; longer ones go to the shared kernel),
  for the shared one at the longest measured chunk that prediction runs at once
  (``gln.staging.PREDICT_CHUNK_ROWS_GPU``; 4,096-row calls are predicted in chunks of that many
  rows).
* ``PREDICT_SHARED_MIN_ROWS``: the shortest measured chunk from which the shared kernel (at its
  best value) predicts at least as fast as the streaming one (at its best), there and beyond.
* ``GATING_PRODUCT``: int8 where it both learned and predicted faster than float32
  (``learn_by_gating``, ``predict_by_gating``) with the same outputs, else float32.
* ``GATING_GEMM_MIN_ROWS``: the shortest measured chunk from which the gating's products from
  cuBLAS cost a call no more than the library's own kernel's (``gating_path``: wall time, the
  host's part in it), there and beyond, and above ``REPLAY_MAX_ROWS``.
* ``PREDICT_SUM_BATCH``, ``PREDICT_WARPS`` and ``PREDICT_EXAMPLE_GROUP``: the setting of the
  shared kernel's grid (``shared_grid``) whose times, each layer's median over the turns,
  sum over the layers to the least, where that beats the library's own setting by more than
  ``GRID_MARGIN``; else the library's values. The library's setting on the grid is its
  ``PREDICT_WARPS`` and ``PREDICT_EXAMPLE_GROUP`` with the sums batched as the library
  batches them (``cuda.predict_sum_batch``) on every measured layer; a chosen batch equal to
  that is recommended as the library's ``PREDICT_SUM_BATCH`` (None: the source's default).
* ``STAGE_AHEAD``, ``STAGING_THREADS``, ``LAUNCH_WHILE_STAGING`` and ``SEND_REGISTERED``
  (``gln.kernels.uploads``): of the settings of ``predict_by_dtype``, staged or page-locked
  where they lie, the one that predicted float32 rows fastest,
  where that beat the library's own and the setting predicted every other dtype (uint8) within
  ``OTHER_DTYPE_MARGIN`` of the library's, with the same outputs; else the library's. Float32
  first: it is the dtype short of 1M rows/s, and two of the three settings change only it.
* ``UNLOCK_AFTER_RETURN`` and ``LOCK_REST_AHEAD`` (``gln.kernels.uploads``): of the ways
  of ``predict_by_locking`` to lock and unlock a page-locked batch, the one chosen as the
  staging settings above are chosen; else the library's.
* ``PREDICT_FIRST_CHUNK_ROWS`` (``gln.staging``): of the first chunk lengths of
  ``predict_by_upload`` (float32 rows on the copy stream with the library's staging, and
  ``LAUNCH_WHILE_STAGING`` as recommended above), the one that predicted fastest, where it
  beat the library's own; else the library's.

Prints one JSON line: the values, the library's current ones, and the summed timings they were
chosen from. A value is null when the lines to choose it are missing (or, for the minimum
lengths, when the other kernel or path never wins).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gln import staging  # noqa: E402
from gln.kernels import cuda, uploads  # noqa: E402
from gln.kernels.replay import REPLAY_MAX_ROWS  # noqa: E402

# Every constant recommended here, and the module that holds it.
CONSTANTS = {**dict.fromkeys(("RESIDENT_MIN_ROWS", "ROW_ORDER", "ROW_WARPS_MIN_ROWS",
                              "PREDICT_ROWS_PER_WARP", "PREDICT_ROWS_PER_BLOCK",
                              "PREDICT_SHARED_MIN_ROWS", "GATING_PRODUCT", "GATING_GEMM_MIN_ROWS",
                              "PREDICT_SUM_BATCH", "PREDICT_WARPS",
                              "PREDICT_EXAMPLE_GROUP"), cuda),
             "STAGE_AHEAD": uploads, "STAGING_THREADS": uploads,
             "LAUNCH_WHILE_STAGING": uploads, "SEND_REGISTERED": uploads,
             "UNLOCK_AFTER_RETURN": uploads, "LOCK_REST_AHEAD": uploads,
             "PREDICT_FIRST_CHUNK_ROWS": staging}
# A setting of the shared kernel's grid replaces the library's only where its summed time is
# below the library's by more than this fraction: settings within it are level, and a default
# moved by the turns' noise alone would come back on the next run.
GRID_MARGIN = 0.02
# A staging setting that speeds float32 rows up may slow the other dtypes by at most this
# fraction (the noise of predict_by_dtype's alternating rounds), and no more.
OTHER_DTYPE_MARGIN = 0.02


def recommend(records: Iterable[dict]) -> dict:
    """The constants from ``layer_pass`` records and the side-by-side rates (see the module
    docstring)."""
    records = list(records)  # read twice
    learn: dict[str, dict[str, dict[int, float]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(float)))  # contexts -> kernel -> rows -> us
    predict: dict[str, dict[tuple[int, int], float]] = defaultdict(lambda: defaultdict(float))
    for r in records:
        if r.get("measure") != "layer_pass":
            continue
        if r["learn"]:
            kernel = r["kernel"]
            if kernel == "rows":
                kernel = f"rows {r.get('row_order') or cuda.ROW_ORDER}"
            learn[r.get("contexts", "uniform")][kernel][r["rows"]] += r["microseconds"]
        else:
            predict[r["kernel"]][(r["rows"], r["rows_per_warp"])] += r["microseconds"]

    uniform, uneven = learn["uniform"], learn["uneven"]
    resident_min_rows, learn_by_rows = _crossing(uniform["streaming"], uniform["resident"])
    either = {n: min(us, uneven["resident"][n]) for n, us in uneven["streaming"].items()
              if n in uneven["resident"]}
    by_order = {o: uneven[f"rows {o}"] for o in cuda.ROW_ORDERS if uneven[f"rows {o}"]}
    longest = max((n for times in by_order.values() for n in times), default=None)
    row_order = min((o for o, times in by_order.items() if longest in times),
                    key=lambda o: by_order[o][longest], default=None)
    row_warps_min_rows, uneven_by_rows = _crossing(
        either, uneven[f"rows {row_order}"] if row_order else {})
    best = {kernel: _best_by_rows(times) for kernel, times in predict.items()}
    shared_min_rows, predict_by_rows = _crossing(
        {n: us for n, (_, us) in best.get("streaming", {}).items()},
        {n: us for n, (_, us) in best.get("shared", {}).items()})
    streaming_below = (shared_min_rows or cuda.PREDICT_SHARED_MIN_ROWS) - 1
    gemm_min_rows, gating_by_rows = _gating_gemm_min_rows(records)
    grid_totals = _grid_totals(records)
    staged = _staging(records)
    return {
        "RESIDENT_MIN_ROWS": resident_min_rows,
        "ROW_ORDER": row_order,
        "ROW_WARPS_MIN_ROWS": row_warps_min_rows,
        "PREDICT_ROWS_PER_WARP": _value_at_longest(best.get("streaming", {}), streaming_below),
        "PREDICT_ROWS_PER_BLOCK": _value_at_longest(best.get("shared", {}),
                                                    staging.PREDICT_CHUNK_ROWS_GPU),
        "PREDICT_SHARED_MIN_ROWS": shared_min_rows,
        "GATING_PRODUCT": _gating_product(records),
        "GATING_GEMM_MIN_ROWS": gemm_min_rows,
        **_shared_grid(grid_totals, {r["layer"]: r["inputs"] for r in records
                                     if r.get("measure") == "shared_grid"}),
        **staged,
        **_locking(records),
        "PREDICT_FIRST_CHUNK_ROWS": _first_chunk_rows(records, (
            uploads.LAUNCH_WHILE_STAGING if staged["LAUNCH_WHILE_STAGING"] is None
            else staged["LAUNCH_WHILE_STAGING"])),
        "current": {name: getattr(module, name) for name, module in CONSTANTS.items()},
        "learn_us_by_rows": {n: {"streaming": a, "resident": b}
                             for n, (a, b) in learn_by_rows.items()},
        "uneven_learn_us_by_rows": {n: {"streaming or resident": a, "rows": b}
                                    for n, (a, b) in uneven_by_rows.items()},
        "predict_us_by_rows": {n: {"streaming": a, "shared": b}
                               for n, (a, b) in predict_by_rows.items()},
        "gating_us_by_rows": {n: {"kernel": a, "gemm": b} for n, (a, b) in gating_by_rows.items()},
        "shared_grid_us": [{"sum_batch": batch, "warps": warps, "example_group": group,
                            "microseconds": us}
                           for (batch, warps, group), us in sorted(grid_totals.items(),
                                                                   key=lambda item: item[1])],
    }


def _gating_gemm_min_rows(records: list[dict]
                          ) -> tuple[int | None, dict[int, tuple[float, float]]]:
    """``GATING_GEMM_MIN_ROWS`` from the ``gating_path`` lines: the shortest length from which
    cuBLAS's products are no slower than the library's kernel's for good, but above
    ``REPLAY_MAX_ROWS`` (a replayed call's graph holds only the library's kernels); None where
    cuBLAS never wins, or where the paths' contexts differed. And the paired timings."""
    paths: dict[str, dict[int, float]] = defaultdict(dict)
    same = True
    for r in records:
        if r.get("measure") == "gating_path":
            paths[r["path"]][r["rows"]] = r["microseconds"]
            same = same and r["same_contexts"]
    crossing, by_rows = _crossing(paths["kernel"], paths["gemm"])
    if crossing is None or not same:
        return None, by_rows
    return max(crossing, REPLAY_MAX_ROWS + 1), by_rows


def _gating_product(records: list[dict]) -> str | None:
    """``GATING_PRODUCT`` from the side-by-side rates of ``gpu_learn.py`` (None without their
    lines)."""
    gating = {(r["measure"], r["gating_product"]): r for r in records
              if r.get("measure") in ("learn_by_gating", "predict_by_gating")}
    if len(gating) != 4:
        return None
    wins = all(gating[(f"{verb}_by_gating", "int8")]["examples_per_second"]
               > gating[(f"{verb}_by_gating", "float32")]["examples_per_second"]
               for verb in ("learn", "predict"))
    same = all(r["same_outputs_as_float32"] for r in gating.values())
    return "int8" if wins and same else "float32"


def _grid_totals(records: list[dict]) -> dict[tuple[int, int, int], float]:
    """By (sum batch, warps, examples at once), the ``shared_grid`` lines' microseconds: each
    layer's median over the turns, summed over the layers (a prediction runs them all); only
    settings measured on every layer."""
    turns: dict[tuple[int, int, int], dict[str, list[float]]] = defaultdict(
        lambda: defaultdict(list))
    for r in records:
        if r.get("measure") == "shared_grid":
            setting = (r["sum_batch"], r["warps"], r["example_group"])
            turns[setting][r["layer"]].append(r["microseconds"])
    layers = {layer for by_layer in turns.values() for layer in by_layer}
    return {setting: sum(float(np.median(times)) for times in by_layer.values())
            for setting, by_layer in turns.items() if set(by_layer) == layers}


def _library_grid_setting(inputs: dict[str, int]) -> tuple[int, int, int] | None:
    """The library's setting as the grid writes it: the sums batched as the library batches
    them on the layers of ``inputs`` (each layer's inputs with the bias, by name), its warps a
    block and examples at once (the source's 16 and 1 where None; examples one at a time where
    sums are not batched). None where the layers' batches differ, which no setting of the grid,
    one batch for every layer, reproduces."""
    batches = {cuda.predict_sum_batch(cuda.per_lane(width)) for width in inputs.values()}
    if len(batches) != 1:
        return None
    (batch,) = batches
    group = (cuda.PREDICT_EXAMPLE_GROUP or 1) if batch > 1 else 1
    return batch, cuda.PREDICT_WARPS or 16, group


def _shared_grid(totals: dict[tuple[int, int, int], float],
                 layers: dict[str, int]) -> dict[str, int | None]:
    """``PREDICT_SUM_BATCH``, ``PREDICT_WARPS`` and ``PREDICT_EXAMPLE_GROUP`` from the grid's
    summed times (``_grid_totals``) of ``layers`` (their inputs with the bias, by name): the
    quickest setting where it beats the library's by more than ``GRID_MARGIN``, else the
    library's values. None for all three unless the library's setting and another were
    measured."""
    library = _library_grid_setting(layers)
    names = ("PREDICT_SUM_BATCH", "PREDICT_WARPS", "PREDICT_EXAMPLE_GROUP")
    if library not in totals or len(totals) < 2:
        return dict.fromkeys(names)
    best = min(totals, key=totals.__getitem__)
    if totals[best] >= totals[library] * (1 - GRID_MARGIN):
        return {name: getattr(cuda, name) for name in names}
    batch, warps, group = best
    return {"PREDICT_SUM_BATCH": cuda.PREDICT_SUM_BATCH if batch == library[0] else batch,
            "PREDICT_WARPS": warps, "PREDICT_EXAMPLE_GROUP": group}


def _staging(records: list[dict]) -> dict[str, bool | int | None]:
    """``STAGE_AHEAD``, ``STAGING_THREADS``, ``LAUNCH_WHILE_STAGING`` and ``SEND_REGISTERED``
    from ``predict_by_dtype``'s side-by-side rates."""
    return _uploads_setting(records, "predict_by_dtype", ("STAGE_AHEAD", "STAGING_THREADS",
                                                          "LAUNCH_WHILE_STAGING",
                                                          "SEND_REGISTERED"))


def _locking(records: list[dict]) -> dict[str, bool | None]:
    """``UNLOCK_AFTER_RETURN`` and ``LOCK_REST_AHEAD`` from ``predict_by_locking``'s
    side-by-side rates."""
    return _uploads_setting(records, "predict_by_locking",
                            ("UNLOCK_AFTER_RETURN", "LOCK_REST_AHEAD"))


def _uploads_setting(records: list[dict], measure: str, names: tuple[str, ...]) -> dict[str, Any]:
    """The ``gln.kernels.uploads`` constants ``names`` chosen together (``_best_setting``) from
    the rates of the ``measure`` lines, which give each one's value under its name in lower
    case (a line without a value had the library's; lines without the first are of another
    kind): None for each without the library's own setting and another one, each for every
    dtype."""
    library = tuple(getattr(uploads, name) for name in names)
    rates = {(r["dtype"], tuple(r.get(name.lower(), value)
                                for name, value in zip(names, library, strict=True))): r
             for r in records if r.get("measure") == measure and names[0].lower() in r}
    best = _best_setting(rates, library)
    return dict(zip(names, best or (None,) * len(names), strict=True))


def _first_chunk_rows(records: list[dict], while_staging: bool) -> int | None:
    """``PREDICT_FIRST_CHUNK_ROWS`` from ``predict_by_upload``'s rates with the library's
    staging and ``LAUNCH_WHILE_STAGING`` = ``while_staging`` (a line without it: the
    library's), by first chunk length (null in a line: as long as the others). None, the
    library's value where it is None, unless the library's and another length were measured."""
    library_staging = (uploads.STAGING_THREADS, uploads.STAGING_PIECES)
    rates = {r["first_chunk_rows"]: r["examples_per_second"] for r in records
             if r.get("measure") == "predict_by_upload" and r["uploads"] == "copy_stream"
             and (r["staging_threads"], r["staging_pieces"]) == library_staging
             and r.get("launch_while_staging", uploads.LAUNCH_WHILE_STAGING) == while_staging}
    library = staging.PREDICT_FIRST_CHUNK_ROWS
    if library not in rates or len(rates) < 2:
        return None
    best = max(rates, key=rates.__getitem__)
    return best if rates[best] > rates[library] else library


def _best_setting(rates: dict[tuple[str, Any], dict], library: Any) -> Any:
    """Of the settings measured for every dtype in ``rates`` (by dtype and setting), the one
    that gained most over the ``library``'s setting on float32 rows, with the same outputs in
    every dtype and the others' rates within ``OTHER_DTYPE_MARGIN`` of the library's, where it
    gained at all; else the library's. None unless the library's and another were measured for
    every dtype, float32 among them."""
    dtypes = {dtype for dtype, _ in rates}
    settings = {setting for _, setting in rates
                if all((dtype, setting) in rates for dtype in dtypes)}
    if library not in settings or len(settings) < 2 or "float32" not in dtypes:
        return None

    def ratio(dtype: str, setting: Any) -> float:
        return (rates[(dtype, setting)]["examples_per_second"]
                / rates[(dtype, library)]["examples_per_second"])

    allowed = [setting for setting in settings
               if all(rates[(dtype, setting)]["same_outputs_as_float32"] for dtype in dtypes)
               and all(ratio(dtype, setting) >= 1 - OTHER_DTYPE_MARGIN
                       for dtype in dtypes - {"float32"})]
    best = max(allowed, key=lambda setting: ratio("float32", setting), default=library)
    return best if ratio("float32", best) > 1 else library


def _crossing(first: dict[int, float], second: dict[int, float]
              ) -> tuple[int | None, dict[int, tuple[float, float]]]:
    """The shortest length from which ``second`` is no slower than ``first`` at it and every
    longer length measured by both, and the paired timings."""
    lengths = sorted(set(first) & set(second))
    wins = [second[n] <= first[n] for n in lengths]
    crossing = next((n for i, n in enumerate(lengths) if all(wins[i:])), None)
    return crossing, {n: (first[n], second[n]) for n in lengths}


def _best_by_rows(times: dict[tuple[int, int], float]) -> dict[int, tuple[int, float]]:
    """For each chunk length, the fastest setting and its time."""
    best: dict[int, tuple[int, float]] = {}
    for (rows, setting), us in times.items():
        if rows not in best or us < best[rows][1]:
            best[rows] = (setting, us)
    return best


def _value_at_longest(best: dict[int, tuple[int, float]], limit: int | None = None
                      ) -> int | None:
    """The fastest setting at the longest length measured (at most ``limit`` rows, if any)."""
    lengths = [n for n in best if limit is None or n <= limit] or list(best)
    return best[max(lengths)][0] if lengths else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("jsonl", type=Path, help="output of benchmarks/gpu_learn.py")
    args = parser.parse_args(argv)
    lines = args.jsonl.read_text().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    print(json.dumps({"benchmark": "gpu_constants", **recommend(records)}))


if __name__ == "__main__":
    main()
