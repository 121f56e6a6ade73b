"""Where a GPU model's learn and predict calls spend their time, stage by stage.

    python benchmarks/gpu_stages.py [--calls 200] [--rows 1,4096] [--data-dir DIR]

For one-row calls and for 4,096-row calls (the service's coalesced batches), learning and
predicting, each stage of ``GLN._run_chunk`` (input check, the one copy in, scaling, contexts,
the network pass, the one copy out) is wrapped so that the device is synchronised after it (short
calls launch by launch, not replayed from a CUDA graph: ``gpu_learn.py`` times those): a
stage's time is then its host work plus the device work it issued (a long float32
prediction's values are checked by the device, so its ``check_input`` stage is empty). The
sum exceeds an unwrapped call, which overlaps them; what matters is which stage dominates.
Then the host cost of single CuPy operations that a one-row call is made of (an allocation, a
launch, small copies each way, the gating product), timed back to back without synchronising,
which shows whether the latency of one-row calls is the host's or the device's. Then one
4,096-row learn and predict call each, and a prediction whose next chunks are staged ahead
(``gln.kernels.uploads.STAGE_AHEAD``), as they run, unsynchronised (``call_timeline``): when the
host issued and left each stage, and when the device finished it (an event recorded after
it), so that the device's idle gaps (``device_idle_before_us``: where the device had
finished all it was given before the host entered the stage), and what the host was doing
then, show; and where the host's time goes in such calls, function by function
(``host_profile``, cProfile: the functions with the most time of their own). Last, the
parts of a 4,096-row call's two largest stages: the gating (the float32 GEMM, the rounding
bounds, the contexts kernel with its float64 re-checks in place and listed; CUDA events)
and the copy in (pageable against pinned host memory) next to the host's input check, also of
the rows as uint8 pixels (which travel as they are, a quarter of the bytes), on a model
that has learned as many rows first, so that its inputs are standardised as in service (a new
model's are all zero, and no margin of theirs is close to a hyperplane). And the host's
staging of a long prediction's chunks into pinned memory (``staging_bandwidth``), in GB/s: one
chunk again and again (in the cache), successive chunks of a source larger than the cache (as
a pass over a data set stages them) into pinned and into pageable memory, in four threads,
and in a thread of its own while the calling thread launches kernels (whether the launches,
which hold the GIL, slow the copy that a staging thread would overlap with them), and from
pageable memory straight to the device (the driver staging the rows itself). MNIST's
rows with ``--data-dir`` (or ``GLN_DATA_DIR``), random pixels otherwise.

Prints one JSON line per measurement, naming the device. Needs CuPy and a GPU.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gln.staging  # noqa: E402
from benchmarks.gpu_learn import (  # noqa: E402
    NETWORK,
    call_profile,
    device_name,
    int_list,
    load_data,
    mean_event_seconds,
    module_constant,
    served_inputs,
)
from benchmarks.staging_overlap import median_seconds, source_chunks, timed  # noqa: E402
from gln import GLN  # noqa: E402
from gln.kernels.uploads import _pinned as pinned  # noqa: E402

STAGES = ("check_input", "_sent", "_scale", "_contexts", "_network_pass", "_fetched")


def emit(record: dict, device: str) -> None:
    print(json.dumps({"benchmark": "gpu_stages", "device": device, **record}), flush=True)


def staged(model: GLN, cp, totals: dict[str, float]) -> None:
    """Wrap the model's stages so each one synchronises the device and adds its seconds."""
    def timed(name: str, method: Callable) -> Callable:
        @functools.wraps(method)
        def run(*args, **kwargs):
            start = time.perf_counter()
            result = method(*args, **kwargs)
            cp.cuda.Device().synchronize()
            totals[name] += time.perf_counter() - start
            return result
        return run

    for name in STAGES:
        setattr(model, name, timed(name, getattr(model, name)))


def stage_times(cp, X: np.ndarray, y: np.ndarray, rows: int, calls: int, device: str) -> None:
    for learning in (True, False):
        model = GLN(**NETWORK, device="cuda")
        model._replays = None  # the stages of the uncaptured path
        model.learn(X[:rows], y[:rows])  # compiles the kernels this size takes
        model.predict_proba(X[:rows])  # and prediction's, and its first uploads
        totals: dict[str, float] = defaultdict(float)
        staged(model, cp, totals)
        start = time.perf_counter()
        for call in range(calls):
            lo = (call * rows) % (len(X) - rows)
            if learning:
                model.learn(X[lo:lo + rows], y[lo:lo + rows])
            else:
                model.predict_proba(X[lo:lo + rows])
        whole = (time.perf_counter() - start) / calls
        emit({"measure": "stages", "verb": "learn" if learning else "predict", "rows": rows,
              "calls": calls, "call_us": whole * 1e6,
              "stage_us": {name: totals[name] / calls * 1e6 for name in STAGES}}, device)


TIMELINE_STAGES = ("_sent", "_scale", "_contexts", "_network_pass", "_fetched")


def call_timeline(cp, model: GLN, call: Callable[[], Any],
                  also: tuple[tuple[Any, str], ...] = ()) -> dict:
    """``call()`` on ``model`` without synchronising between its stages: each stage's host
    entry and exit and the device's finish of its work (an event recorded on the current
    stream as the stage returns), in microseconds from the call's start. ``also``: further
    (class, method name) pairs traced as stages of their own (``ChunkUploads.stage_ahead``)."""
    marks: list[tuple[str, float, float, Any]] = []

    def traced(name: str, method: Callable) -> Callable:
        @functools.wraps(method)
        def run(*args, **kwargs):
            entered = time.perf_counter()
            result = method(*args, **kwargs)
            done = cp.cuda.Event()
            done.record()
            marks.append((name, entered, time.perf_counter(), done))
            return result
        return run

    own = {name: model.__dict__[name] for name in TIMELINE_STAGES if name in model.__dict__}
    for name in TIMELINE_STAGES:
        setattr(model, name, traced(name, getattr(model, name)))
    originals = [(owner, name, getattr(owner, name)) for owner, name in also]
    for owner, name, method in originals:
        setattr(owner, name, traced(name, method))
    try:
        cp.cuda.Device().synchronize()
        start = cp.cuda.Event()
        began = time.perf_counter()
        start.record()
        call()
        ended = time.perf_counter()
        cp.cuda.Device().synchronize()
    finally:  # the model's own stages back (some are set per instance, some are methods)
        for name in TIMELINE_STAGES:
            delattr(model, name)
        model.__dict__.update(own)
        for owner, name, method in originals:
            setattr(owner, name, method)
    stages = [{"stage": name, "host_entered_us": (entered - began) * 1e6,
               "host_left_us": (left - began) * 1e6,
               "device_done_us": cp.cuda.get_elapsed_time(start, done) * 1e3}
              for name, entered, left, done in marks]
    return {"call_us": (ended - began) * 1e6, "stages": with_device_idle(stages),
            "device_idle_us": sum(stage["device_idle_before_us"] for stage in stages)}


def with_device_idle(stages: list[dict]) -> list[dict]:
    """Each stage with ``device_idle_before_us``: how long, at least, the device had nothing to
    do before the stage's work, having finished everything issued before it (the previous
    stage's ``device_done_us``; the call's start for the first) before the host even entered
    the stage. Zero where the device was still busy: the host was ahead there."""
    finished = 0.0
    for stage in stages:
        stage["device_idle_before_us"] = max(0.0, stage["host_entered_us"] - finished)
        finished = stage["device_done_us"]
    return stages


def timelines(cp, X: np.ndarray, y: np.ndarray, rows: int, device: str) -> None:
    """``call_timeline`` of a ``rows``-row learn and predict call (after one of each), and of
    a prediction whose next chunks are staged ahead (``STAGE_AHEAD``)."""
    import gln.kernels.uploads as uploads  # noqa: PLC0415

    model = GLN(**NETWORK, device="cuda")
    model._replays = None  # short calls launch by launch, as long ones always do
    model.learn(X[:rows], y[:rows])
    model.predict_proba(X[:rows])
    for verb, call, ahead in (
        ("learn", lambda: model.learn(X[rows:2 * rows], y[rows:2 * rows]), False),
        ("predict", lambda: model.predict_proba(X[2 * rows:3 * rows]), False),
        ("predict_staged_ahead", lambda: model.predict_proba(X[2 * rows:3 * rows]), True),
    ):
        with module_constant(uploads, "STAGE_AHEAD", ahead):
            emit({"measure": "call_timeline", "verb": verb, "rows": rows,
                  **call_timeline(cp, model, call)}, device)


def host_profiles(X: np.ndarray, y: np.ndarray, rows: int, calls: int, device: str) -> None:
    """Where the host's time goes in ``rows``-row float32 predictions and learning calls, by
    cProfile over ``calls`` calls of each after one untimed (``host_profile``: the functions
    with the most time of their own, per call). A long float32 prediction is bound by the
    host (``call_timeline``): its staging copies and its launches show up here as the NumPy
    and CuPy functions that issue them."""
    model = GLN(**NETWORK, device="cuda")
    X32 = np.ascontiguousarray(X[:3 * rows], dtype=np.float32)
    model.learn(X32[:rows], y[:rows])
    for verb, call in (("predict", lambda: model.predict_proba(X32[rows:2 * rows])),
                       ("learn", lambda: model.learn(X32[2 * rows:3 * rows],
                                                     y[2 * rows:3 * rows]))):
        call()
        emit({"measure": "host_profile", "verb": verb, "rows": rows, "calls": calls,
              "functions": call_profile(call, calls, top=30, by="own")}, device)


def host_costs(cp, calls: int, device: str) -> None:
    """Microseconds of host time per CuPy operation, issued back to back."""
    from gln.kernels.cuda import _function  # noqa: PLC0415

    values = cp.zeros((1, 1, 128), cp.float32)
    inputs = cp.empty((1, 1, 129), cp.float32)
    kernel = _function("layer_inputs.cu", "gln_layer_inputs")
    row = np.random.default_rng(0).random(784 + 12).astype(np.float64)
    small = cp.zeros(10, cp.float32)
    z = cp.asarray(np.random.default_rng(1).random((1, 784)), cp.float32)
    normals = cp.asarray(np.random.default_rng(2).random((5120, 784)), cp.float32)
    operations = {
        "empty": lambda: cp.empty((1, 10, 129), cp.float32),
        "launch": lambda: kernel((1,), (128,), (values, np.int32(1), np.int32(1), np.int32(128),
                                                np.int32(1), np.float32(0.5), inputs)),
        "copy_in_6kb": lambda: cp.asarray(row),
        "copy_out_40b": lambda: small.get(),
        "gating_product_1_row": lambda: z @ normals.T,
        "int32_scalars_x14": lambda: [np.int32(i) for i in range(14)],
    }
    for name, operation in operations.items():
        operation()
        cp.cuda.Device().synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            operation()
        host = time.perf_counter() - start
        cp.cuda.Device().synchronize()
        emit({"measure": "host_cost", "operation": name, "us": host / calls * 1e6}, device)


def event_us(cp, operation: Callable, repeats: int = 20) -> float:
    """Mean device microseconds of ``operation`` between CUDA events, after one warm-up."""
    return mean_event_seconds(cp, operation, repeats) * 1e6


def long_call_parts(cp, X: np.ndarray, y: np.ndarray, rows: int, device: str) -> None:
    """The gating's parts and the copy in of one ``rows``-row call, each timed alone, after
    the model has learned the ``rows`` rows before it."""
    from gln.kernels import cuda  # noqa: PLC0415

    model = GLN(**NETWORK, device="cuda")
    model.learn(X[:rows], y[:rows])
    chunk = np.ascontiguousarray(X[rows:2 * rows])
    z = served_inputs(cp, model, chunk)
    normals, offsets, sizes, m = model.normals, model.offsets, model.layer_sizes, model.context_dim
    products = z @ normals.T
    tolerance = cp.empty(len(z), dtype=cp.float32)
    contexts = cp.empty(len(z) * normals.shape[0] // m, dtype=cp.int32)
    rechecks = cuda.recheck_list(products.size)

    bounds = functools.partial(cuda.launch_rounding_tolerances, z, tolerance)
    recheck = functools.partial(cuda.launch_halfspace_rechecks, z, normals, offsets, m, sizes,
                                contexts, rechecks)

    def decide(listing: bool) -> None:
        rechecks.count.fill(0)
        cuda.launch_halfspace_contexts(products, z, normals, offsets, tolerance, m, sizes,
                                       contexts, rechecks if listing else None)

    bounds()
    margins = products - offsets[None, :]
    rechecked = float((cp.abs(margins) <= tolerance[:, None]).mean())
    staging = pinned(cp, chunk.shape, chunk.dtype)  # as gln.kernels.uploads stages a chunk
    on_device = cp.empty(chunk.shape, chunk.dtype)
    pixels = np.rint(chunk * 255).astype(np.uint8)  # the same rows as bytes, as pixels come
    pixels_staging = pinned(cp, pixels.shape, pixels.dtype)
    pixels_on_device = cp.empty(pixels.shape, np.uint8)

    def host_us(operation: Callable, repeats: int = 20) -> float:
        operation()
        cp.cuda.Device().synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            operation()
        cp.cuda.Device().synchronize()
        return (time.perf_counter() - start) / repeats * 1e6

    decide(True)
    listed = int(rechecks.count.get()[0])
    emit({"measure": "long_call_parts", "rows": rows, "learned_before": model.examples_seen,
          "nonzero_inputs": float((z != 0).mean()), "margins_rechecked": rechecked,
          "margins_listed": listed, "list_capacity": rechecks.capacity,
          "device_us": {"gemm": event_us(cp, lambda: z @ normals.T),
                        "rounding_bounds": event_us(cp, bounds),
                        "contexts_rechecking_in_place": event_us(cp, lambda: decide(False)),
                        "contexts_listing": event_us(cp, lambda: decide(True)),
                        "rechecks_of_the_list": event_us(cp, recheck),
                        "layer_contexts": event_us(cp, lambda: model._contexts(z))},
          "host_us": {"check_input": host_us(lambda: model.check_input(chunk)),
                      "copy_in_pageable": host_us(lambda: cp.asarray(chunk)),
                      "to_pinned": host_us(lambda: np.copyto(staging, chunk)),
                      "copy_in_from_pinned": host_us(
                          lambda: on_device.set(staging)),
                      "min_max": host_us(lambda: (chunk.min(), chunk.max())),
                      "check_input_uint8": host_us(lambda: model.check_input(pixels)),
                      "to_pinned_uint8": host_us(lambda: np.copyto(pixels_staging, pixels)),
                      "copy_in_from_pinned_uint8": host_us(
                          lambda: pixels_on_device.set(pixels_staging))}}, device)


def staging_bandwidth(cp, rows: int, features: int, chunks: int, device: str) -> None:
    """GB/s of the host's copy of ``rows`` x ``features`` float32 chunks into a chunk-sized
    buffer, by way of copying (the median chunk of ``chunks``, each from its own place in one
    source array)."""
    parts = source_chunks(rows, features, chunks)
    pinned_buffer = pinned(cp, (rows, features), np.dtype(np.float32))
    pageable = np.ones((rows, features), np.float32)
    on_device = cp.empty((rows, features), dtype=cp.float32)
    threads = concurrent.futures.ThreadPoolExecutor(4)
    gigabytes = rows * features * 4 / 1e9

    def quartered(target: np.ndarray, part: np.ndarray) -> None:
        bounds = np.linspace(0, rows, 5).astype(int)
        list(threads.map(lambda a, b: np.copyto(target[a:b], part[a:b]), bounds[:-1],
                         bounds[1:]))

    def beside_launches(part: np.ndarray) -> float:
        """The copy's own seconds in a thread while this one launches kernels until it ends."""
        def copy() -> float:
            start = time.perf_counter()
            np.copyto(pinned_buffer, part)
            return time.perf_counter() - start

        counter = cp.zeros(1, dtype=cp.float32)
        future = threads.submit(copy)
        while not future.done():
            counter += 1
        return future.result()

    def rate(seconds: Callable[[np.ndarray], float], sources: list[np.ndarray]) -> float:
        return gigabytes / median_seconds(seconds, sources)

    def straight_to_device(part: np.ndarray) -> None:
        """The driver's own staging of pageable rows, instead of a copy into pinned memory."""
        on_device.set(part)
        cp.cuda.get_current_stream().synchronize()

    to_pinned = timed(lambda part: np.copyto(pinned_buffer, part))
    try:
        emit({"measure": "staging_bandwidth", "rows": rows, "features": features,
              "source_mb": round(chunks * gigabytes * 1e3), "gb_per_s": {
                  "same_chunk_to_pinned": rate(to_pinned, [parts[0]] * chunks),
                  "to_pinned": rate(to_pinned, parts),
                  "to_pageable": rate(timed(lambda part: np.copyto(pageable, part)), parts),
                  "to_pinned_in_4_threads": rate(
                      timed(lambda part: quartered(pinned_buffer, part)), parts),
                  "to_pinned_beside_launches": rate(beside_launches, parts),
                  "pageable_to_device": rate(timed(straight_to_device), parts)}}, device)
    finally:
        threads.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per measurement")
    parser.add_argument("--rows", type=int_list, default=[1, 4096], help="rows per call")
    parser.add_argument("--data-dir", help="directory of the MNIST IDX files (or GLN_DATA_DIR)")
    parser.add_argument("--profile-calls", type=int, default=10,
                        help="calls of the longest length profiled (host_profile)")
    parser.add_argument("--staging-chunks", type=int, default=64,
                        help="chunks of the staging source (64 of 2,048 MNIST rows: 411 MB)")
    args = parser.parse_args(argv)

    import cupy as cp  # noqa: PLC0415 - the benchmark needs a GPU

    device = device_name(cp)
    X, y, _ = load_data(args, max(args.rows) * 4 + 1)
    for rows in args.rows:
        stage_times(cp, X, y, rows, args.calls if rows < 1024 else max(3, args.calls // 20),
                    device)
    host_costs(cp, args.calls, device)
    timelines(cp, X, y, max(args.rows), device)
    host_profiles(X, y, max(args.rows), args.profile_calls, device)
    long_call_parts(cp, X, y, max(args.rows), device)
    staging_bandwidth(cp, min(gln.staging.PREDICT_CHUNK_ROWS_GPU, max(args.rows)),
                      NETWORK["num_features"], args.staging_chunks, device)


if __name__ == "__main__":
    main()
