"""GPU speed of exact online learning, side by side with the plain per-example CuPy path.

    python benchmarks/gpu_learn.py                        # random MNIST-shaped data
    python benchmarks/gpu_learn.py --data-dir DIR         # MNIST's training images
                                                          # (or set GLN_DATA_DIR)

The network is the paper's MNIST one: 784 features, 10 classes, [128, 128, 1], context
dimension 4. Prints one JSON line per measurement, each naming the device:

* ``layer_pass``: one launch of the CUDA layer pass alone (CUDA events around back-to-back
  launches, so the host's launch overhead is hidden) for each layer shape, kernel (streaming /
  resident / rows / shared), learn or predict, and chunk length, to set ``RESIDENT_MIN_ROWS``
  (where resident overtakes streaming), ``ROW_WARPS_MIN_ROWS`` (where a warp per row overtakes
  both, timed on uneven contexts too: ``"contexts": "uneven"``, as real data's are) and, for
  prediction, ``PREDICT_SHARED_MIN_ROWS`` (where the shared kernel overtakes streaming), each
  ``PREDICT_ROWS_PER_WARP`` of ``--predict-rows-per-warp`` and each ``PREDICT_ROWS_PER_BLOCK``
  of ``--predict-rows-per-block``;
* ``shared_neurons_per_block``: the shared prediction kernel at ``PREDICT_CHUNK_ROWS_GPU`` rows
  with each ``PREDICT_MAX_NEURONS_PER_BLOCK`` of ``--predict-neurons-per-block`` (fewer
  neurons per block let two blocks share an SM), and ``shared_sum_batch`` with each
  ``GLN_SUM_BATCH`` of ``--predict-sum-batch`` (dot products summed at once; 1: a butterfly
  each); the shared kernel's warps a block and examples at once, with its sums batched, are
  timed together by ``gpu_shared_grid.py``;
* ``wide_kernel``: the kernel of rows no registers hold (``gln_layer_pass_wide``, taken by
  layers of more than 2,048 inputs) beside the streaming kernel on the first layer, learning
  and predicting, at each of ``--wide-rows``;
* ``gating_path``: a chunk's gating at each of ``--gating-rows``, its products from the
  library's own kernel and from cuBLAS, wall time per call with the host's part in it, to set
  ``GATING_GEMM_MIN_ROWS``;
* ``learn``: ``GLN.learn`` examples per second, ``--chunk`` rows per call (the service's
  coalesced queue), with the kernels and with ``use_kernels=False`` (the reference layer pass
  in CuPy, one example at a time);
* ``predict``: ``GLN.predict_proba`` examples per second in batches of ``--chunk`` rows, each
  batch predicted in chunks of the library's ``PREDICT_CHUNK_ROWS_GPU`` rows; then, side by
  side on the same model, with each value of ``--predict-chunk-rows``;
* ``predict_page_locked``: the same batches, in turns plain and inside a block that holds the
  rows page-locked (``GLN.page_locked``), with the block's lock and unlock times;
* ``predict_by_upload``: the same, the rows sent on the current stream as CuPy's ``asarray``
  sends them (``current_stream``, the path before ``gln.kernels.uploads``) and on the copy
  stream with each ``STAGING_THREADS`` x ``STAGING_PIECES`` of ``--staging`` and with a first
  chunk of each ``--first-chunk-rows``, and, where ``launch_while_staging_probe`` found that it
  works here, with ``LAUNCH_WHILE_STAGING`` and each of those first chunks or none, and,
  where ``page_locking_probe`` found that the driver locks a 4,096-row batch's pages, with
  each call's rows page-locked where they lie instead of staged (``page_locked``:
  ``SEND_REGISTERED``), in alternating rounds (median of ``--upload-rounds``);
* ``predict_by_dtype``: 4,096-row predictions of the same pixel values (0-255) sent as uint8
  and as float32, each with each next chunk staged ahead on a thread of its own and not
  (``STAGE_AHEAD``), by one host thread and by up to four (``STAGING_THREADS``), and with the
  chunks not staged ahead sent while they are staged and not (``LAUNCH_WHILE_STAGING``, where
  ``launch_while_staging_probe`` found that it works here), and with the library's staging
  settings and each call's rows page-locked where they lie instead (``SEND_REGISTERED``,
  where ``page_locking_probe`` found that it works here), in
  alternating rounds (``--dtype-rounds``) on a model that learned them as float32; uint8 rows
  travel in a quarter of the bytes (``gln.kernels.uploads``), and all must predict the same
  bytes;
* ``predict_by_locking``: the same pixels, each call's rows page-locked where they lie, all
  before the first chunk's copy and only the first chunk's, the rest by a thread of its own
  (``LOCK_REST_AHEAD``), and unlocked before the call returns and after it, by a thread of its
  own (``UNLOCK_AFTER_RETURN``), where ``page_locking_probe`` found that the driver locks
  them, in alternating rounds (``--dtype-rounds``);
* ``learn_by_gating`` / ``predict_by_gating``: each ``GATING_PRODUCT`` (float32, int8), and
  ``learn_by_kernel``: the library's learning kernels and a warp per row for every chunk, in
  alternating rounds on new models (``--gating-rounds``, ``--kernel-rounds``), each checked to
  learn the same outputs (and, by kernel, the same snapshot);
* ``learn_latency``: one ``learn`` call of a single example, median and p99 in microseconds:
  replayed from its captured CUDA graph (``kernels``, as the library runs it) and launch by
  launch (``kernels_uncaptured``), side by side on models in the same state;
* ``predict_latency``: one ``predict_proba`` call of a single example, likewise;
* ``learn_latency_profile``: where those calls spend their time (cProfile, per call);
* ``agreement``: whether both implementations predicted the same stream alike;
* with ``--pygln-dir DIR`` (a checkout of the public pygln, never vendored here), pygln's PyTorch
  GLN on the same GPU and stream: ``learn`` one example per call (exact) and in small batches
  (not Algorithm 1), ``predict``, and ``peer_ratio`` lines (ours over pygln's rate).

Targets (issue): learn >= 100k examples/s, predict >= 1M examples/s, single-example learn
latency <= 200 us on an H100. Needs CuPy and a GPU; run it through the device tool (docs/gpu.md).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import json
import os
import pstats
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gln.model  # noqa: E402
import gln.staging  # noqa: E402
from benchmarks.pygln_peer import add_pygln_argument, measure  # noqa: E402
from gln import GLN  # noqa: E402

# The library's defaults otherwise (standardised inputs, whole-input gating): the path that the
# service's models take unless configured, and the one the fused GPU preprocessing covers.
NETWORK = dict(num_features=784, num_classes=10, layer_sizes=(128, 128, 1), context_dim=4,
               learning_rate={"schedule": "inverse_time", "scale": 100, "cap": 0.01}, seed=0)


def emit(record: dict, device: str) -> None:
    print(json.dumps({"benchmark": "gpu_learn", "device": device, **record}), flush=True)


def load_data(args: argparse.Namespace, n: int) -> tuple[np.ndarray, np.ndarray, str]:
    """``n`` rows of pixels in [0, 1] (MNIST's training set, repeated if needed, or random)."""
    directory = args.data_dir or os.environ.get("GLN_DATA_DIR")
    if directory:
        from benchmarks.mnist import load_mnist  # noqa: PLC0415

        images, labels = load_mnist(Path(directory), "train")
        X = images.reshape(len(images), -1).astype(np.float32) / 255.0
        repeats = -(-n // len(X))
        return np.tile(X, (repeats, 1))[:n], np.tile(labels, repeats)[:n], "mnist"
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 1, (n, NETWORK["num_features"])).astype(np.float32)
    return X, rng.integers(0, NETWORK["num_classes"], n), "random"


LEARNING_KERNELS = ("streaming", "resident", "rows")  # the layer pass's modes that learn
# Rows of a call whose chunk takes the float32 gating GEMM (at least GATING_GEMM_MIN_ROWS, under
# INT8_GATING_MIN_ROWS), as the last, partial call of a pass over MNIST's 60,000 images does.
SHORT_GEMM_ROWS = 600


def uneven_contexts(rng: np.random.Generator, n: int, glns: int, neurons: int) -> np.ndarray:
    """(n, G, K) contexts of 4 bits, each bit of a neuron set with a chance of its own drawn
    from U(0, 1): some contexts far more common than others, as real data's are (MNIST,
    4,096 rows: a neuron's most common context takes about 1,500 of them in the median; here
    about 1,200), which the row kernel, whose chains are as long as their context is common, feels
    and uniform contexts (256 each) hide."""
    chances = rng.random((4, glns, neurons))
    bits = rng.random((4, n, glns, neurons)) < chances[:, None]
    return sum(bits[b].astype(np.int32) << b for b in range(4))


def layer_shapes(network: dict) -> list[tuple[str, int, int, int, int]]:
    """Each layer of ``network`` as its layer pass sees it: a name ("784->128"), one-vs-all
    networks, neurons, inputs with the bias, and groups of inputs (the first layer's are the
    features that every network shares; a later layer's, the previous layer's outputs of each
    network)."""
    classes, sizes = network["num_classes"], network["layer_sizes"]
    widths = [network["num_features"], *sizes]
    return [(f"{widths[i]}->{size}", classes, size, widths[i] + 1, 1 if i == 0 else classes)
            for i, size in enumerate(sizes)]


def random_chunk(cp, rng: np.random.Generator, n: int, glns: int, neurons: int, inputs: int,
                 groups: int) -> tuple[Any, Any, Any, Any]:
    """A layer pass's per-example arrays for n rows on the device: contexts, inputs, targets
    and rates, drawn in that order."""
    return (cp.asarray(rng.integers(0, 16, (n, glns, neurons)), cp.int32),
            cp.asarray(rng.normal(0, 2, (n, groups, inputs)), cp.float32),
            cp.asarray(rng.integers(0, 2, (n, glns)), cp.float32),
            cp.full(n, 1e-3, cp.float32))


def time_layer_passes(cp, args: argparse.Namespace, device: str) -> None:
    """Each layer shape of the network through one launch, per kernel and chunk length; as in
    the model, every layer but the last also writes the next layer's inputs."""
    import gln.kernels.cuda as cuda  # noqa: PLC0415
    from gln.kernels.cuda import cuda_layer_pass  # noqa: PLC0415

    rng = np.random.default_rng(1)
    shapes = layer_shapes(NETWORK)
    for name, glns, neurons, inputs, groups in shapes:
        last = name == shapes[-1][0]
        weights = cp.asarray(rng.uniform(-0.1, 0.1, (glns, neurons, 16, inputs)), cp.float32)
        for n in args.layer_rows:
            contexts, x, targets, rates = random_chunk(cp, rng, n, glns, neurons, inputs, groups)
            probs = cp.empty((n, glns, neurons), cp.float32)
            next_inputs = None if last else cp.empty((n, glns, neurons + 1), cp.float32)
            uneven = cp.asarray(uneven_contexts(rng, n, glns, neurons), cp.int32)
            learning = [(kernel, True, None, None) for kernel in LEARNING_KERNELS[:2]]
            learning += [("rows", True, None, order) for order in cuda.ROW_ORDERS]
            runs = [(*run, "uniform") for run in learning]
            runs += [("streaming", False, rows, None, "uniform")
                     for rows in args.predict_rows_per_warp]
            runs += [("shared", False, rows, None, "uniform")
                     for rows in args.predict_rows_per_block]
            runs += [(*run, "uneven") for run in learning]
            for mode, learn, rows_per_warp, row_order, drawn in runs:
                arrays = (weights, contexts if drawn == "uniform" else uneven, x, targets, rates)

                def launch(arrays=arrays, probs=probs, mode=mode, learn=learn,
                           next_inputs=next_inputs):
                    cuda_layer_pass(*arrays, 0.01, 5.0, learn, probs, mode=mode,
                                    next_inputs=next_inputs, bias_logit=1.0)

                constant = "PREDICT_ROWS_PER_BLOCK" if mode == "shared" else "PREDICT_ROWS_PER_WARP"
                with launch_constant(constant, rows_per_warp), \
                        launch_constant("ROW_ORDER", row_order):
                    seconds = mean_event_seconds(cp, launch, args.repeats)
                active = n * glns * neurons * inputs * 4 * (2 if learn else 1)
                emit({"measure": "layer_pass", "layer": name, "kernel": mode, "learn": learn,
                      "rows": n, "rows_per_warp": rows_per_warp, "row_order": row_order,
                      "contexts": drawn, "microseconds": seconds * 1e6,
                      "examples_per_second": n / seconds,
                      "active_weight_bytes_per_second": active / seconds}, device)
            if n != gln.staging.PREDICT_CHUNK_ROWS_GPU:
                continue
            arrays = (weights, contexts, x, targets, rates)

            def predict(arrays=arrays, probs=probs, next_inputs=next_inputs):
                cuda_layer_pass(*arrays, 0.01, 5.0, False, probs, mode="shared",
                                next_inputs=next_inputs, bias_logit=1.0)

            for most in args.predict_neurons_per_block:  # at the length predictions run at
                with launch_constant("PREDICT_MAX_NEURONS_PER_BLOCK", most):
                    seconds = mean_event_seconds(cp, predict, args.repeats)
                emit({"measure": "shared_neurons_per_block", "layer": name, "rows": n,
                      "max_neurons_per_block": most, "microseconds": seconds * 1e6}, device)
            for batch in args.predict_sum_batch:
                with launch_constant("PREDICT_SUM_BATCH", batch):
                    seconds = mean_event_seconds(cp, predict, args.repeats)
                emit({"measure": "shared_sum_batch", "layer": name, "rows": n,
                      "sum_batch": batch, "microseconds": seconds * 1e6}, device)


def time_wide_kernel(cp, args: argparse.Namespace, device: str) -> None:
    """The kernel of rows no registers hold (``gln_layer_pass_wide``, which layers of more
    than 2,048 inputs take) beside the streaming kernel, on the network's first layer, whose
    rows the registers do hold: the same bytes, and what reading the row and the input from
    memory as they are used costs."""
    from gln.kernels.cuda import cuda_layer_pass  # noqa: PLC0415

    rng = np.random.default_rng(2)
    name, glns, neurons, inputs, groups = layer_shapes(NETWORK)[0]
    weights = cp.asarray(rng.uniform(-0.1, 0.1, (glns, neurons, 16, inputs)), cp.float32)
    for n in args.wide_rows:
        arrays = (weights, *random_chunk(cp, rng, n, glns, neurons, inputs, groups))
        probs = cp.empty((n, glns, neurons), cp.float32)
        for learn in (True, False):
            for mode in ("streaming", "wide"):
                def launch(arrays=arrays, probs=probs, mode=mode, learn=learn):
                    cuda_layer_pass(*arrays, 0.01, 5.0, learn, probs, mode=mode)

                seconds = mean_event_seconds(cp, launch, args.repeats)
                emit({"measure": "wide_kernel", "layer": name, "kernel": mode, "learn": learn,
                      "rows": n, "microseconds": seconds * 1e6}, device)


# GATING_GEMM_MIN_ROWS for each of time_gating_paths' two paths: the gating products from the
# library's own kernel at every length (gln_halfspace_products, the close margins re-checked in
# place) and from cuBLAS at every length (the close margins listed and re-checked in a second
# launch).
GATING_PATHS = {"kernel": 2**31 - 1, "gemm": 1}


def time_gating_paths(cp, args: argparse.Namespace, device: str) -> None:
    """``gating_path``: one call of the network's gating (``cuda_layer_contexts``, float32
    products: int8 ones start at ``INT8_GATING_MIN_ROWS``) at each of ``--gating-rows``, on a
    new model's planes and standardised random rows, by each path of ``GATING_PATHS``, with
    the host's cost in it as a call feels it: the median wall time of ``--gating-calls`` calls,
    each waited for, the paths alternating call by call. Sets ``GATING_GEMM_MIN_ROWS``
    (``gpu_constants.py``); both paths give the same contexts, which it checks."""
    import gln.kernels.cuda as cuda  # noqa: PLC0415

    model = GLN(**NETWORK, device="cuda")
    rng = np.random.default_rng(3)
    for n in args.gating_rows:
        z = cp.asarray(rng.standard_normal((n, model.normals.shape[1])), cp.float32)
        seconds: dict[str, list[float]] = defaultdict(list)
        contexts = {}
        for call in range(args.gating_calls + 1):  # the first of each path untimed
            for path, min_rows in GATING_PATHS.items():
                with launch_constant("GATING_GEMM_MIN_ROWS", min_rows):
                    start = time.perf_counter()
                    found = cuda.cuda_layer_contexts(z, model.normals, model.offsets,
                                                     model.context_dim, model.num_glns,
                                                     model.layer_sizes)
                    cp.cuda.Device().synchronize()
                    if call:
                        seconds[path].append(time.perf_counter() - start)
                contexts[path] = [c.get() for c in found]
        same = all(np.array_equal(a, b)
                   for a, b in zip(contexts["kernel"], contexts["gemm"], strict=True))
        for path, times in seconds.items():
            emit({"measure": "gating_path", "rows": n, "path": path,
                  "microseconds": float(np.median(times)) * 1e6, "calls": len(times),
                  "same_contexts": same}, device)


@contextlib.contextmanager
def module_constant(module: Any, name: str, value: Any) -> Iterator[None]:
    """``module.<name>`` set to ``value`` for a while (None: the library's)."""
    saved = getattr(module, name)
    setattr(module, name, saved if value is None else value)
    try:
        yield
    finally:
        setattr(module, name, saved)


@contextlib.contextmanager
def module_constants(module: Any, **values: Any) -> Iterator[None]:
    """Several of ``module``'s constants set for a while, each as ``module_constant`` sets it."""
    with contextlib.ExitStack() as stack:
        for name, value in values.items():
            stack.enter_context(module_constant(module, name, value))
        yield


def launch_constant(name: str, value: Any) -> contextlib.AbstractContextManager[None]:
    """``gln.kernels.cuda.<name>`` set to ``value`` for a while (None: the library's)."""
    import gln.kernels.cuda as cuda  # noqa: PLC0415

    return module_constant(cuda, name, value)


@contextlib.contextmanager
def row_warps(order: str | None = None) -> Iterator[None]:
    """Every learning chunk by the row kernel (``ROW_WARPS_MIN_ROWS`` = 1) for a while, its
    rows in ``order`` (None: the library's ``ROW_ORDER``)."""
    with launch_constant("ROW_WARPS_MIN_ROWS", 1), launch_constant("ROW_ORDER", order):
        yield


def device_name(cp) -> str:
    """The GPU's name, as every benchmark line names it (CuPy gives bytes or str)."""
    name = cp.cuda.runtime.getDeviceProperties(0)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def served_inputs(cp, model: GLN, X: np.ndarray) -> Any:
    """The float32 side information z of rows ``X`` as the model predicts them (its running
    moments frozen), contiguous on the device: what its gating multiplies."""
    x64 = cp.asarray(X, dtype=cp.float64)
    count = cp.full((1, 1), float(model.moments.count))  # 0 would make every z 0
    z, _, _ = model._scale(x64, count, learning=False)
    return cp.ascontiguousarray(z, dtype=cp.float32)


def mean_event_seconds(cp, fn, repeats: int) -> float:
    """Device seconds per call of ``fn``: ``repeats`` calls back to back between two events,
    so the device never waits for the host between them (small launches are otherwise timed
    at the host's pace)."""
    fn()  # compile and warm up
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(repeats):
        fn()
    stop.record()
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) / 1e3 / repeats


def learn_rate(model: GLN, X: np.ndarray, y: np.ndarray, chunk: int) -> tuple[float, np.ndarray]:
    outputs = []
    start = time.perf_counter()
    for lo in range(0, len(X), chunk):
        outputs.append(model.learn(X[lo:lo + chunk], y[lo:lo + chunk]))  # returns host arrays
    return len(X) / (time.perf_counter() - start), np.concatenate(outputs)


def predict_rate(model: GLN, X: np.ndarray, chunk: int) -> float:
    start = time.perf_counter()
    for lo in range(0, len(X), chunk):
        model.predict_proba(X[lo:lo + chunk])
    return len(X) / (time.perf_counter() - start)


def page_locked_passes(model: GLN, X: np.ndarray, chunk: int,
                       passes: int = 3) -> dict[str, list[float]]:
    """``predict_rate`` over ``X``, plain and inside a block holding ``X`` page-locked
    (``GLN.page_locked``), in turns: each pass's rate (``plain``, ``page_locked``), and the
    block's lock and unlock times in milliseconds (outside its pass's)."""
    timed: dict[str, list[float]] = {"plain": [], "page_locked": [], "lock_ms": [],
                                     "unlock_ms": []}
    for _ in range(passes):
        timed["plain"].append(predict_rate(model, X, chunk))
        start = time.perf_counter()
        with model.page_locked(X):
            timed["lock_ms"].append(1e3 * (time.perf_counter() - start))
            timed["page_locked"].append(predict_rate(model, X, chunk))
            unlocking = time.perf_counter()
        timed["unlock_ms"].append(1e3 * (time.perf_counter() - unlocking))
    return timed


class CurrentStreamUploads:
    """``gln.kernels.uploads.ChunkUploads``'s interface over ``cupy.asarray``: the rows staged
    by one thread and copied on the current stream, behind the chunk before, as float32 in
    whatever dtype they came (a ``source`` is never page-locked)."""

    def __init__(self, max_rows: int, num_features: int, dtype: Any = np.float32,
                 source: np.ndarray | None = None) -> None:
        import cupy  # noqa: PLC0415

        self._cp = cupy

    sent_while_staging = False  # the rows are staged as they are sent

    def send(self, rows: np.ndarray) -> Any:
        return self._cp.asarray(np.ascontiguousarray(rows, dtype=np.float32))

    def stage_ahead(self, rows: np.ndarray) -> None:
        """Stages nothing ahead: ``send`` stages the rows."""

    def consumed(self) -> None:
        """The memory pool orders the reuse of the rows' memory on the one stream."""

    def __enter__(self) -> CurrentStreamUploads:
        return self

    def __exit__(self, *exc: object) -> None:
        """Nothing runs on another stream."""


def first_chunk_rows(rows: int | None) -> contextlib.AbstractContextManager[None]:
    """Long float32 predictions cut with a first chunk of ``rows`` rows, the rest as usual
    (``gln.staging.PREDICT_FIRST_CHUNK_ROWS``; None: the library's)."""
    return module_constant(gln.staging, "PREDICT_FIRST_CHUNK_ROWS", rows)


def rates_by_upload(model: GLN, X: np.ndarray, chunk: int, staging: list[tuple[int, int]],
                    first_chunks: list[int], rounds: int,
                    while_staging: bool = False, page_locked: bool = False) -> list[dict]:
    """Prediction rates with the rows sent on the current stream, on the copy stream with each
    (threads, pieces) of ``staging``, and on it with the library's staging and each first chunk
    length of ``first_chunks``, and, with ``while_staging``, those first chunks and the usual
    one again with ``LAUNCH_WHILE_STAGING`` on (the two together start the device soonest),
    and, with ``page_locked``, with the calls' rows page-locked where they lie instead
    (``SEND_REGISTERED``): the median of ``rounds`` alternating rounds."""
    import gln.kernels.uploads as uploads  # noqa: PLC0415

    library = (uploads.STAGING_THREADS, uploads.STAGING_PIECES)
    usual = uploads.LAUNCH_WHILE_STAGING
    setups = [("current_stream", None, None, None, usual),
              *(("copy_stream", t, p, None, usual) for t, p in staging),
              *(("copy_stream", *library, rows, usual) for rows in first_chunks),
              *(("copy_stream", *library, rows, not usual)
                for rows in ((None, *first_chunks) if while_staging else ())),
              *((("page_locked", *library, None, usual),) if page_locked else ())]
    rates: dict[int, list[float]] = {i: [] for i in range(len(setups))}
    for _ in range(rounds):
        for i, (path, threads, pieces, first, behind) in enumerate(setups):
            with contextlib.ExitStack() as stack:
                if path == "current_stream":
                    stack.enter_context(
                        module_constant(gln.staging, "ChunkUploads", CurrentStreamUploads))
                else:
                    stack.enter_context(module_constants(
                        uploads, STAGING_THREADS=threads, STAGING_PIECES=pieces))
                stack.enter_context(module_constants(
                    uploads, LAUNCH_WHILE_STAGING=behind,
                    SEND_REGISTERED=path == "page_locked"))
                stack.enter_context(first_chunk_rows(first))
                rates[i].append(predict_rate(model, X, chunk))
    return [{"implementation": "kernels", "uploads": path, "staging_threads": threads,
             "staging_pieces": pieces,
             "first_chunk_rows": first or gln.staging.PREDICT_FIRST_CHUNK_ROWS,
             "launch_while_staging": behind,
             "examples_per_second": float(np.median(rates[i])), "rounds": rounds}
            for i, (path, threads, pieces, first, behind) in enumerate(setups)]


def pixel_rates(X: np.ndarray, y: np.ndarray, chunk: int, rounds: int,
                settings: dict[Any, Any]) -> dict[tuple[str, Any], tuple[float, bool]]:
    """Prediction rates of pixels (``X``'s values in [0, 1] scaled back to 0-255) sent as uint8
    and as float32 under each setting (a key and a function making a context manager that
    holds it), by a model that learned them as float32, in alternating rounds: by (dtype,
    setting), the median of ``rounds`` rates and whether it predicted the library's outputs of
    the float32 rows."""
    pixels = np.rint(X * 255).astype(np.uint8)
    batches = {"uint8": pixels, "float32": pixels.astype(np.float32)}
    model = GLN(**NETWORK, device="cuda")
    model.learn(batches["float32"][:chunk], y[:chunk])
    model.predict_proba(batches["float32"][:SHORT_GEMM_ROWS])  # untimed: see SHORT_GEMM_ROWS
    setups = [(name, key) for key in settings for name in batches]
    tail = slice(len(X) - chunk, None)
    reference = model.predict_proba(batches["float32"][tail])
    same = {}
    for name, key in setups:  # untimed, so whatever a setting compiles, it compiles here
        with settings[key]():
            same[(name, key)] = np.array_equal(model.predict_proba(batches[name][tail]),
                                               reference)
    rates: dict[tuple[str, Any], list[float]] = defaultdict(list)
    for _ in range(rounds):
        for name, key in setups:
            with settings[key]():
                rates[(name, key)].append(predict_rate(model, batches[name], chunk))
    return {setup: (float(np.median(rates[setup])), bool(same[setup])) for setup in setups}


# A process that sends one chunk with LAUNCH_WHILE_STAGING and checks that it arrived whole.
WHILE_STAGING_PROBE = """
import numpy as np
import gln.kernels.uploads as uploads
uploads.LAUNCH_WHILE_STAGING, uploads.STAGING_BYTES_PER_THREAD = True, 1
rows = np.arange(2048 * 784, dtype=np.float32).reshape(2048, 784)
with uploads.ChunkUploads(2048, 784) as sender:
    assert (sender.send(rows).get() == rows).all(), "the rows arrived changed"
"""


def sending_while_staging_works(timeout: float = 60) -> tuple[bool, str]:
    """Whether ``LAUNCH_WHILE_STAGING`` sends a chunk whole on this machine, tried in a process
    of its own (a device that cannot read the marks would fault, which spoils a CUDA context
    for good, or wait for ever), and what went wrong if not."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, (str(root), os.environ.get("PYTHONPATH"))))}
    try:
        result = subprocess.run([sys.executable, "-c", WHILE_STAGING_PROBE], cwd=root, env=env,
                                capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"no answer within {timeout} s"
    lines = (result.stderr or result.stdout).strip().splitlines()
    return result.returncode == 0, (lines[-1] if lines and result.returncode else "")


def page_locking_works(rows: int = 4096, features: int = 784) -> tuple[bool, str]:
    """Whether the driver page-locks a batch of ``rows`` x ``features`` float32 where it lies
    (``SEND_REGISTERED``'s ``cudaHostRegister``), and its refusal if not: where it refuses,
    every call would be staged, and timing the setting would time staging again."""
    import cupy  # noqa: PLC0415

    from gln.kernels.page_locks import pages_of  # noqa: PLC0415

    first, size = pages_of(np.zeros((rows, features), dtype=np.float32))
    try:
        cupy.cuda.runtime.hostRegister(first, size, 0)
    except cupy.cuda.runtime.CUDARuntimeError as refusal:
        return False, str(refusal)
    cupy.cuda.runtime.hostUnregister(first)
    return True, ""


def rates_by_dtype(X: np.ndarray, y: np.ndarray, chunk: int, rounds: int,
                   staging_threads: tuple[int, ...] = (1, 4),
                   while_staging: tuple[bool, ...] = (False, True),
                   page_locked: bool = True) -> list[dict]:
    """``predict_by_dtype``: ``pixel_rates`` with ``STAGE_AHEAD`` off and on, with each of
    ``staging_threads`` (``STAGING_THREADS``), and with each of ``while_staging``
    (``LAUNCH_WHILE_STAGING``), all staged; and, with ``page_locked``, with the library's
    staging settings and the calls' rows page-locked where they lie instead
    (``SEND_REGISTERED``)."""
    import gln.kernels.uploads as uploads  # noqa: PLC0415

    def setting(ahead: bool, threads: int, behind: bool, locked: bool) -> Callable:
        return functools.partial(module_constants, uploads, STAGE_AHEAD=ahead,
                                 STAGING_THREADS=threads, LAUNCH_WHILE_STAGING=behind,
                                 SEND_REGISTERED=locked)

    staged = [(ahead, threads, behind, False) for threads in staging_threads
              for ahead in (False, True) for behind in while_staging]
    locked = [(uploads.STAGE_AHEAD, uploads.STAGING_THREADS, False, True)] if page_locked else []
    settings = {key: setting(*key) for key in (*staged, *locked)}
    return [{"measure": "predict_by_dtype", "implementation": "kernels", "dtype": name,
             "stage_ahead": ahead, "staging_threads": threads,
             "launch_while_staging": behind, "send_registered": registered,
             "examples": len(X), "examples_per_second": rate, "rounds": rounds,
             "same_outputs_as_float32": same}
            for (name, (ahead, threads, behind, registered)), (rate, same)
            in pixel_rates(X, y, chunk, rounds, settings).items()]


def rates_by_locking(X: np.ndarray, y: np.ndarray, chunk: int, rounds: int) -> list[dict]:
    """``predict_by_locking``: ``pixel_rates`` with each call's rows page-locked where they lie
    (``SEND_REGISTERED``), whole before the first copy or the rest ahead (``LOCK_REST_AHEAD``),
    and unlocked before the call returns or after it (``UNLOCK_AFTER_RETURN``)."""
    import gln.kernels.uploads as uploads  # noqa: PLC0415
    from gln.kernels.page_locks import wait_for_unlocks  # noqa: PLC0415

    settings = {(after, ahead): functools.partial(
        module_constants, uploads, SEND_REGISTERED=True, UNLOCK_AFTER_RETURN=after,
        LOCK_REST_AHEAD=ahead) for after in (False, True) for ahead in (False, True)}
    rates = pixel_rates(X, y, chunk, rounds, settings)
    wait_for_unlocks()  # none left locked for what follows
    return [{"measure": "predict_by_locking", "implementation": "kernels", "dtype": name,
             "unlock_after_return": after, "lock_rest_ahead": ahead, "examples": len(X),
             "examples_per_second": rate, "rounds": rounds, "same_outputs_as_float32": same}
            for (name, (after, ahead)), (rate, same) in rates.items()]


GATING_PRODUCTS = ("float32", "int8")  # the values of gln.kernels.cuda.GATING_PRODUCT


def alternating_rates(settings: dict[Any, Any], X: np.ndarray, y: np.ndarray, chunk: int,
                      rounds: int) -> tuple[dict[tuple[str, Any], float], bool]:
    """Learning and prediction rates under each setting (a name and a function making a context
    manager that holds it), alternating: a new model learns one chunk (compiling what it
    needs), then up to four more timed, then predicts ``X``; the medians of ``rounds`` rounds
    by (verb, setting), and whether every setting learned the first one's outputs and bytes
    and then predicted its outputs for a chunk, to the last bit, as each must."""
    rates: dict[tuple[str, Any], list[float]] = defaultdict(list)
    results = {}
    rows = min(4 * chunk, len(X) - chunk)
    for _ in range(rounds):
        for name, setting in settings.items():
            with setting():
                model = GLN(**NETWORK, device="cuda")
                model.learn(X[:chunk], y[:chunk])
                rate, outputs = learn_rate(model, X[chunk:chunk + rows], y[chunk:chunk + rows],
                                           chunk)
                rates[("learn", name)].append(rate)
                rates[("predict", name)].append(predict_rate(model, X, chunk))
                results[name] = (outputs, model.to_bytes(), model.predict_proba(X[:chunk]))
    first = results[next(iter(settings))]
    same = all(np.array_equal(o, first[0]) and b == first[1] and np.array_equal(p, first[2])
               for o, b, p in results.values())
    return {key: float(np.median(values)) for key, values in rates.items()}, same


def rates_by_gating(X: np.ndarray, y: np.ndarray, chunk: int, rounds: int) -> list[dict]:
    """``learn_by_gating`` and ``predict_by_gating``: the rates with each gating product
    (``alternating_rates``)."""
    import gln.kernels.cuda as cuda  # noqa: PLC0415

    settings = {p: functools.partial(module_constant, cuda, "GATING_PRODUCT", p)
                for p in GATING_PRODUCTS}
    rates, same = alternating_rates(settings, X, y, chunk, rounds)
    return [{"measure": f"{verb}_by_gating", "implementation": "kernels", "gating_product": p,
             "examples_per_second": rates[(verb, p)], "rounds": rounds,
             "same_outputs_as_float32": same}
            for verb in ("learn", "predict") for p in GATING_PRODUCTS]


def rates_by_learning_kernel(X: np.ndarray, y: np.ndarray, chunk: int,
                             rounds: int) -> list[dict]:
    """``learn_by_kernel``: the learning rate with the library's kernels (``ROW_WARPS_MIN_ROWS``
    as it is) and with a warp per row for every chunk, its rows taken in each ``ROW_ORDER``
    (``alternating_rates``), on the run's data, whose contexts are as uneven as real ones."""
    import gln.kernels.cuda as cuda  # noqa: PLC0415

    settings = {("library", None): contextlib.nullcontext,
                **{("rows", order): functools.partial(row_warps, order)
                   for order in cuda.ROW_ORDERS}}
    rates, same = alternating_rates(settings, X, y, chunk, rounds)
    return [{"measure": "learn_by_kernel", "implementation": "kernels", "kernels": name,
             "row_order": order,
             "row_warps_min_rows": cuda.ROW_WARPS_MIN_ROWS if name == "library" else 1,
             "examples_per_second": rates[("learn", (name, order))], "rounds": rounds,
             "same_outputs_and_bytes": same}
            for name, order in settings]


def latency_us(model: GLN, X: np.ndarray, y: np.ndarray | None, calls: int) -> dict:
    """Single-example ``learn`` calls (``predict_proba`` when ``y`` is None), timed one by one."""
    times = []
    for t in range(calls):
        start = time.perf_counter()
        if y is None:
            model.predict_proba(X[t:t + 1])
        else:
            model.learn(X[t:t + 1], y[t:t + 1])
        times.append(time.perf_counter() - start)
    us = np.array(times) * 1e6
    return {"median_us": float(np.median(us)), "p99_us": float(np.percentile(us, 99)),
            "calls": calls}


def latency_profile(model: GLN, X: np.ndarray, y: np.ndarray, calls: int,
                    top: int = 25) -> list[dict]:
    """Where single-example ``learn`` calls spend their time, to choose what to fuse next.

    cProfile over ``calls`` calls; the ``top`` functions by cumulative time, in microseconds per
    call. On the GPU small launches and copies are bound by the host, so their cost shows up
    in the function that issues them (a device-to-host copy also waits for the kernels before it).
    """
    rows = iter(range(calls))

    def learn_one() -> None:
        t = next(rows)
        model.learn(X[t:t + 1], y[t:t + 1])

    return [{**row, "calls_per_learn": row.pop("calls_per_call")}
            for row in call_profile(learn_one, calls, top, by="cumulative")]


def call_profile(call: Callable[[], Any], calls: int, top: int,
                 by: str = "cumulative") -> list[dict]:
    """cProfile over ``calls`` calls of ``call``: the ``top`` functions by ``by`` time
    ("cumulative" or "own"), each with its calls, own and cumulative microseconds per call."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        call()
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # (file, line, name) -> (cc, nc, tt, ct, callers)
    column = {"own": 2, "cumulative": 3}[by]
    ranked = sorted(stats.items(), key=lambda item: item[1][column], reverse=True)[:top]
    return [{"function": f"{Path(file).name}:{line}:{name}", "calls_per_call": nc / calls,
             "own_us": tt / calls * 1e6, "cumulative_us": ct / calls * 1e6}
            for (file, line, name), (_, nc, tt, ct, _) in ranked]


def int_list(text: str) -> list[int]:
    """``"1,32,256"`` -> [1, 32, 256] (a command-line list)."""
    return [int(v) for v in text.split(",")]


def staging_list(text: str) -> list[tuple[int, int]]:
    """``"1x1,4x4"`` -> [(1, 1), (4, 4)] (threads x pieces pairs)."""
    return [tuple(int(v) for v in pair.split("x")) for pair in text.split(",")]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", help="directory of the MNIST IDX files (or GLN_DATA_DIR)")
    parser.add_argument("--examples", type=int, default=60_000, help="rows learned, kernels")
    parser.add_argument("--plain-examples", type=int, default=2_000,
                        help="rows learned by the plain per-example CuPy path")
    parser.add_argument("--chunk", type=int, default=4096, help="rows per learn/predict call")
    parser.add_argument("--latency-calls", type=int, default=1000)
    parser.add_argument("--plain-latency-calls", type=int, default=200)
    parser.add_argument("--profile-calls", type=int, default=200,
                        help="single-example learn calls profiled with cProfile")
    parser.add_argument("--model-chunk-rows", type=int, default=None,
                        help="override gln.model.CHUNK_ROWS_GPU (rows per kernel launch)")
    parser.add_argument("--layer-rows", type=int_list,
                        default=[1, 4, 16, 64, 256, 1024, 2048, 4096],
                        help="chunk lengths for layer_pass timings")
    parser.add_argument("--predict-rows-per-warp", type=int_list,
                        default=[32, 128], help="PREDICT_ROWS_PER_WARP values to time")
    parser.add_argument("--predict-rows-per-block", type=int_list, default=[256, 512, 1024, 2048],
                        help="PREDICT_ROWS_PER_BLOCK values to time")
    parser.add_argument("--predict-neurons-per-block", type=int_list,
                        default=[1, 2, 3, 4, 8, 13, 32],
                        help="PREDICT_MAX_NEURONS_PER_BLOCK values to time the shared kernel "
                             "with, at PREDICT_CHUNK_ROWS_GPU rows")
    parser.add_argument("--predict-sum-batch", type=int_list, default=[1, 4, 8, 16, 32],
                        help="GLN_SUM_BATCH values to time the shared kernel with, at "
                             "PREDICT_CHUNK_ROWS_GPU rows")
    parser.add_argument("--predict-chunk-rows", type=int_list, default=[512, 1024, 2048, 4096],
                        help="values of gln.staging.PREDICT_CHUNK_ROWS_GPU to predict with")
    parser.add_argument("--staging", type=staging_list, default=[(1, 1), (1, 4), (4, 1), (4, 4)],
                        help="STAGING_THREADS x STAGING_PIECES pairs of gln.kernels.uploads")
    parser.add_argument("--first-chunk-rows", type=int_list, default=[512, 1024],
                        help="first chunk lengths to predict with on the copy stream")
    parser.add_argument("--upload-rounds", type=int, default=5)
    parser.add_argument("--dtype-rounds", type=int, default=5,
                        help="alternating rounds of uint8 and float32 pixels (0: none)")
    parser.add_argument("--gating-rounds", type=int, default=3,
                        help="alternating rounds of each GATING_PRODUCT (0: none)")
    parser.add_argument("--kernel-rounds", type=int, default=3,
                        help="alternating rounds of the library's learning kernels and the row "
                             "kernel (0: none)")
    parser.add_argument("--repeats", type=int, default=20, help="timed launches per layer_pass")
    parser.add_argument("--wide-rows", type=int_list, default=[256, 2048],
                        help="chunk lengths to time the wide kernel at, beside the streaming one")
    parser.add_argument("--gating-rows", type=int_list, default=[1, 4, 8, 16, 32, 64, 128],
                        help="chunk lengths at which to time the gating by either path")
    parser.add_argument("--gating-calls", type=int, default=50,
                        help="timed gating calls a path and length")
    parser.add_argument("--skip-layer-passes", action="store_true")
    add_pygln_argument(parser)
    parser.add_argument("--pygln-examples", type=int, default=2_000,
                        help="rows learned by pygln, one per call")
    args = parser.parse_args(argv)

    import cupy as cp  # noqa: PLC0415 - the benchmark needs a GPU

    device = device_name(cp)
    if args.model_chunk_rows:
        gln.model.CHUNK_ROWS_GPU = args.model_chunk_rows
    common = {"model_chunk_rows": gln.model.CHUNK_ROWS_GPU, "call_rows": args.chunk}

    if not args.skip_layer_passes:
        time_layer_passes(cp, args, device)
        time_wide_kernel(cp, args, device)
        time_gating_paths(cp, args, device)

    total = max(args.examples, args.plain_examples, args.pygln_examples) + args.latency_calls \
        + args.chunk
    X, y, data = load_data(args, total)
    common["data"] = data
    tail = slice(len(X) - args.latency_calls - args.chunk, None)  # unseen rows for latency

    rates = {}
    for name, use_kernels, n_learn, n_latency in (
        ("kernels", True, args.examples, args.latency_calls),
        ("plain_cupy", False, args.plain_examples, args.plain_latency_calls),
    ):
        warm = GLN(**NETWORK, device="cuda", use_kernels=use_kernels)  # compiles every kernel
        warm.learn(X[:args.chunk], y[:args.chunk])
        warm.learn(X[:1], y[:1])
        warm.predict_proba(X[:args.chunk])
        # A chunk too short for the int8 gating GEMMs: the float32 GEMM's first call, whose
        # cuBLAS kernels load lazily (about 90 ms once a process on an H200), stays untimed.
        warm.predict_proba(X[:SHORT_GEMM_ROWS])

        model = GLN(**NETWORK, device="cuda", use_kernels=use_kernels)
        rate, outputs = learn_rate(model, X[:n_learn], y[:n_learn], args.chunk)
        accuracy = float((outputs.argmax(axis=1) == y[:n_learn]).mean())
        rates[("learn", name)] = rate
        emit({"measure": "learn", "implementation": name, "examples": n_learn,
              "examples_per_second": rate, "prequential_accuracy": accuracy, **common}, device)
        if name == "kernels":
            kernel_outputs = outputs
        else:
            rows = min(n_learn, len(kernel_outputs))  # the same stream from the same state
            agree = float(np.abs(outputs[:rows] - kernel_outputs[:rows]).max())
            emit({"measure": "agreement", "rows": rows, "max_abs_difference": agree,
                  "agree": agree < 1e-3}, device)

        predict_rows = X[:max(n_learn, args.chunk)]
        rates[("predict", name)] = predict_rate(model, predict_rows, args.chunk)
        emit({"measure": "predict", "implementation": name, "examples": len(predict_rows),
              "examples_per_second": rates[("predict", name)],
              "predict_chunk_rows": gln.staging.PREDICT_CHUNK_ROWS_GPU, **common}, device)
        if name == "kernels":
            held = page_locked_passes(model, predict_rows, args.chunk)
            emit({"measure": "predict_page_locked", "implementation": name,
                  "examples": len(predict_rows),
                  "examples_per_second": float(np.median(held["plain"])),
                  "page_locked_examples_per_second": float(np.median(held["page_locked"])),
                  "lock_ms": float(np.median(held["lock_ms"])),
                  "unlock_ms": float(np.median(held["unlock_ms"])),
                  "passes": len(held["plain"]), **common}, device)
            for rows in args.predict_chunk_rows:
                with module_constant(gln.staging, "PREDICT_CHUNK_ROWS_GPU", rows):
                    rate = predict_rate(model, predict_rows, args.chunk)
                emit({"measure": "predict_by_chunk_rows", "implementation": name,
                      "predict_chunk_rows": rows, "examples_per_second": rate, **common},
                     device)
        if name == "kernels":
            works, why = sending_while_staging_works()
            emit({"measure": "launch_while_staging_probe", "works": works, "error": why,
                  **common}, device)
            locks, refusal = page_locking_works()
            emit({"measure": "page_locking_probe", "works": locks, "error": refusal,
                  **common}, device)
            for record in rates_by_upload(model, predict_rows, args.chunk, args.staging,
                                          args.first_chunk_rows, args.upload_rounds, works,
                                          locks):
                emit({"measure": "predict_by_upload", **record, **common}, device)
            by_dtype = functools.partial(rates_by_dtype,
                                         while_staging=(False, True) if works else (False,),
                                         page_locked=locks)
            for rounds, rates_by in ((args.dtype_rounds, by_dtype),
                                     (args.dtype_rounds if locks else 0, rates_by_locking),
                                     (args.gating_rounds, rates_by_gating),
                                     (args.kernel_rounds, rates_by_learning_kernel)):
                for record in rates_by(X, y, args.chunk, rounds) if rounds else ():
                    emit({**record, **common}, device)
        if name == "kernels":  # launch by launch, from the same state, then replayed
            uncaptured = GLN.from_bytes(model.to_bytes(), device="cuda")
            uncaptured._replays = None  # what the library did before it captured short calls
            for verb, labels in (("predict", None), ("learn", y[tail])):
                emit({"measure": f"{verb}_latency", "implementation": "kernels_uncaptured",
                      **latency_us(uncaptured, X[tail], labels, n_latency)}, device)
            emit({"measure": "predict_latency", "implementation": name,
                  **latency_us(model, X[tail], None, n_latency)}, device)
        emit({"measure": "learn_latency", "implementation": name,
              **latency_us(model, X[tail], y[tail], n_latency)}, device)
        if name == "kernels":
            emit({"measure": "learn_latency_profile", "implementation": name,
                  "calls": args.profile_calls,
                  "functions": latency_profile(model, X[tail], y[tail], args.profile_calls)},
                 device)

    if args.pygln_dir:
        compare_with_pygln(args.pygln_dir, X, y, args.pygln_examples, rates, args.chunk, device,
                           data)


def compare_with_pygln(pygln_dir: Path, X: np.ndarray, y: np.ndarray, examples: int,
                       rates: dict, call_rows: int, device: str, data: str) -> None:
    """pygln's measurements on the same stream and GPU, and our rates over its rates."""
    for record in measure(pygln_dir, X, y, examples):
        emit({**record, "data": data}, device)
        ours = rates.get((record["measure"], "kernels"))
        if ours:
            emit({"measure": "peer_ratio", "of": record["measure"],
                  "peer": record["implementation"], "peer_call_rows": record["call_rows"],
                  "our_call_rows": call_rows,
                  "ours_over_peer": ours / record["examples_per_second"]}, device)


if __name__ == "__main__":
    main()
