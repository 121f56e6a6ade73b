"""A chunk's way to the model's device and back, shaped for a GPU, where every copy and
launch costs microseconds of its own.

What the host adds to a chunk (the rows of a short chunk widened to float64, the example count
before it, the learning rates and one-vs-all targets) is staged in one host buffer and sent in
one copy (``Staging.staged``, ``Staging.unpacked``). The device's work for a staged chunk
(``Staging.chunk_on_device``, by ``gln.pipeline``) reads and writes only device arrays, so a
short call's launches can be captured once as a CUDA graph and replayed
(``Staging.replayed``, ``gln.kernels.replay``). A long prediction goes in chunks, each sent on
a copy stream while the device predicts the one before (``Staging.predicted_by_chunk``,
``gln.kernels.uploads``), and the outputs come back in one copy at the end
(``Staging.fetched``). A CPU model stages its chunks the same way; its copies are none.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from gln import checks
from gln.backend import to_numpy
from gln.config import Config
from gln.kernels import uploads as uploads_module
from gln.kernels.replay import CallReplays
from gln.kernels.uploads import ChunkUploads, travelling_dtype
from gln.pipeline import Pipeline
from gln.scaling import RunningMoments
from gln.state import State

PREDICT_CHUNK_ROWS_GPU = 2048  # a long prediction's chunks: each sent while the one before runs
# A long float32 prediction's first chunk, so the device starts sooner (None: a full chunk).
PREDICT_FIRST_CHUNK_ROWS: int | None = None
HOST_WIDENED_ROWS = 64  # chunks up to it travel widened to float64, in one copy with their rates


class Staging:
    """A model's chunks packed, sent, run on its device (``pipeline``) against its ``state``,
    and their outputs fetched. ``schedule`` gives the learning rates of the examples learned:
    the configuration's, or a call's evaluation of it (``gln.schedules.Evaluated``)."""

    def __init__(self, config: Config, pipeline: Pipeline, state: State) -> None:
        self.config, self.pipeline, self.state = config, pipeline, state
        self.schedule = config.schedule
        # Short calls on the GPU: captured once, then replayed (gln.kernels.replay). The
        # "unit_fixed" scaling is array code (no kernel of its own), which a graph cannot
        # capture: its short calls run as they are.
        # Nor are those of given side information, which travels beside the staged buffer.
        self.replays = (CallReplays() if pipeline.device == "cuda" and config.use_kernels
                        and config.input_scaling != "unit_fixed"
                        and config.side_info != "given" else None)

    def staged(self, X32: np.ndarray, labels: np.ndarray | None) -> np.ndarray:
        """What a chunk sends to the device, as one host buffer: its rows widened to float64
        (chunks of at most ``HOST_WIDENED_ROWS``), the example count before it (float64), and
        its learning rates (n,) and one-vs-all targets (n, G) as float32, zero when not
        learning.

        A short chunk goes in one copy, its rows widened here (exactly): each copy to a GPU,
        and each launch that would widen the rows there, costs microseconds of its own, which
        a single-example call feels. A long chunk's rows travel as float32, half the bytes,
        which the GPU's kernels read as they are.
        """
        n, d = X32.shape
        glns, state = self.config.num_glns, self.state
        rows_bytes = 8 * n * d if n <= HOST_WIDENED_ROWS else 0
        host = np.zeros(rows_bytes + 8 + 4 * n * (1 + glns), dtype=np.uint8)
        wide = host[:rows_bytes + 8].view(np.float64)  # the rows when staged, then the count
        if rows_bytes:
            wide[:-1] = X32.reshape(-1)
        wide[-1] = state.moments.count
        if labels is not None:
            rates_and_targets = host[rows_bytes + 8:].view(np.float32)
            first = state.examples_seen + 1
            rates_and_targets[:n] = self.schedule(np.arange(first, first + n))
            if glns == 1:
                rates_and_targets[n:] = labels == 1
            else:
                rates_and_targets[n:] = (labels[:, None] == np.arange(glns)).ravel()
        return host

    def unpacked(self, packed: Any, rows32: Any, n: int) -> tuple[Any, Any, Any, Any]:
        """Views of a staged chunk on the device: rows (n, d) float64, or ``rows32`` when
        given (as they are where the scaling kernels read float32 rows, else widened), count
        (1, 1) float64, rates (n,) and targets (n, G) float32."""
        xp, d = self.pipeline.xp, self.config.num_features
        rows_bytes = 0 if rows32 is not None else 8 * n * d
        wide = packed[:rows_bytes + 8].view(xp.float64)
        if rows32 is None:
            rows = wide[:-1].reshape(n, d)
        else:
            rows = rows32 if self.pipeline.scales_float32_rows else rows32.astype(xp.float64)
        count = wide[-1:].reshape(1, 1)
        small = packed[rows_bytes + 8:].view(xp.float32)
        return rows, count, small[:n], small[n:].reshape(n, self.config.num_glns)

    def sent(
        self, X32: np.ndarray, labels: np.ndarray | None, uploads: ChunkUploads | None = None
    ) -> tuple[Any, Any]:
        """A chunk on the model's device: its staged buffer and, for a chunk too long to have
        its rows staged, the rows as float32 (sent by ``uploads`` when given; they may then be
        float64 rows, rounded on the way)."""
        xp = self.pipeline.xp
        if len(X32) <= HOST_WIDENED_ROWS:
            rows32 = None
        else:
            rows32 = uploads.send(X32) if uploads is not None else xp.asarray(X32)
        return xp.asarray(self.staged(X32, labels)), rows32

    def run_chunk(
        self, X32: np.ndarray, labels: np.ndarray | None, uploads: ChunkUploads | None = None,
        side_info: np.ndarray | None = None,
    ) -> Any:
        """One chunk through the network; learns when labels are given. Returns (n, G) on the
        model's device. A call of several chunks sends their rows by ``uploads``; the chunk's
        given side information (n, s) float32, if any, goes in a copy of its own."""
        n, state = len(X32), self.state
        packed, rows32 = self.sent(X32, labels, uploads)
        given = None if side_info is None else self.pipeline.xp.asarray(side_info)
        outputs, state.moments = self.chunk_on_device(packed, rows32, n, labels is not None,
                                                      given)
        if uploads is not None:
            uploads.consumed()
        if labels is not None:
            state.examples_seen += n
        return outputs

    def chunk_on_device(
        self, packed: Any, rows32: Any, n: int, learning: bool, side_info: Any = None
    ) -> tuple[Any, RunningMoments]:
        """The device's work for a chunk staged by ``staged`` (its float32 rows ``rows32``
        when they were not staged): outputs (n, G) and the moments after the chunk.

        Reads and writes only device arrays (the weights and, on the GPU, the moments' totals
        in place) and changes nothing on the host, so a call's launches can be captured.
        """
        rows, count, rates, targets = self.unpacked(packed, rows32, n)
        return self.pipeline.outputs(self.state, rows, count, rates, targets, learning,
                                     side_info)

    def replayed(self, X32: np.ndarray, labels: np.ndarray | None) -> np.ndarray | None:
        """``run_chunk``'s outputs, on the host, from the call's captured graph, or None if it
        has none (yet), or if its rows do not travel staged with its rates (more than
        ``HOST_WIDENED_ROWS``), as a replay's must."""
        n, learning = len(X32), labels is not None
        if n > HOST_WIDENED_ROWS:
            return None
        state = self.state
        outputs = self.replays.replayed(
            (n, learning), state.device_arrays, self.staged(X32, labels),
            lambda packed: self.chunk_on_device(packed, None, n, learning)[0],
        )
        if outputs is not None and learning:  # the graph updated the totals in place
            m = state.moments
            state.moments = RunningMoments(m.count + n, m.total, m.total_sq)
            state.examples_seen += n
        return outputs

    def predicted_by_chunk(self, X: np.ndarray) -> np.ndarray:
        """The network's outputs (n, G) for a long host batch on the GPU, in chunks, each sent
        while the device predicts the one before (on a copy stream of their own,
        ``gln.kernels.uploads``).

        The rows of a float32 or float64 batch are rounded to float32 as they are staged (the
        rounding ``check_input`` makes) and checked by the device: a value that is not finite,
        or beyond float32's range, is not finite there. Two passes of the host over the rows
        cost about as much as the device's work on them. Integer rows whose every value is a
        float32 (pixels as uint8) need no check and travel in their own bytes, widened by the
        device (``travelling_dtype``). Those of other batches are checked by the host
        (``gln.checks.checked_features``), chunk by chunk. Prediction changes nothing, so a bad
        value found late loses nothing: the error is the whole batch's host check's, naming
        its first bad value. With
        ``gln.kernels.uploads.STAGE_AHEAD``, rows that travel as float32 get each next chunk
        staged while the host launches the chunk before (a quarter of the bytes, pixels as
        uint8 stage too quickly for the hand-off to pay), and the first chunk of such rows is
        ``PREDICT_FIRST_CHUNK_ROWS`` long where set."""
        from gln.kernels.cuda import flag_nonfinite  # noqa: PLC0415 - GPU models only

        xp, d = self.pipeline.xp, self.config.num_features
        travelling = travelling_dtype(X.dtype) if X.shape[1] == d else None
        staged_raw, device_checked = travelling is not None, travelling == np.float32
        full = PREDICT_CHUNK_ROWS_GPU
        outputs, flagged = [], False
        nonfinite = xp.zeros(1, dtype=xp.int32) if device_checked else None  # set by the device
        sending = (ChunkUploads(full, d, travelling, source=X) if staged_raw
                   else contextlib.nullcontext())
        first = PREDICT_FIRST_CHUNK_ROWS if device_checked else None
        chunks = [X[start:stop] for start, stop in chunk_bounds(len(X), full, first)]
        # Sent as they are (through ``uploads``): checked by the device, or needing no check.
        as_they_are = [staged_raw and len(rows) > HOST_WIDENED_ROWS for rows in chunks]
        with sending as uploads:
            for index, rows in enumerate(chunks):
                checked_here = not as_they_are[index]
                if checked_here:
                    try:
                        rows = checks.checked_features(rows, d)
                    except ValueError:
                        checks.checked_features(X, d)
                        raise
                packed, rows32 = self.sent(rows, None, uploads)
                next_as_it_is = index + 1 < len(chunks) and as_they_are[index + 1]
                if uploads_module.STAGE_AHEAD and device_checked and next_as_it_is:
                    uploads.stage_ahead(chunks[index + 1])
                if device_checked and not checked_here:
                    flag_nonfinite(rows32, nonfinite)
                    flagged = True
                outputs.append(self.chunk_on_device(packed, rows32, len(rows), False)[0])
                if uploads is not None:
                    uploads.consumed()
            if flagged and int(nonfinite.get()[0]):
                checks.checked_features(X, d)  # raises, naming the first value not finite
            return self.fetched(outputs)

    def fetched(self, outputs: list[Any]) -> np.ndarray | None:
        """The chunks' outputs on the host, in one copy after the last chunk: until then the
        host prepares each next chunk while the device still runs the one before."""
        if not outputs:
            return None
        return to_numpy(outputs[0] if len(outputs) == 1 else self.pipeline.xp.concatenate(outputs))


def chunk_bounds(n: int, size: int, first: int | None = None) -> list[tuple[int, int]]:
    """Row ranges of the chunks ``n`` rows are processed in (invisible in the results):
    ``size`` rows each, after a first chunk of ``first`` rows where that is shorter than
    ``size`` and than ``n``."""
    head = first if first and first < min(size, n) else 0
    return ([(0, head)] if head else []) + [(start, min(start + size, n))
                                           for start in range(head, n, size)]
