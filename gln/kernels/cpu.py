"""The CPU kernel: Algorithm 1 for one layer over a chunk, compiled with Numba.

Shaped for the cache: each thread owns whole neurons, four of a GLN at a time (they share each
read of an example's inputs), and runs them through every example of the chunk, so a neuron's
weights (2^m rows of I floats; 50 KB for 785 inputs and m = 4) stay in the core's cache for
the whole chunk instead of streaming ~4 MB of active weights per example through memory.
Neurons of a layer are independent given the layer's inputs, so the threads need no
synchronisation, and the result does not depend on the number of threads or on how a stream is
cut into chunks.

The kernel releases the GIL, so a server keeps serving while a model learns. Numba's default
threading layer must not be entered from two Python threads at once, so parallel calls are
serialised by a lock (each already uses every core); a one-thread call (below) never enters
that layer and takes no lock, so two models' small calls run side by side. Small calls (a few
examples of a small network) run on one thread: waking a thread pool costs more than the work,
and far more on a busy machine. They run a one-thread twin of the kernel (``ThreadedKernel``),
compiled from the same Python function without ``parallel``, rather than the parallel kernel
with Numba switched to one thread and back: that switch, taken from Python around each call,
cost more than a small call's arithmetic. Each neuron's loop is the same source in both,
compiled by the same compiler for the same CPU, and the tests hold the two to the same bytes;
since fast-math lets LLVM vectorise each build's sums its own way, a process also checks once
that they agree on its CPU (``layer_pass_twins_agree``) and runs only the parallel kernel where
they do not, so the results never depend on the thread count or on how a stream is cut into
calls.
"""

from __future__ import annotations

import functools
import threading
import types
from collections.abc import Callable
from typing import Any

import numba
import numpy as np

_LOCK = threading.Lock()

PARALLEL_MIN_WORK = 100_000  # multiply-adds below which one thread works: waking others costs more


class ThreadedKernel:
    """A parallel Numba kernel (``parallel``) and its one-thread twin (``one_thread``), both
    compiled from one Python function; calling it runs the twin that suits the work (the
    parallel one under the kernel lock).

    The twin is Numba's compilation of the same function without ``parallel`` (``prange`` is
    then ``range``): no thread pool to wake, and no thread count to switch. It is compiled from
    a copy of the function under another name, so that Numba's cache keeps the two apart (the
    cache tells kernels apart by name and bytecode, not by their options).
    """

    def __init__(self, func: Callable[..., Any], **options: Any) -> None:
        self.parallel = numba.njit(parallel=True, **options)(func)
        twin = types.FunctionType(func.__code__, func.__globals__, f"{func.__name__}_one_thread",
                                  func.__defaults__, func.__closure__)
        twin.__qualname__ = f"{func.__qualname__}_one_thread"
        twin.__doc__ = func.__doc__
        self.one_thread = numba.njit(**options)(twin)

    @property
    def dispatchers(self) -> tuple[Any, Any]:
        """The two compiled kernels (Numba dispatchers)."""
        return self.parallel, self.one_thread

    def __call__(self, work: int, *args: Any) -> Any:
        """Run the kernel on ``args``: on one thread when ``work`` (multiply-adds) is below
        ``PARALLEL_MIN_WORK``, else on Numba's threads (under the lock: see the module)."""
        if work < PARALLEL_MIN_WORK:  # never enters the threading layer: needs no lock
            return self.one_thread(*args)
        with _LOCK:
            return self.parallel(*args)


def threaded_kernel(**options: Any) -> Callable[[Callable[..., Any]], ThreadedKernel]:
    """Decorator: a ``ThreadedKernel`` of the function, compiled with Numba ``options``."""
    return lambda func: ThreadedKernel(func, **options)


_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}
NEURONS_PER_BLOCK = 4  # neurons of a GLN that read each example's inputs once, together


@threaded_kernel(nogil=True, cache=True, fastmath=_FASTMATH)
def _layer_pass(weights, contexts, inputs, targets, rates, pred_clip, weight_clip, learn, probs):
    n = contexts.shape[0]
    num_glns, num_neurons, _, _ = weights.shape
    shared_inputs = inputs.shape[1] == 1
    eps = np.float32(pred_clip)
    bound = np.float32(weight_clip)
    blocks = (num_neurons + NEURONS_PER_BLOCK - 1) // NEURONS_PER_BLOCK
    for block in numba.prange(num_glns * blocks):
        g = block // blocks
        k0 = (block - g * blocks) * NEURONS_PER_BLOCK
        source = 0 if shared_inputs else g
        if k0 + NEURONS_PER_BLOCK <= num_neurons:
            for t in range(n):
                x = inputs[t, source]
                w0 = weights[g, k0, contexts[t, g, k0]]
                w1 = weights[g, k0 + 1, contexts[t, g, k0 + 1]]
                w2 = weights[g, k0 + 2, contexts[t, g, k0 + 2]]
                w3 = weights[g, k0 + 3, contexts[t, g, k0 + 3]]
                m0, m1, m2, m3 = _mix4(w0, w1, w2, w3, x)
                p0, p1 = _clipped_sigmoid(m0, eps), _clipped_sigmoid(m1, eps)
                p2, p3 = _clipped_sigmoid(m2, eps), _clipped_sigmoid(m3, eps)
                probs[t, g, k0], probs[t, g, k0 + 1] = p0, p1
                probs[t, g, k0 + 2], probs[t, g, k0 + 3] = p2, p3
                if learn:  # each neuron's step: eta * (p - target)
                    rate, target = rates[t], targets[t, g]
                    _update4(w0, w1, w2, w3, x, rate * (p0 - target), rate * (p1 - target),
                             rate * (p2 - target), rate * (p3 - target), bound)
        else:  # the last neurons of a layer whose size is no multiple of the block
            for k in range(k0, num_neurons):
                for t in range(n):
                    w = weights[g, k, contexts[t, g, k]]
                    x = inputs[t, source]
                    p = _clipped_sigmoid(_mix(w, x), eps)
                    probs[t, g, k] = p
                    if learn:
                        _update(w, x, rates[t] * (p - targets[t, g]), bound)


@numba.njit(inline="always", fastmath=_FASTMATH)
def _clipped_sigmoid(mixed, eps):
    """clip(sigmoid(w . x), eps, 1 - eps): a neuron's prediction (Algorithm 1)."""
    one = np.float32(1.0)
    return min(max(one / (one + np.exp(-mixed)), eps), one - eps)


@numba.njit(inline="always", fastmath=_FASTMATH)
def _mix(w, x):
    """w . x: the logit of a neuron's geometric mixture of its inputs."""
    mixed = np.float32(0.0)
    for j in range(x.shape[0]):
        mixed += w[j] * x[j]
    return mixed


@numba.njit(inline="always", fastmath=_FASTMATH)
def _mix4(w0, w1, w2, w3, x):
    """``_mix`` of four neurons' active rows with the same inputs, each input read once."""
    m0 = m1 = m2 = m3 = np.float32(0.0)
    for j in range(x.shape[0]):
        xj = x[j]
        m0 += w0[j] * xj
        m1 += w1[j] * xj
        m2 += w2[j] * xj
        m3 += w3[j] * xj
    return m0, m1, m2, m3


@numba.njit(inline="always", fastmath=_FASTMATH)
def _update(w, x, step, bound):
    """w <- clip(w - step * x, -b, b): the OGD step and the projection onto [-b, b]."""
    for j in range(x.shape[0]):
        w[j] = min(max(w[j] - step * x[j], -bound), bound)


@numba.njit(inline="always", fastmath=_FASTMATH)
def _update4(w0, w1, w2, w3, x, s0, s1, s2, s3, bound):
    """``_update`` of four neurons' active rows with the same inputs, each input read once."""
    for j in range(x.shape[0]):
        xj = x[j]
        w0[j] = min(max(w0[j] - s0 * xj, -bound), bound)
        w1[j] = min(max(w1[j] - s1 * xj, -bound), bound)
        w2[j] = min(max(w2[j] - s2 * xj, -bound), bound)
        w3[j] = min(max(w3[j] - s3 * xj, -bound), bound)


def cpu_layer_pass(
    weights: np.ndarray, contexts: np.ndarray, inputs: np.ndarray, targets: np.ndarray,
    rates: np.ndarray, pred_clip: float, weight_clip: float, learn: bool, probs: np.ndarray,
) -> None:
    """See ``gln.network.LayerPass``; arrays must be C-contiguous NumPy arrays.

    Deviates from ``gln.network.reference_layer_pass`` in the order of its work: each thread
    runs whole neurons (four of a GLN sharing each read of an input) through every example,
    not every neuron through one example at a time; its fast-math sums agree with the
    reference to float32 rounding, and with themselves byte for byte however a stream is cut.
    """
    work = contexts.size * weights.shape[3]
    if work < PARALLEL_MIN_WORK and not layer_pass_twins_agree():
        work = PARALLEL_MIN_WORK  # the parallel kernel only: the bits must not depend on size
    # The clips go as float64, rounded to float32 in the kernel (the same rounding as
    # np.float32's, which costs more here than the rest of a small call's set-up).
    _layer_pass(work, weights, contexts, inputs, targets, rates, float(pred_clip),
                float(weight_clip), bool(learn), probs)


@functools.cache
def layer_pass_twins_agree() -> bool:
    """Whether the layer pass's one-thread twin gives its parallel kernel's bytes on this CPU.

    The two are compiled apart from one source with fast-math reassociation, so their sums
    agree only if LLVM vectorises each neuron's loops the same way in both builds: true where
    the tests run, not promised everywhere. Checked once per process, on a layer whose sizes
    leave vector remainders, learning and predicting; where they differ, every call runs the
    parallel kernel, so that a stream learned in calls of any size gives the same bytes.
    """
    rng = np.random.default_rng(0)
    glns, neurons, contexts, inputs, n = 2, 9, 16, 77, 5
    weights = rng.uniform(-0.2, 0.2, (glns, neurons, contexts, inputs)).astype(np.float32)
    ctx = rng.integers(0, contexts, (n, glns, neurons)).astype(np.int32)
    x = rng.normal(0, 2, (n, glns, inputs)).astype(np.float32)
    targets = rng.integers(0, 2, (n, glns)).astype(np.float32)
    rates = rng.uniform(0.001, 0.1, n).astype(np.float32)
    results = []
    for kernel in _layer_pass.dispatchers:
        w, probs = weights.copy(), np.empty((n, glns, neurons), np.float32)
        with _LOCK:
            kernel(w, ctx, x, targets, rates, 0.01, 5.0, True, probs)
        results.append(w.tobytes() + probs.tobytes())
    return results[0] == results[1]


# No fastmath here: the float64 sums must run in a fixed order.
@numba.njit(nogil=True, cache=True, inline="always")
def exact_dot(row, normal):
    """``row . normal`` summed in float64 in index order: the re-check of a close decision."""
    total = 0.0
    for i in range(row.shape[0]):
        total += np.float64(row[i]) * np.float64(normal[i])
    return total


@numba.njit(nogil=True, cache=True)
def _exact_dots(z, normals, rows, planes, out):
    for k in range(rows.shape[0]):
        out[k] = exact_dot(z[rows[k]], normals[planes[k]])


def cpu_exact_dots(
    z: np.ndarray, normals: np.ndarray, rows: np.ndarray, planes: np.ndarray
) -> np.ndarray:
    """``gln.gating.exact_dots`` without gathering float64 copies of the rows it needs."""
    out = np.empty(rows.shape[0], dtype=np.float64)
    _exact_dots(z, normals, rows, planes, out)
    return out
