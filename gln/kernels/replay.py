"""Short GPU calls captured once as a CUDA graph and replayed.

A one-row learn on the GPU is a dozen launches and allocations, each of which costs the host
microseconds of Python and driver work: the call is bound by the host, not by the device.
Its launches have the same arguments on every call of that shape (the weights and running
totals are updated in place, and what changes from call to call, the rows, learning rates,
targets and example count, is read from one staged buffer), so they can be recorded once as
a CUDA graph. A replay is then one copy of the staged buffer in, one graph launch and one copy
out, with the same kernels and therefore the same bytes.

The graph holds the addresses of the model's arrays: a model whose arrays are replaced (a
restore) has its graphs captured again. Memory a graph uses comes from a pool of its own, so
nothing else is ever given a buffer that a replay writes. A model's replays share that
buffer and its outputs, so they take turns: two threads may still predict with one model at
once, as they may with calls that are not replayed. If a capture fails, the model warns once
and runs every call as before.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gln.backend import import_cupy as _cupy
from gln.backend import side_stream

# Calls of at most this many rows are replayed, one graph per row count and verb. Below
# gln.kernels.cuda.GATING_GEMM_MIN_ROWS, so a captured call launches only our kernels.
REPLAY_MAX_ROWS = 8

_CAPTURE_LOCK = threading.Lock()  # one capture at a time on the shared capture stream


@dataclass
class _CapturedCall:
    """A captured call: its graph, the buffer it reads and the array it writes."""

    graph: Any
    staged: Any  # device buffer the host's staged bytes are copied into
    outputs: Any  # device array the graph writes the call's outputs to
    pool: Any  # the memory pool every array the graph uses came from


class CallReplays:
    """One model's captured short calls, keyed by (rows, learning).

    ``replayed`` returns a call's outputs on the host, or None where the caller must run the
    call itself: the first call of each key (which compiles the kernels and fills the caches
    that a capture must not touch), and every call after a failed capture.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # one replay at a time: they share buffers
        self._captured: dict[tuple[int, bool], _CapturedCall] = {}
        self._state: tuple[Any, ...] = ()
        self._warm: set[tuple[int, bool]] = set()
        self.failure: str | None = None

    def replayed(
        self, key: tuple[int, bool], state: tuple[Any, ...], staged: np.ndarray,
        steps: Callable[[Any], Any],
    ) -> np.ndarray | None:
        """The outputs of ``steps(device copy of staged)``, replayed from a graph, on the host.

        ``state``: the device arrays the steps read and write in place; graphs captured with
        other arrays are dropped. ``steps`` must change nothing on the host.
        """
        with self._lock:
            if self.failure is not None:
                return None
            if len(state) != len(self._state) or any(
                a is not b for a, b in zip(state, self._state, strict=True)
            ):
                self._captured.clear()
                self._state = state
            call = self._captured.get(key)
            if call is None:
                if key not in self._warm:
                    self._warm.add(key)
                    return None
                call = self._capture(staged, steps)
                if call is None:
                    return None
                self._captured[key] = call
            call.staged.set(staged)
            call.graph.launch()
            return call.outputs.get()

    def _capture(self, staged: np.ndarray, steps: Callable[[Any], Any]) -> _CapturedCall | None:
        cp = _cupy()
        pool = cp.cuda.MemoryPool()
        stream = side_stream(cp, cp.cuda.Device().id, "capture")  # not the legacy default
        graph = outputs = buffer = None
        try:
            with _CAPTURE_LOCK, cp.cuda.using_allocator(pool.malloc):
                buffer = cp.empty(staged.shape, dtype=staged.dtype)
                with stream:
                    stream.begin_capture()
                    try:
                        outputs = steps(buffer)
                    finally:
                        graph = stream.end_capture()
        except Exception as error:  # noqa: BLE001 - any failure: run the calls uncaptured
            self.failure = f"{type(error).__name__}: {error}"
            warnings.warn(f"GPU calls of up to {REPLAY_MAX_ROWS} rows will not be replayed "
                          f"from a CUDA graph (capture failed: {self.failure})", RuntimeWarning,
                          stacklevel=4)
            return None
        return _CapturedCall(graph, buffer, outputs, pool)

