"""The CUDA kernels: Algorithm 1 for one layer over a chunk, the running input moments, the
online input scaling, the first layer's inputs and the halfspace contexts.

The sources (``layer_pass.cu``, ``moments.cu``, ``gating.cu``, ``scaling.cu``,
``layer_inputs.cu`` beside this file) are compiled on first use (``gln.kernels.cuda_modules``).
See ``docs/gpu.md`` for the design; in short:

* one warp owns one neuron and runs it through every example of the chunk in order, so a layer
  over a chunk is one launch and equals strict per-example learning;
* every floating-point operation in the kernels is explicitly rounded and every sum has a
  fixed order, so results do not depend on the chunk length or on which kernel ran: learning a
  chunk equals learning its rows one call at a time, byte for byte;
* two kernels share that per-example code: *streaming* (the active row read from and written
  to global memory per example; short chunks and prediction) and *resident* (the neuron's 2^m
  rows held in shared memory for the whole chunk; long chunks); a third, *rows*, gives each
  row a warp of its own, which takes only the examples of the row's context (learning chunks
  of at least ``ROW_WARPS_MIN_ROWS`` rows, where the rows' warps run a whole layer at once);
  rows too wide for a lane's registers (more than ``MAX_INPUTS``
  inputs) take *wide*, the streaming kernel's work with the row and input read as they are
  used;
* the halfspace contexts: the margins that float32 cannot settle are redone in float64 by the
  kernel itself, so gating never makes the host wait for the GPU;
* the standardisation of a chunk is one launch instead of a dozen (bit for bit NumPy's), and
  so are the unit scaling and the per-row side information (one warp per row, sums in a fixed
  order) and the first layer's inputs (the bias, then logits); each layer pass writes the next
  layer's inputs itself;
* a family of models (``gln.family``) has a launch of its own for a layer and for the moments
  over a chunk of many members' rows, grouped by member: each member's rows are a run that one
  warp (thread) takes in order, as the single model's kernels take a chunk
  (``cuda_family_network_pass``, ``cuda_family_moments``).

CuPy is imported only when a kernel is launched, so ``plan_layer_launch`` (pure Python) can be
used and tested without it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gln.backend import import_cupy as _cupy
from gln.gating import dot_rounding_bound
from gln.kernels.cuda_modules import COMPILE_OPTIONS as COMPILE_OPTIONS  # what sources get
from gln.kernels.cuda_modules import GATING_THREADS, WARP, function
from gln.kernels.int8_gating import Int8PlanesCache, int8_products
from gln.scaling import RunningMoments

STREAM_WARPS = 4  # neurons (warps) per block of the streaming kernel: GLN_STREAM_WARPS
MAX_PER_LANE = 64  # register arrays of ceil(I / 32) floats; wider layers take the wide kernel
MAX_INPUTS = WARP * MAX_PER_LANE
RESIDENT_MIN_ROWS = 2048  # learning chunks from here keep a neuron's rows in shared memory
# Learning chunks from here take a warp per row (gln_layer_pass_rows); None: only mode="rows".
ROW_WARPS_MIN_ROWS: int | None = 256
ROW_WARPS_MAX_CONTEXTS = 12 * 1024  # gln_row_examples counts contexts in 48 KB of shared memory
ROW_ORDERS = ("longest_first", "natural")  # gln_row_order's order, or neuron by neuron
ROW_ORDER = "longest_first"  # the longest chains start first; the same bytes either way
ORDER_BUCKETS, ORDER_THREADS = 64, 256  # GLN_ORDER_BUCKETS, GLN_ORDER_THREADS
PREDICT_ROWS_PER_WARP = 32  # prediction writes nothing: a neuron's examples split over warps
PREDICT_SHARED_MIN_ROWS = 64  # predicting chunks from here take the shared kernel
PREDICT_ROWS_PER_BLOCK = 512  # examples a block of the shared kernel takes
PREDICT_MAX_NEURONS_PER_BLOCK = 8  # fewer lets several blocks of a narrow layer share an SM
# Dot products the shared kernel sums at once (GLN_SUM_BATCH); None: the source's own.
PREDICT_SUM_BATCH: int | None = None
GROUPED_MAX_LANES = 12  # rows up to this many elements a lane group their examples
# GLN_PREDICT_WARPS of mid-width rows (None: the source's 16): more warps hide loads' latency.
PREDICT_WARPS: int | None = 32
PREDICT_NARROW_LANES = 26  # the widest rows (elements a lane) that PREDICT_WARPS applies to
PREDICT_PREFETCH_MAX_WARPS = 16  # beyond it no input is loaded ahead, which would spill
# GLN_EXAMPLE_GROUP, examples a warp mixes at once on narrow rows (None: the source's 1).
PREDICT_EXAMPLE_GROUP: int | None = 2
_MAX_GRID_Y = 65535
GATING_GEMM_MIN_ROWS = 9  # shorter chunks (the replayed ones) take our kernel: no cuBLAS launch
# Long chunks' gating products: "float32" (cuBLAS) or "int8" (gln.kernels.int8_gating), faster.
GATING_PRODUCT = "int8"
INT8_GATING_MIN_ROWS = 1024  # from here the int8 products won; the planes a multiple of 4
# Room for one margin in RECHECK_LIST_FRACTION (plus RECHECK_LIST_MIN): 8x what inputs need.
RECHECK_LIST_FRACTION = 128
RECHECK_LIST_MIN = 1024
RECHECK_MAX_BLOCKS = 4096  # gln_halfspace_rechecks loops over what its grid does not cover
SCALING_THREADS = 128  # __launch_bounds__ of the kernels in scaling.cu (row kernels: 4 rows)
NONFINITE_MAX_BLOCKS = 1024  # gln_flag_nonfinite loops over what its grid does not cover
INPUTS_THREADS = 128  # __launch_bounds__ of gln_layer_inputs
MOMENTS_THREADS = 128  # __launch_bounds__ of the kernels in moments.cu
STREAMING, RESIDENT = "gln_layer_pass_streaming", "gln_layer_pass_resident"
SHARED, ROWS = "gln_layer_predict_shared", "gln_layer_pass_rows"
WIDE = "gln_layer_pass_wide"
MODES = ("auto", "streaming", "resident", "shared", "rows", "wide")
WIDE_MODULE_LANES = 1  # the wide kernel keeps no row in registers: one module for every width


@dataclass(frozen=True)
class LayerLaunch:
    """How one layer pass is launched: kernel name, grid, block, shared memory, macros."""

    kernel: str
    grid: tuple[int, int]
    block: tuple[int]
    shared_bytes: int
    per_lane: int
    rows_per_warp: int  # examples per warp (per block for the shared kernel)
    neurons_per_block: int = 1  # the shared kernel's neurons per block
    # Macros beyond GLN_PER_LANE that its module is compiled with (the shared kernel's settings
    # where they differ from the source's own), as compiler options: "-DNAME=VALUE".
    defines: tuple[str, ...] = ()


def predict_warps(lanes: int) -> int:
    """Warps per block of the shared prediction kernel (``GLN_PREDICT_WARPS``)."""
    if lanes > PREDICT_NARROW_LANES:
        return 8
    if PREDICT_WARPS is not None and lanes > GROUPED_MAX_LANES:
        return PREDICT_WARPS
    return 16


def predict_sum_batch(lanes: int) -> int:
    """Dot products the shared kernel sums at once on rows of ``lanes`` elements a lane: the
    source's GLN_SUM_BATCH (16 up to ``PREDICT_NARROW_LANES``, 1 beyond) or
    ``PREDICT_SUM_BATCH``."""
    if PREDICT_SUM_BATCH is not None:
        return PREDICT_SUM_BATCH
    return 16 if lanes <= PREDICT_NARROW_LANES else 1


def shared_defines(lanes: int) -> tuple[str, ...]:
    """The shared kernel's macros that differ from the source's defaults, each where set:
    ``PREDICT_SUM_BATCH``, ``PREDICT_WARPS`` (rows of more than
    ``GROUPED_MAX_LANES`` and at most ``PREDICT_NARROW_LANES`` a lane; no input loaded ahead
    beyond ``PREDICT_PREFETCH_MAX_WARPS``) and ``PREDICT_EXAMPLE_GROUP`` (rows of at most
    ``GROUPED_MAX_LANES`` a lane, whose sums are batched)."""
    defines = []
    if PREDICT_SUM_BATCH is not None:
        defines.append(f"-DGLN_SUM_BATCH={PREDICT_SUM_BATCH}")
    if PREDICT_WARPS is not None and GROUPED_MAX_LANES < lanes <= PREDICT_NARROW_LANES:
        defines.append(f"-DGLN_PREDICT_WARPS={PREDICT_WARPS}")
        if PREDICT_WARPS > PREDICT_PREFETCH_MAX_WARPS:
            defines.append("-DGLN_PREFETCH=0")
    batch = predict_sum_batch(lanes)
    if PREDICT_EXAMPLE_GROUP is not None and lanes <= GROUPED_MAX_LANES and batch > 1:
        if batch % PREDICT_EXAMPLE_GROUP:
            raise ValueError(f"PREDICT_EXAMPLE_GROUP ({PREDICT_EXAMPLE_GROUP}) must divide the "
                             f"sums batched at once ({batch})")
        defines.append(f"-DGLN_EXAMPLE_GROUP={PREDICT_EXAMPLE_GROUP}")
    return tuple(defines)


def per_lane(num_inputs: int) -> int:
    """Elements of a row each lane owns: ceil(I / 32) (the ``GLN_PER_LANE`` macro)."""
    return -(-num_inputs // WARP)


def plan_layer_launch(
    weights_shape: tuple[int, int, int, int],
    n: int,
    learn: bool,
    max_shared_bytes: int,
    mode: str = "auto",
) -> LayerLaunch:
    """Choose the kernel and its launch shape for a layer of ``weights_shape`` over n rows.

    ``mode`` forces ``"streaming"``, ``"resident"``, ``"rows"``, ``"wide"`` or (prediction
    only) ``"shared"`` (tests and benchmarks); ``"auto"`` picks rows when learning at least
    ``ROW_WARPS_MIN_ROWS`` rows (when set), else resident from ``RESIDENT_MIN_ROWS``, and
    shared when predicting at least ``PREDICT_SHARED_MIN_ROWS``, where a neuron's rows fit in
    ``max_shared_bytes`` of shared memory. All give the same bytes. Rows of more than
    ``MAX_INPUTS`` inputs, which no lane's registers hold, take the wide kernel whatever the
    mode.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    num_glns, num_neurons, num_contexts, num_inputs = weights_shape
    if num_inputs < 1:
        raise ValueError(f"the CUDA layer pass takes at least 1 input, got {num_inputs}")
    if num_contexts < 1 or num_contexts & (num_contexts - 1):
        raise ValueError(f"contexts per neuron must be a power of two, got {num_contexts}")
    neurons = num_glns * num_neurons
    if mode == "wide" or num_inputs > MAX_INPUTS:
        return _streaming_launch(WIDE, neurons, n, learn, WIDE_MODULE_LANES)
    shared_bytes = num_contexts * num_inputs * 4
    fits = shared_bytes <= max_shared_bytes
    if mode in ("resident", "shared") and not fits:
        raise ValueError(
            f"a neuron's rows ({shared_bytes} bytes) exceed the shared memory ({max_shared_bytes})"
        )
    if mode == "shared" and learn:
        raise ValueError("the shared kernel only predicts")
    lanes = per_lane(num_inputs)
    if mode == "shared" or (mode == "auto" and not learn and n >= PREDICT_SHARED_MIN_ROWS
                            and fits):
        most = min(PREDICT_MAX_NEURONS_PER_BLOCK, WARP, max_shared_bytes // shared_bytes)
        blocks_per_gln = -(-num_neurons // most)
        per_block = -(-num_neurons // blocks_per_gln)  # balanced: no block of a few neurons
        rows = max(PREDICT_ROWS_PER_BLOCK, -(-n // _MAX_GRID_Y))
        return LayerLaunch(SHARED, (num_glns * blocks_per_gln, max(1, -(-n // rows))),
                           (WARP * predict_warps(lanes),), per_block * shared_bytes, lanes, rows,
                           per_block, shared_defines(lanes))
    rows_fit = num_contexts <= ROW_WARPS_MAX_CONTEXTS
    if mode == "rows" and not rows_fit:
        raise ValueError(f"the row kernel takes at most {ROW_WARPS_MAX_CONTEXTS} contexts a "
                         f"neuron, got {num_contexts}")
    if mode == "rows" or (mode == "auto" and learn and ROW_WARPS_MIN_ROWS is not None
                          and n >= ROW_WARPS_MIN_ROWS and rows_fit):
        return LayerLaunch(ROWS, (neurons * num_contexts, 1), (WARP,), 0, lanes, max(n, 1))
    resident = mode == "resident" or (
        mode == "auto" and learn and n >= RESIDENT_MIN_ROWS and fits
    )
    if resident:
        return LayerLaunch(RESIDENT, (neurons, 1), (WARP,), shared_bytes, lanes, max(n, 1))
    return _streaming_launch(STREAMING, neurons, n, learn, lanes)


def _streaming_launch(kernel: str, neurons: int, n: int, learn: bool, lanes: int) -> LayerLaunch:
    """A warp per neuron, ``STREAM_WARPS`` to a block (the streaming and the wide kernel).
    Learning keeps each neuron on one warp (its updates are sequential); prediction may split
    the examples, since no weight changes."""
    rows = max(n, 1) if learn else max(PREDICT_ROWS_PER_WARP, -(-n // _MAX_GRID_Y))
    grid = (-(-neurons // STREAM_WARPS), max(1, -(-n // rows)))
    return LayerLaunch(kernel, grid, (WARP * STREAM_WARPS,), 0, lanes, rows)


def layer_kernel_args(
    weights: Any, contexts: Any, inputs: Any, targets: Any, rates: Any, probs: Any,
    pred_clip: float, weight_clip: float, learn: bool, rows_per_warp: int,
    next_inputs: Any = None, bias_logit: float = 0.0, neurons_per_block: int = 1,
) -> tuple:
    """The kernels' arguments, in their order, with the C types they expect.

    ``next_inputs`` (n, G, K + 1), when given, receives the next layer's inputs; otherwise
    ``probs`` stands in for the pointer, which the kernel then never writes through.
    """
    num_glns, num_neurons, num_contexts, num_inputs = weights.shape
    return (
        weights, contexts, inputs, targets, rates, probs,
        probs if next_inputs is None else next_inputs,
        np.int32(contexts.shape[0]), np.int32(num_glns), np.int32(num_neurons),
        np.int32(num_contexts), np.int32(num_inputs), np.int32(inputs.shape[1]),
        # The reference clips a float32 p with Python floats: both bounds round to float32.
        np.float32(pred_clip), np.float32(1.0 - pred_clip), np.float32(weight_clip),
        np.int32(bool(learn)), np.float32(bias_logit), np.int32(next_inputs is not None),
        np.int32(rows_per_warp), np.int32(neurons_per_block),
    )


def check_layer_arrays(weights, contexts, inputs, targets, rates, probs) -> None:
    """Raise ``ValueError`` unless the arrays have the contract's dtypes, shapes and layout."""
    if len(weights.shape) != 4:
        raise ValueError(f"weights must be (G, K, S, I), got shape {weights.shape}")
    num_glns, num_neurons, _, num_inputs = weights.shape
    n = contexts.shape[0] if len(contexts.shape) == 3 else -1
    expected = {
        "weights": (weights, np.float32, tuple(weights.shape)),
        "contexts": (contexts, np.int32, (n, num_glns, num_neurons)),
        "inputs": (inputs, np.float32, (n, inputs.shape[1] if len(inputs.shape) == 3 else -1,
                                        num_inputs)),
        "targets": (targets, np.float32, (n, num_glns)),
        "rates": (rates, np.float32, (n,)),
        "probs": (probs, np.float32, (n, num_glns, num_neurons)),
    }
    for name, (array, dtype, shape) in expected.items():
        if array.dtype != dtype or tuple(array.shape) != shape:
            raise ValueError(
                f"{name} must be {np.dtype(dtype).name} of shape {shape}, got "
                f"{array.dtype} of shape {tuple(array.shape)}"
            )
        if not array.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous")
    if inputs.shape[1] not in (1, num_glns):
        raise ValueError(f"inputs' middle axis must be 1 or {num_glns}, got {inputs.shape[1]}")


def _layer_kernel(lanes: int, name: str, defines: tuple[str, ...] = ()) -> Any:
    """Kernel ``name`` of the layer-pass module compiled for rows of ``lanes`` elements per lane
    (``GLN_PER_LANE``), with the ``defines`` of a launch (``LayerLaunch.defines``)."""
    return function("layer_pass.cu", name, (f"-DGLN_PER_LANE={lanes}", *defines))


@functools.cache
def _max_shared_bytes(device_id: int) -> int:
    """Dynamic shared memory one block may opt into on this device (227 KB on Hopper)."""
    runtime = _cupy().cuda.runtime
    return int(runtime.deviceGetAttribute(runtime.cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                          device_id))


_shared_limit_set: dict[tuple[int, int, str, tuple[str, ...]], int] = {}


def _kernel(launch: LayerLaunch, device_id: int) -> Any:
    kernel = _layer_kernel(launch.per_lane, launch.kernel, launch.defines)
    key = (device_id, launch.per_lane, launch.kernel, launch.defines)
    if launch.shared_bytes > _shared_limit_set.get(key, 48 * 1024):
        kernel.max_dynamic_shared_size_bytes = launch.shared_bytes  # opt in beyond 48 KB
        _shared_limit_set[key] = launch.shared_bytes
    return kernel


def cuda_layer_pass(
    weights, contexts, inputs, targets, rates, pred_clip, weight_clip, learn, probs,
    mode: str = "auto", next_inputs: Any = None, bias_logit: float = 0.0,
) -> None:
    """See ``gln.network.LayerPass``; arrays must be C-contiguous CuPy arrays.

    Deviates from ``gln.network.reference_layer_pass`` in the order of its work: a warp runs a
    neuron (or, ``rows``, one of its weight rows) through the chunk's examples in order, not
    every neuron through one example at a time; every rounding explicit and every sum in a
    fixed order, so it agrees with the reference to float32 rounding, and with itself byte for
    byte whatever the kernel or the chunking.

    One launch per call. ``mode`` forces a kernel (``"streaming"``, ``"resident"``, ``"rows"``
    or, when predicting, ``"shared"``); all give the same bytes. ``next_inputs``
    (n, G, K + 1) float32, when given, receives the next layer's inputs
    (``cuda_layer_inputs(probs, bias_logit, True)``, bit for bit) from the same launch. Layers
    wider than ``MAX_INPUTS`` inputs take the wide kernel.
    """
    check_layer_arrays(weights, contexts, inputs, targets, rates, probs)
    if next_inputs is not None:
        _check_next_inputs(next_inputs, probs)
    _layer_pass(weights, contexts, inputs, targets, rates, pred_clip, weight_clip, learn, probs,
                mode, next_inputs, bias_logit)


def _layer_pass(weights, contexts, inputs, targets, rates, pred_clip, weight_clip, learn, probs,
                mode, next_inputs, bias_logit) -> None:
    """``cuda_layer_pass`` on arrays known to be right (the network pass makes its own)."""
    n = contexts.shape[0]
    if n == 0:
        return
    device_id = weights.device.id
    launch = plan_layer_launch(
        tuple(weights.shape), n, bool(learn), _max_shared_bytes(device_id), mode
    )
    args = layer_kernel_args(
        weights, contexts, inputs, targets, rates, probs, pred_clip, weight_clip, learn,
        launch.rows_per_warp, next_inputs, bias_logit, launch.neurons_per_block,
    )
    if launch.kernel == ROWS:
        args = (*args, *_row_lists(contexts, weights.shape[2], launch.per_lane))
    _kernel(launch, device_id)(launch.grid, launch.block, args, shared_mem=launch.shared_bytes)


def _row_lists(contexts: Any, num_contexts: int, lanes: int) -> tuple[Any, ...]:
    """The row kernel's last five arguments: each row's examples (``gln_row_examples``: the
    neurons' examples listed by context, how many each row has and where they start), the
    order of the rows and whether to follow it (``ROW_ORDER``; ``gln_row_order``)."""
    if ROW_ORDER not in ROW_ORDERS:
        raise ValueError(f"ROW_ORDER must be one of {ROW_ORDERS}, got {ROW_ORDER!r}")
    cp = _cupy()
    n, glns, neurons = contexts.shape
    rows = glns * neurons * num_contexts
    examples = cp.empty(n * glns * neurons, dtype=cp.int32)
    counts = cp.empty(rows, dtype=cp.int32)
    starts = cp.empty(rows, dtype=cp.int32)
    _layer_kernel(lanes, "gln_row_examples")(
        (glns * neurons,), (WARP,),
        (contexts, np.int32(n), np.int32(glns * neurons), np.int32(num_contexts), examples,
         counts, starts),
        shared_mem=4 * num_contexts)
    if ROW_ORDER == "natural":
        return examples, counts, starts, counts, np.int32(0)  # an order the kernel never reads
    order = cp.empty(rows, dtype=cp.int32)
    _layer_kernel(lanes, "gln_row_order")(
        (1,), (ORDER_THREADS,), (counts, np.int32(rows), np.int32(n), order),
        shared_mem=4 * ORDER_BUCKETS)
    return examples, counts, starts, order, np.int32(1)


def _check_next_inputs(next_inputs: Any, probs: Any) -> None:
    n, num_glns, num_neurons = probs.shape
    if (next_inputs.dtype != np.float32 or tuple(next_inputs.shape) != (n, num_glns,
                                                                       num_neurons + 1)
            or not next_inputs.flags.c_contiguous):
        raise ValueError(
            f"next_inputs must be C-contiguous float32 of shape {(n, num_glns, num_neurons + 1)}"
            f", got {next_inputs.dtype} of shape {tuple(next_inputs.shape)}"
        )


def cuda_network_pass(
    weights: list[Any], contexts: list[Any], base_logits: Any, targets: Any, rates: Any, *,
    bias_logit: float, pred_clip: float, weight_clip: float, learn: bool,
    layer_pass: Callable[..., None] | None = None,
) -> Any:
    """``gln.network.network_pass`` on the GPU in L + 1 launches: the first layer's inputs,
    then each layer's pass (``cuda_layer_pass``). Deviates from it in that each layer's
    launch also writes the next layer's inputs (``gln.network.with_bias``, bit for bit), a
    launch fewer a layer.

    ``layer_pass(weights, contexts, inputs, targets, rates, pred_clip, weight_clip, learn,
    probs, next_inputs, bias_logit)``: one launch a layer; by default the single model's
    (``cuda_family_network_pass`` gives the family's)."""
    cp = _cupy()
    layer_pass = layer_pass or _model_layer_pass
    n = base_logits.shape[0]
    inputs = cuda_layer_inputs(base_logits[:, None, :], bias_logit, False)
    probs = None
    for depth, (layer_weights, layer_contexts) in enumerate(zip(weights, contexts, strict=True)):
        num_glns, num_neurons = layer_weights.shape[-4:-2]  # behind a family's members axis
        probs = cp.empty((n, num_glns, num_neurons), dtype=cp.float32)
        last = depth == len(weights) - 1
        next_inputs = None if last else cp.empty((n, num_glns, num_neurons + 1), cp.float32)
        layer_pass(layer_weights, layer_contexts, inputs, targets, rates, pred_clip,
                   weight_clip, learn, probs, next_inputs, bias_logit)
        inputs = next_inputs
    return probs[:, :, 0]


def _model_layer_pass(weights, contexts, inputs, targets, rates, pred_clip, weight_clip, learn,
                      probs, next_inputs, bias_logit) -> None:
    """A model's layer in ``cuda_network_pass``: the kernel ``plan_layer_launch`` picks."""
    _layer_pass(weights, contexts, inputs, targets, rates, pred_clip, weight_clip, learn, probs,
                "auto", next_inputs, bias_logit)


# ---------------------------------------------------------------------------- a family
FAMILY, FAMILY_WIDE = "gln_family_layer_pass", "gln_family_layer_pass_wide"


@dataclass(frozen=True)
class MemberRuns:
    """A family chunk's rows grouped by member, as the family's kernels read them: run r is
    member ``members[r]``'s rows ``starts[r]`` to ``starts[r + 1]`` (device int64 views of
    one upload), ``count`` runs, the longest ``longest`` rows; ``host_members`` (count,)."""

    members: Any
    starts: Any
    count: int
    longest: int
    host_members: np.ndarray


def member_runs(members: np.ndarray, learning: bool) -> MemberRuns:
    """The runs of ``members`` (n,) int64 on the host, each row's member, whose rows are
    grouped by member (``ValueError`` where a member's rows are apart while ``learning``: its
    runs would learn at once). Predicting, a run is cut every ``PREDICT_ROWS_PER_WARP`` rows,
    so that one member's many rows are shared among warps, as a model's are."""
    n = len(members)
    changes = np.flatnonzero(members[1:] != members[:-1]) + 1
    starts = np.concatenate(([0], changes, [n]) if n else ([0],)).astype(np.int64)
    if learning and len(np.unique(members[starts[:-1]])) != len(starts) - 1:
        raise ValueError("a family chunk's rows must be grouped by member to be learned")
    if not learning:
        starts = np.unique(np.concatenate((starts, np.arange(0, n, PREDICT_ROWS_PER_WARP))))
    runs = len(starts) - 1
    host = np.concatenate((members[starts[:-1]], starts)).astype(np.int64)
    device = _cupy().asarray(host)
    return MemberRuns(device[:runs], device[runs:], runs, int(np.diff(starts).max(initial=0)),
                      host[:runs])


def cuda_family_layer_pass(
    weights: Any, members: np.ndarray, contexts: Any, inputs: Any, targets: Any, rates: Any,
    pred_clip: float, weight_clip: float, learn: bool, probs: Any,
) -> None:
    """``gln.network.reference_family_layer_pass`` on the GPU, in one launch: ``weights``
    (M, G, K, S, I) and the rest C-contiguous CuPy arrays as ``cuda_layer_pass`` takes them,
    but ``members`` (n,) int64 on the host, each row's member, the rows grouped by member
    (a stable sort by member groups them). Each member's weights and outputs are the bytes
    ``cuda_layer_pass`` gives on that member's rows alone."""
    check_layer_arrays(weights[0], contexts, inputs, targets, rates, probs)
    _family_layer_pass(member_runs(members, bool(learn)), weights, contexts, inputs, targets,
                       rates, pred_clip, weight_clip, learn, probs, None, 0.0)


def cuda_family_network_pass(
    weights: list[Any], members: np.ndarray, contexts: list[Any], base_logits: Any,
    targets: Any, rates: Any, *, bias_logit: float, pred_clip: float, weight_clip: float,
    learn: bool,
) -> Any:
    """``cuda_network_pass`` over a family chunk's rows (``members`` as
    ``cuda_family_layer_pass`` takes them): one launch a layer for every member's rows."""
    runs = member_runs(members, learn)
    return cuda_network_pass(weights, contexts, base_logits, targets, rates,
                             bias_logit=bias_logit, pred_clip=pred_clip,
                             weight_clip=weight_clip, learn=learn,
                             layer_pass=functools.partial(_family_layer_pass, runs))


def _family_layer_pass(runs: MemberRuns, weights, contexts, inputs, targets, rates, pred_clip,
                       weight_clip, learn, probs, next_inputs, bias_logit) -> None:
    """One family layer's launch (``gln_family_layer_pass``): a warp per (run, neuron), the
    streaming kernel's blocks of ``STREAM_WARPS`` neurons, a grid row per run."""
    if runs.count == 0:
        return
    num_glns, num_neurons, _, num_inputs = weights.shape[1:]
    wide = num_inputs > MAX_INPUTS
    kernel = _layer_kernel(WIDE_MODULE_LANES if wide else per_lane(num_inputs),
                           FAMILY_WIDE if wide else FAMILY)
    args = layer_kernel_args(weights[0], contexts, inputs, targets, rates, probs, pred_clip,
                             weight_clip, learn, runs.longest, next_inputs, bias_logit)
    grid = (-(-num_glns * num_neurons // STREAM_WARPS), min(runs.count, _MAX_GRID_Y))
    kernel(grid, (WARP * STREAM_WARPS,),
           (weights, *args[1:], runs.members, runs.starts, np.int32(runs.count)))


def cuda_family_moments(
    members: np.ndarray, rows: Any, shifts: Any, member_counts: np.ndarray, totals: Any,
    totals_sq: Any,
) -> tuple[Any, Any, Any]:
    """``gln.scaling.family_moments_before_each_row`` on the GPU in one launch, bit for bit
    NumPy's sequential fold of each member's rows (``moments_before_each_row``'s kernel, a
    run of rows each): ``members`` (n,) int64 on the host, the rows grouped by member;
    ``rows`` (n, d) as ``_kernel_rows`` takes them; ``shifts``, ``totals`` and ``totals_sq``
    (M, d) C-contiguous float64 on the device, the totals advanced in place, and
    ``member_counts`` (M,) int64 on the host, advanced. Returns each row's count (n, 1), sums
    and sums of squares (n, d) before it, on the device."""
    cp = _cupy()
    rows, kind = _kernel_rows(rows)
    n, d = rows.shape
    runs = member_runs(members, True)
    counts = cp.empty((n, 1), dtype=cp.float64)
    sums, sums_sq = cp.empty((n, d), dtype=cp.float64), cp.empty((n, d), dtype=cp.float64)
    if runs.count:
        run_counts = cp.asarray(member_counts[runs.host_members].astype(np.float64))
        function("moments.cu", "gln_family_running_moments" + kind)(
            (-(-max(runs.longest, d) // MOMENTS_THREADS), min(runs.count, _MAX_GRID_Y)),
            (MOMENTS_THREADS,),
            (rows, runs.members, runs.starts, run_counts, np.int32(runs.count), shifts, totals,
             totals_sq, sums, sums_sq, np.int32(d), counts))
        np.add.at(member_counts, members, 1)
    return counts, sums, sums_sq


def moments_before_each_row(
    moments: RunningMoments, rows: Any, count: Any = None, shift: Any = None
) -> tuple[Any, Any, Any, RunningMoments]:
    """``gln.scaling.moments_before_each_row`` on the GPU, bit for bit NumPy's sequential fold.

    Returns counts (n, 1), sums (n, d) and sums of squares (n, d) of ``rows - shift`` before
    each row (``rows`` float64, or float32 read as the float64 values they equal: see
    ``_kernel_rows``), and the moments after the chunk, whose totals are ``moments``' own arrays,
    updated in place (they must be C-contiguous float64). ``count``: ``moments.count`` as a
    one-element float64 device array, for a caller that has it there already; the kernel reads
    it and ``shift`` from memory, so its launch can be captured once and replayed
    (``gln.kernels.replay``).
    """
    cp = _cupy()
    rows, kind = _kernel_rows(rows)
    n, d = rows.shape
    shift = _shift_or_zeros(shift, d)
    for name, total in (("total", moments.total), ("total_sq", moments.total_sq)):
        if total.dtype != cp.float64 or total.shape != (d,) or not total.flags.c_contiguous:
            raise ValueError(f"moments.{name} must be C-contiguous float64 of shape ({d},), "
                             f"got {total.dtype} of shape {tuple(total.shape)}")
    if count is None:
        count = cp.full(1, float(moments.count), dtype=cp.float64)
    sums = cp.empty((n, d), dtype=cp.float64)
    sums_sq = cp.empty((n, d), dtype=cp.float64)
    counts = cp.empty((n, 1), dtype=cp.float64)
    if max(n, d):
        function("moments.cu", "gln_running_moments" + kind)(
            (-(-max(n, d) // MOMENTS_THREADS),), (MOMENTS_THREADS,),
            (rows, shift, moments.total, moments.total_sq, sums, sums_sq, np.int32(n),
             np.int32(d), count, counts),
        )
    return counts, sums, sums_sq, RunningMoments(moments.count + n, moments.total,
                                                 moments.total_sq)


def cuda_layer_contexts(
    z: Any, normals: Any, offsets: Any, context_dim: int, num_glns: int,
    layer_sizes: Sequence[int], int8_planes: Callable[[], Any] | None = None,
) -> list[Any]:
    """``gln.gating.layer_contexts`` on the GPU without waiting for it: (n, G, K_l) per layer.

    The float32 products come from cuBLAS (from ``gln_halfspace_products`` for chunks shorter
    than ``GATING_GEMM_MIN_ROWS``); the margins they cannot settle are redone in float64 inside
    the kernel, so nothing is copied back to the host to find them. The kernel writes each
    layer's block in place: the per-layer arrays are views of one buffer, with no copies.
    ``int8_planes()``: the hyperplanes already cut for the int8 products
    (``gln.kernels.int8_gating.Int8Planes``), asked for only where a chunk takes them; without
    it a chunk cuts them for itself.
    """
    if os.environ.get("CUPY_TF32", "0") != "0":
        raise RuntimeError(
            "CUPY_TF32 makes CuPy's float32 products TF32 (10-bit mantissa), beyond the rounding "
            "bound that keeps the halfspace gating exact; unset it to run GLN models"
        )
    cp = _cupy()
    z = cp.ascontiguousarray(z, dtype=cp.float32)
    normals = cp.ascontiguousarray(normals, dtype=cp.float32)
    offsets = cp.ascontiguousarray(offsets, dtype=cp.float32)
    n = z.shape[0]
    neurons = normals.shape[0] // context_dim
    if neurons != num_glns * sum(layer_sizes):
        raise ValueError(f"{neurons} neurons' planes for {num_glns} GLNs of {list(layer_sizes)}")
    contexts = cp.empty(n * neurons, dtype=cp.int32)
    if contexts.size:
        # Short chunks (a few rows, a few close margins) re-check in place; long ones list
        # their close margins for a second launch, in a list whose count the launch that
        # makes the rows' bounds zeroes.
        rechecks = recheck_list(n * neurons * context_dim) if n >= GATING_GEMM_MIN_ROWS else None
        products, tolerance = _gating_products_and_bounds(
            z, normals, offsets, None if rechecks is None else rechecks.count, int8_planes)
        launch_halfspace_contexts(products, z, normals, offsets, tolerance, context_dim,
                                  layer_sizes, contexts, rechecks)
        if rechecks is not None:
            launch_halfspace_rechecks(z, normals, offsets, context_dim, layer_sizes, contexts,
                                      rechecks)
    bounds = np.cumsum([0, *layer_sizes]) * n * num_glns
    return [contexts[a:b].reshape(n, num_glns, k)
            for a, b, k in zip(bounds[:-1], bounds[1:], layer_sizes, strict=True)]


class CudaLayerContexts:
    """``cuda_layer_contexts`` for one model, keeping its hyperplanes cut for the int8
    products (``gln.kernels.int8_gating.Int8PlanesCache``) from its first long chunk on."""

    def __init__(self) -> None:
        self._int8_planes = Int8PlanesCache()

    @property
    def nbytes(self) -> int:
        """Bytes of the hyperplanes' int8 cut (0 until a long chunk makes it)."""
        return self._int8_planes.nbytes

    def __call__(
        self, z: Any, normals: Any, offsets: Any, context_dim: int, num_glns: int,
        layer_sizes: Sequence[int],
    ) -> list[Any]:
        # Keyed by the model's own arrays, as given: those are the ones a restore replaces.
        planes = functools.partial(self._int8_planes.planes, normals, offsets)
        return cuda_layer_contexts(z, normals, offsets, context_dim, num_glns, layer_sizes,
                                   planes)


@dataclass(frozen=True)
class RecheckList:
    """Where ``gln_halfspace_contexts`` lists the margins it leaves to
    ``gln_halfspace_rechecks``: their flat indices, how many (zeroed by the launch that makes
    the rows' bounds, ``launch_rounding_tolerances`` or ``int8_products``, given ``count``),
    room for how many."""

    pending: Any
    count: Any
    capacity: int


def recheck_list(margins: int) -> RecheckList:
    """A list with room for one in ``RECHECK_LIST_FRACTION`` of ``margins`` (plus
    ``RECHECK_LIST_MIN``), its count not yet zeroed: the rows' bounds' launch zeroes it."""
    cp = _cupy()
    capacity = margins // RECHECK_LIST_FRACTION + RECHECK_LIST_MIN
    return RecheckList(cp.empty(capacity, dtype=cp.int64), cp.empty(1, dtype=cp.int32), capacity)


def launch_rounding_tolerances(z: Any, tolerance: Any, pending_count: Any = None) -> None:
    """Each row's rounding bound into ``tolerance`` (n,) float32 (``gln_rounding_tolerances``),
    and ``pending_count`` (a ``RecheckList``'s count) zeroed when given."""
    n, d = z.shape
    function("gating.cu", "gln_rounding_tolerances")(
        (-(-n * WARP // GATING_THREADS),), (GATING_THREADS,),
        (z, np.int32(n), np.int32(d), np.float64(2.0 * dot_rounding_bound(d)), tolerance,
         pending_count),
    )


def launch_halfspace_contexts(
    products: Any, z: Any, normals: Any, offsets: Any, tolerance: Any, context_dim: int,
    layer_sizes: Sequence[int], contexts: Any, rechecks: RecheckList | None,
) -> None:
    """Every context into ``contexts`` (``gln_halfspace_contexts`` on float32 ``products``, or
    the kernel of products that make their own float32 estimates, such as
    ``gln.kernels.int8_gating.Int8Products``); the close margins are listed in ``rechecks``, or
    re-checked in place where it is None."""
    cp = _cupy()
    n, d = z.shape
    neurons = normals.shape[0] // context_dim
    if rechecks is None:  # the kernel takes the pointers but, with no room, never uses them
        rechecks = RecheckList(cp.empty(1, dtype=cp.int64), cp.empty(1, dtype=cp.int32), 0)
    own_estimates = hasattr(products, "contexts_kernel")  # e.g. Int8Products
    kernel = products.contexts_kernel if own_estimates else "gln_halfspace_contexts"
    leading = products.contexts_arguments if own_estimates else (products,)
    function("gating.cu", kernel)(
        (-(-n * neurons // GATING_THREADS),), (GATING_THREADS,),
        (*leading, z, normals, offsets, tolerance, np.int32(n), np.int32(neurons),
         np.int32(context_dim), np.int32(d), *_layer_arguments(layer_sizes, z.device.id),
         contexts, rechecks.pending, np.int32(rechecks.capacity), rechecks.count),
    )


def launch_halfspace_rechecks(
    z: Any, normals: Any, offsets: Any, context_dim: int, layer_sizes: Sequence[int],
    contexts: Any, rechecks: RecheckList,
) -> None:
    """The listed margins settled in float64, their bits set in ``contexts``
    (``gln_halfspace_rechecks``, a warp per margin)."""
    n, d = z.shape
    neurons = normals.shape[0] // context_dim
    function("gating.cu", "gln_halfspace_rechecks")(
        (min(-(-rechecks.capacity * WARP // GATING_THREADS), RECHECK_MAX_BLOCKS),),
        (GATING_THREADS,),
        (rechecks.pending, rechecks.count, np.int32(rechecks.capacity), z, normals, offsets,
         np.int32(n), np.int32(neurons), np.int32(context_dim), np.int32(d),
         *_layer_arguments(layer_sizes, z.device.id), contexts),
    )


def _layer_arguments(layer_sizes: Sequence[int], device_id: int) -> tuple[Any, np.int32]:
    """The gating kernels' ``layer_starts`` and ``layers``."""
    return _layer_starts(tuple(layer_sizes), device_id), np.int32(len(layer_sizes))


def _gating_products_and_bounds(
    z: Any, normals: Any, offsets: Any, pending_count: Any = None,
    int8_planes: Callable[[], Any] | None = None,
) -> tuple[Any, Any]:
    """The margins' products (n, P), float32 or ``Int8Products``, and each row's bound of
    their float32 error (n,), by ``GATING_PRODUCT`` for long chunks: what
    ``launch_halfspace_contexts`` takes; ``pending_count`` zeroed when given; the int8
    products' planes from ``int8_planes()`` when given."""
    if GATING_PRODUCT not in ("float32", "int8"):
        raise ValueError(f"GATING_PRODUCT is 'float32' or 'int8', not {GATING_PRODUCT!r}")
    # cuBLAS's int8 GEMMs want the planes (the results' leading dimension) a multiple of 4.
    if (GATING_PRODUCT == "int8" and z.shape[0] >= max(GATING_GEMM_MIN_ROWS, INT8_GATING_MIN_ROWS)
            and normals.shape[0] % 4 == 0):
        planes = int8_planes() if int8_planes is not None else None
        return int8_products(z, normals, offsets, pending_count, planes)
    products = _gating_products(z, normals)
    tolerance = _cupy().empty(z.shape[0], dtype=np.float32)
    launch_rounding_tolerances(z, tolerance, pending_count)
    return products, tolerance


def _gating_products(z: Any, normals: Any) -> Any:
    """z @ normals.T in float32, (n, P): cuBLAS for long chunks, one launch of ours for short."""
    n, d = z.shape
    if n >= GATING_GEMM_MIN_ROWS:
        return z @ normals.T
    planes = normals.shape[0]
    products = _cupy().empty((n, planes), dtype=np.float32)
    function("gating.cu", "gln_halfspace_products")(
        (-(-n * planes * WARP // GATING_THREADS),), (GATING_THREADS,),
        (z, normals, np.int32(n), np.int32(planes), np.int32(d), products),
    )
    return products


@functools.cache
def _layer_starts(layer_sizes: tuple[int, ...], device_id: int) -> Any:
    """The layers' first neurons and the total, (L + 1,) int32 on the device (kept, not resent)."""
    cp = _cupy()
    with cp.cuda.Device(device_id):
        return cp.asarray(np.cumsum([0, *layer_sizes]), dtype=np.int32)


def cuda_standardize(
    rows: Any, counts: Any, sums: Any, sums_sq: Any, min_std: float, logit_cap: float,
    shift: Any = None,
) -> tuple[Any, Any]:
    """``gln.scaling.standardized`` in one launch, bit for bit: z and clipped logits, float32.

    ``rows`` (n, d) as ``_kernel_rows`` takes them; ``counts`` (n, 1) and ``sums``,
    ``sums_sq`` (n, d) are the statistics (of ``rows - shift``) before each row, or (1, 1) and
    (1, d) for one frozen set.
    """
    cp = _cupy()
    rows, kind = _kernel_rows(rows)
    n, d = rows.shape
    shift = _shift_or_zeros(shift, d)
    stats_rows = counts.shape[0]
    z = cp.empty((n, d), dtype=cp.float32)
    base_logits = cp.empty((n, d), dtype=cp.float32)
    if z.size:
        function("scaling.cu", "gln_standardize" + kind)(
            (-(-z.size // SCALING_THREADS),), (SCALING_THREADS,),
            (rows, shift, cp.ascontiguousarray(counts, dtype=cp.float64),
             cp.ascontiguousarray(sums, dtype=cp.float64),
             cp.ascontiguousarray(sums_sq, dtype=cp.float64), np.int32(n), np.int32(d),
             np.int32(stats_rows), np.float64(min_std), np.float64(logit_cap), z, base_logits),
        )
    return z, base_logits


def _kernel_rows(rows: Any) -> tuple[Any, str]:
    """A chunk's rows as the scaling and moments kernels read them, and the suffix of the
    kernels' names that read them so: float32 rows as they are (``_f32``, each value read as
    the float64 it equals, so the results are those of the widened rows, bit for bit; a long
    chunk's rows arrive so, and are not widened by a launch of their own), others as
    C-contiguous float64 ("")."""
    cp = _cupy()
    if rows.dtype == cp.float32:
        return cp.ascontiguousarray(rows), "_f32"
    return cp.ascontiguousarray(rows, dtype=cp.float64), ""


def _shift_or_zeros(shift: Any, num_features: int) -> Any:
    """The running sums' shift as the kernels read it: C-contiguous float64 (d,), zeros for
    sums of the rows themselves (None)."""
    cp = _cupy()
    if shift is None:
        return cp.zeros(num_features, dtype=cp.float64)
    if shift.dtype != cp.float64 or shift.shape != (num_features,) or not shift.flags.c_contiguous:
        raise ValueError(f"shift must be C-contiguous float64 of shape ({num_features},), got "
                         f"{shift.dtype} of shape {tuple(shift.shape)}")
    return shift


def cuda_unit_scaling(
    rows: Any, counts: Any, sums: Any, sums_sq: Any, min_std: float, pred_clip: float,
    want_z: bool = True,
) -> tuple[Any, Any]:
    """``gln.scaling.unit_scaled`` in one launch, one warp per row: z (None unless ``want_z``)
    and the logits of the clipped inputs, float32; rows and statistics as for
    ``cuda_standardize``."""
    cp = _cupy()
    rows, kind = _kernel_rows(rows)
    n, d = rows.shape
    base_logits = cp.empty((n, d), dtype=cp.float32)
    z = cp.empty((n, d) if want_z else 1, dtype=cp.float32)  # 1: a placeholder, never written
    if base_logits.size:
        function("scaling.cu", "gln_unit_scaling" + kind)(
            (-(-n * WARP // SCALING_THREADS),), (SCALING_THREADS,),
            (rows, cp.ascontiguousarray(counts, dtype=cp.float64),
             cp.ascontiguousarray(sums, dtype=cp.float64),
             cp.ascontiguousarray(sums_sq, dtype=cp.float64), np.int32(n), np.int32(d),
             np.int32(counts.shape[0]), np.float64(min_std), np.float64(pred_clip),
             np.int32(bool(want_z)), z, base_logits),
        )
    return (z if want_z else None), base_logits


def flag_nonfinite(rows32: Any, flag: Any) -> None:
    """Sets ``flag`` (one int32 on the device) to 1 if float32 ``rows32`` (n, d) hold a value
    that is not finite; leaves it otherwise, so one flag serves a call's chunks."""
    n, d = rows32.shape
    if n * d:
        function("scaling.cu", "gln_flag_nonfinite")(
            (min(-(-n * d // SCALING_THREADS), NONFINITE_MAX_BLOCKS),), (SCALING_THREADS,),
            (rows32, np.int32(n), np.int32(d), flag))


def cuda_layer_inputs(values: Any, bias_logit: float, from_probs: bool) -> Any:
    """``gln.network.with_bias`` in one launch: (n, G, K) -> (n, G, K + 1) float32."""
    cp = _cupy()
    values = cp.ascontiguousarray(values, dtype=cp.float32)
    n, groups, width = values.shape
    inputs = cp.empty((n, groups, width + 1), dtype=cp.float32)
    if inputs.size:
        function("layer_inputs.cu", "gln_layer_inputs")(
            (-(-inputs.size // INPUTS_THREADS),), (INPUTS_THREADS,),
            (values, np.int32(n), np.int32(groups), np.int32(width), np.int32(bool(from_probs)),
             np.float32(bias_logit), inputs),
        )
    return inputs


def cuda_per_row_side_info(rows: Any, blur: tuple[Any, Any] | None) -> Any:
    """``gln.scaling.per_row_side_info`` in one launch, float32 (n, d); one warp per row.

    ``rows`` as ``_kernel_rows`` takes them; ``blur`` is (B_rows, B_cols) for image rows, or
    None. A row's result does not depend on the other rows of the chunk (no batched GEMM), so
    chunks equal single rows byte for byte.
    """
    cp = _cupy()
    rows, kind = _kernel_rows(rows)
    n, d = rows.shape
    if blur is None:
        height, width = 1, d
        blur_rows = blur_cols = cp.empty(1, dtype=cp.float64)  # not read
    else:
        blur_rows, blur_cols = (cp.ascontiguousarray(b, dtype=cp.float64) for b in blur)
        height, width = blur_rows.shape[0], blur_cols.shape[0]
    z = cp.empty((n, d), dtype=cp.float32)
    if z.size:
        scratch = cp.empty((n, 2 * d), dtype=cp.float64)
        function("scaling.cu", "gln_per_row_side_info" + kind)(
            (-(-n * WARP // SCALING_THREADS),), (SCALING_THREADS,),
            (rows, np.int32(n), np.int32(height), np.int32(width), np.int32(blur is not None),
             blur_rows, blur_cols, scratch, z),
        )
    return z
