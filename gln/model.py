"""The public GLN class: one-vs-all classification, online input scaling, learn/predict.

>>> import numpy as np
>>> from gln import GLN
>>> model = GLN(num_features=2, num_classes=2, layer_sizes=(8, 1), seed=0)
>>> X = np.array([[0.0, 1.0], [1.0, 0.0]] * 50)
>>> y = np.array([1, 0] * 50)
>>> first_pass = model.learn(X, y)          # prequential: predicted before each update
>>> model.predict(X[:2]).tolist()
[1, 0]
>>> model.examples_seen
100
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from tqdm import tqdm

from gln import checks
from gln.backend import to_numpy
from gln.config import ConfigMixin
from gln.kernels.replay import REPLAY_MAX_ROWS
from gln.kernels.uploads import ChunkUploads
from gln.saliency import SaliencyMixin
from gln.scaling import RunningMoments, moments_before_each_row, scale_inputs
from gln.schedules import Evaluated, PerExample
from gln.state import StateMixin

# Rows per kernel call. On the CPU: large enough that a neuron's weights are reused across
# many examples while they sit in cache, small enough that the chunk's projections (rows x
# hyperplanes floats) stay a few MB. On the GPU: large enough to amortise the launches and
# host waits of one chunk.
CHUNK_ROWS = 256
CHUNK_ROWS_GPU = 4096
# learn(progress=True) moves its bar after this many chunks: about a second of MNIST learning
# on two CPU cores, and a few hundredths on a GPU (where each piece waits for the device).
PROGRESS_CHUNKS = 8
# A long batch is predicted on the GPU in chunks of this many rows, each sent while the device
# still predicts the one before: on an H100's host, copying 4,096 MNIST rows in cost 1.5 to 2.2
# ms, a third to a half of what the device takes to predict them. 4,096-row calls predicted
# 609k rows/s in chunks of 2,048, 509k of 1,024, 324k of 512 and 476k in one chunk
# (docs/benchmarks.md).
PREDICT_CHUNK_ROWS_GPU = 2048
# Chunks up to this many rows go to the device already widened to float64, in one copy with
# their rates and targets; longer ones as float32 (see GLN._staged).
HOST_WIDENED_ROWS = 64


class GLN(ConfigMixin, StateMixin, SaliencyMixin):
    """A Gated Linear Network classifier that learns from one example at a time.

    Parameters (the configuration; stored as given, validated once):

    num_features: width of each input row.
    num_classes: 2 gives one binary GLN; more gives one GLN per class (one-vs-all), whose
        outputs are normalised to sum to 1. Each output lies in [eps, 1 - eps], so the surest
        answer of K classes is (1 - eps) / (1 - eps + (K - 1) eps): 0.917 for 10 classes at
        the default eps = 0.01, 0.5 for 100. Many classes want ``pred_clip`` <= 0.1 / K.
    layer_sizes: neurons per layer (at most 64 layers), the last one 1 (the paper's single output
        neuron).
    context_dim: m, hyperplanes per neuron, 1 to 16; each neuron has 2^m weight vectors.
    learning_rate: a number, ``{"schedule": "inverse_time", "scale": s, "cap": c}`` for
        ``min(s / t, c)`` (the paper's MNIST run used scale 100, cap 0.01), or a callable of t
        (a model with one cannot be serialised: ``config``, ``to_bytes``, copies and pickles
        refuse it).
    pred_clip: eps; every prediction is clipped to [eps, 1 - eps]; at least 2**-24 (float32).
    weight_clip: b; weights are projected onto [-b, b] after each update; below 1e6.
    bias: beta, the constant bias input of every layer, in [eps, 1 - eps] and not 0.5;
        the default sigmoid(1) makes its logit exactly 1.
    offset_scale: standard deviation of the hyperplane offsets (the paper: 1).
    input_scaling: ``"standardize"`` or ``"unit"`` (inputs already in [0, 1]); see
        ``gln.scaling``.
    min_std: floor of the standard deviation used in input scaling; a feature whose spread is
        below it is treated as constant. The default 1e-9 standardises features of any
        practical scale (1e-3, the default before, made a feature of spread 1e-4 invisible:
        online log loss 0.685 against 0.304 with 1e-9, which changed scikit-learn's datasets
        by at most 0.001; ``benchmarks/min_std.py``).
    side_info: what the halfspace gating sees: ``"scaled"`` (the scaled inputs, default) or
        ``"per_row"`` (each row centred on its own mean and normalised; see ``gln.scaling``).
    side_info_blur: for ``"per_row"`` with ``image_shape``, the std in pixels of a Gaussian
        blur of the side information (0: none).
    image_shape: (height, width) of rows that are images, height * width = num_features;
        needed only for ``side_info_blur`` and ``gating_window``.
    gating_window: for image rows, the side in pixels of a random square window that each
        hyperplane's normal is kept on (``gln.gating.restrict_to_windows``); 0 (default): the
        whole input, as in the paper.
    seed: seeds the hyperplanes; the same seed and data give the same bytes.
    device: ``"cpu"``, ``"cuda"`` or ``"auto"``.
    """

    def __init__(
        self,
        num_features: int,
        num_classes: int = 2,
        layer_sizes: Sequence[int] = (32, 32, 1),
        context_dim: int = 4,
        learning_rate: Any = 0.01,
        pred_clip: float = 0.01,
        weight_clip: float = 5.0,
        bias: float = 1.0 / (1.0 + math.exp(-1.0)),
        offset_scale: float = 1.0,
        input_scaling: str = "standardize",
        min_std: float = 1e-9,
        side_info: str = "scaled",
        side_info_blur: float = 0.0,
        image_shape: Sequence[int] | None = None,
        gating_window: int = 0,
        seed: int = 0,
        device: str = "cpu",
        use_kernels: bool = True,
    ) -> None:
        self._configure(**{name: value for name, value in locals().items() if name != "self"})
        with self._memory_as_value_error():
            self._init_state()

    # ------------------------------------------------------------------ input checks
    def check_input(
        self, X: Any, y: Any = None, *, strict: bool = False
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Validate a batch; returns (X as float32 (n, d), y as int64 (n,) or None).

        Raises ``ValueError`` naming the problem for a wrong shape, a non-finite value (NaN,
        inf, or a magnitude beyond float32), or a label that is not a class index; with
        ``strict``, also for a value outside [0, 1] when ``input_scaling="unit"`` (learning
        clips those to [eps, 1 - eps]: a pixel sent as 0-255 would count as 1). The service
        checks its clients' rows strictly.
        """
        unit = strict and self.input_scaling == "unit"
        X32 = checks.checked_features(X, self.num_features, unit)
        if y is None:
            return X32, None
        return X32, self.check_labels(y, X32.shape[0])

    def check_labels(self, y: Any, num_rows: int | None = None) -> np.ndarray:
        """Validate labels on their own (int64 (n,)); ``num_rows``: how many there must be.

        Raises ``ValueError`` naming the first label (by its index in ``y``) that is not a
        class index of this model.
        """
        return checks.checked_labels(y, self.num_classes, num_rows)

    # ------------------------------------------------------------------ public verbs
    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities (n, num_classes), rows summing to 1. Does not learn."""
        if (self._device == "cuda" and isinstance(X, np.ndarray) and X.ndim == 2
                and len(X) > PREDICT_CHUNK_ROWS_GPU):
            return self._class_probabilities(self._predicted_by_chunk(X), len(X))
        X32, _ = self.check_input(X)
        return self._class_probabilities(self._outputs(X32, None), len(X32))

    def predict(self, X: Any) -> np.ndarray:
        """The most probable class of each row (n,)."""
        return np.argmax(self.predict_proba(X), axis=1)

    def warm_up(self) -> None:
        """Make the first call as fast as the ones after it; changes nothing the model holds.

        A process's first call loads (or compiles) the kernels, and a CPU model's first short
        call makes its 16-bit copy of the normals: hundreds of milliseconds, which a server
        would otherwise charge to its first request. One prediction of a row of zeros does
        both; a prediction learns nothing, so the model's bytes stay the same.
        """
        self.predict_proba(np.zeros((1, self.num_features), dtype=np.float32))

    def learn(self, X: Any, y: Any, *, progress: bool = False) -> np.ndarray:
        """Learn every row in order, one OGD step per example.

        Returns the class probabilities predicted for each row before its own update
        (prequential predictions), shape (n, num_classes). The result and the final state
        equal those of learning the rows one call at a time. Invalid input raises
        ``ValueError`` before anything is changed. ``progress=True`` shows a progress bar
        (tqdm, on stderr) for a long offline pass; it changes nothing learned.
        """
        if y is None:  # check_input's "no labels": predicting, which learn must not pass for
            raise ValueError("learn needs labels y, one class index per row (predict_proba "
                             "predicts without learning)")
        X32, labels = self.check_input(X, y)
        with self._user_rates_checked(len(X32)):
            if not progress:
                return self._class_probabilities(self._outputs(X32, labels), len(X32))
            return self._learned_with_progress(X32, labels)

    def _learned_with_progress(self, X32: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """``learn``'s result for checked rows, in pieces of a few chunks under a progress
        bar."""
        outputs = []  # on the host: each piece's call waits for its results, so the bar is true
        with tqdm(total=len(X32), unit="example", desc="learn") as bar:
            for start, stop in self._chunk_bounds(len(X32), PROGRESS_CHUNKS * self._chunk_rows):
                outputs.append(self._outputs(X32[start:stop], labels[start:stop]))
                bar.update(stop - start)
        return self._class_probabilities(np.concatenate(outputs) if outputs else None, len(X32))

    # ------------------------------------------------------------------ internals
    @contextlib.contextmanager
    def _user_rates_checked(self, n: int) -> Iterator[None]:
        """For a call learning ``n`` examples: a user's callable schedule evaluated for all of
        them at once (``ValueError`` naming a bad rate before anything is learned), then read
        from that evaluation; nothing to do for the built-in schedules."""
        schedule = self.schedule
        if isinstance(schedule, PerExample):
            first = self.examples_seen + 1
            self.schedule = Evaluated(first, schedule(np.arange(first, first + n)))
        try:
            yield
        finally:
            self.schedule = schedule

    @property
    def _chunk_rows(self) -> int:
        """The device's chunk length: rows per kernel call."""
        return CHUNK_ROWS_GPU if self._device == "cuda" else CHUNK_ROWS

    def _chunk_bounds(self, n: int, size: int | None = None) -> list[tuple[int, int]]:
        """Row ranges of the chunks a batch is processed in (invisible in the results):
        ``size`` rows each, by default the device's chunk length."""
        size = size or self._chunk_rows
        return [(start, min(start + size, n)) for start in range(0, n, size)]

    def _scale(self, x64: Any, count: Any, learning: bool) -> tuple[Any, Any, RunningMoments]:
        """Side information z, base logits, and the moments after the chunk (``count``:
        ``moments.count`` as a (1, 1) float64 array on the model's device)."""
        xp, m, shift = self._xp, self.moments, self.moments_shift
        if learning:
            counts, sums, sums_sq, after = moments_before_each_row(xp, m, x64, count, shift)
        else:
            counts, sums, sums_sq, after = count, m.total[None, :], m.total_sq[None, :], m
        z, base_logits = scale_inputs(
            xp, x64, counts, sums, sums_sq,
            mode=self.input_scaling, pred_clip=self.pred_clip, min_std=self.min_std,
            side_info=self.side_info, blur=self._blur, fused=self._fused_scaling, shift=shift,
        )
        return z, base_logits, after

    def _anchor_moments(self, first_row: np.ndarray) -> None:
        """Take the first row learned as the shift of the running sums (``gln.scaling``: sums
        of ``x - shift`` keep the variance exact where a feature's mean dwarfs its spread).
        In place, so a captured graph reads it."""
        if self.input_scaling == "standardize":
            self.moments_shift[...] = self._xp.asarray(first_row, dtype=self._xp.float64)

    def _contexts(self, z: Any) -> list[Any]:
        return self._layer_contexts(z, self.normals, self.offsets, self.context_dim,
                                    self.num_glns, self.layer_sizes)

    def _outputs(self, X32: np.ndarray, labels: np.ndarray | None) -> np.ndarray | None:
        """The network's outputs (n, G) for a checked batch, on the host; learns when labels
        are given. A short call on the GPU is replayed from its captured graph when it can be."""
        n = len(X32)
        if labels is not None and n and self.moments.count == 0:
            self._anchor_moments(X32[0])
        if self._replays is not None and 0 < n <= REPLAY_MAX_ROWS:
            replayed = self._replayed(X32, labels)
            if replayed is not None:
                return replayed
        chunks = self._chunk_bounds(n)
        several = self._device == "cuda" and len(chunks) > 1
        with (ChunkUploads(max(b - a for a, b in chunks), self.num_features) if several
              else contextlib.nullcontext()) as uploads:
            outputs = [
                self._run_chunk(X32[start:stop], None if labels is None else labels[start:stop],
                                uploads)
                for start, stop in chunks
            ]
        return self._fetched(outputs)

    def _predicted_by_chunk(self, X: np.ndarray) -> np.ndarray:
        """The network's outputs (n, G) for a long host batch on the GPU, in chunks, each sent
        while the device predicts the one before (on a copy stream of their own,
        ``gln.kernels.uploads``).

        The rows of a float32 or float64 batch are rounded to float32 as they are staged (the
        rounding ``check_input`` makes) and checked by the device: a value that is not finite,
        or beyond float32's range, is not finite there. Two passes of the host over the rows
        cost about as much as the device's work on them. Those of other batches are checked by
        the host, chunk by chunk. Prediction changes nothing, so a bad value found late loses
        nothing: the error is the whole batch's host check's, naming its first bad value."""
        xp = self._xp
        staged_raw = X.dtype in (np.float32, np.float64) and X.shape[1] == self.num_features
        outputs, finite = [], []
        with (ChunkUploads(PREDICT_CHUNK_ROWS_GPU, self.num_features) if staged_raw
              else contextlib.nullcontext()) as uploads:
            for start, stop in self._chunk_bounds(len(X), PREDICT_CHUNK_ROWS_GPU):
                rows = X[start:stop]
                checked_here = not staged_raw or len(rows) <= HOST_WIDENED_ROWS
                if checked_here:  # else sent as they are, checked by the device
                    try:
                        rows = self.check_input(rows)[0]
                    except ValueError:
                        self.check_input(X)
                        raise
                packed, rows32 = self._sent(rows, None, uploads)
                if not checked_here:
                    finite.append(xp.isfinite(rows32).all())
                outputs.append(self._chunk_on_device(packed, rows32, len(rows), False)[0])
                if uploads is not None:
                    uploads.consumed()
            if finite and not bool(xp.stack(finite).all()):
                self.check_input(X)  # raises, naming the first value that is not finite
            return self._fetched(outputs)

    def _fetched(self, outputs: list[Any]) -> np.ndarray | None:
        """The chunks' outputs on the host, in one copy after the last chunk: until then the
        host prepares each next chunk while the device still runs the one before."""
        if not outputs:
            return None
        return to_numpy(outputs[0] if len(outputs) == 1 else self._xp.concatenate(outputs))

    def _run_chunk(
        self, X32: np.ndarray, labels: np.ndarray | None, uploads: ChunkUploads | None = None
    ) -> Any:
        """One chunk through the network; learns when labels are given. Returns (n, G) on the
        model's device. A call of several chunks sends their rows by ``uploads``."""
        n = len(X32)
        packed, rows32 = self._sent(X32, labels, uploads)
        outputs, self.moments = self._chunk_on_device(packed, rows32, n, labels is not None)
        if uploads is not None:
            uploads.consumed()
        if labels is not None:
            self.examples_seen += n
        return outputs

    def _sent(
        self, X32: np.ndarray, labels: np.ndarray | None, uploads: ChunkUploads | None = None
    ) -> tuple[Any, Any]:
        """A chunk on the model's device: its staged buffer and, for a chunk too long to have
        its rows staged, the rows as float32 (sent by ``uploads`` when given; they may then be
        float64 rows, rounded on the way)."""
        xp = self._xp
        if len(X32) <= HOST_WIDENED_ROWS:
            rows32 = None
        else:
            rows32 = uploads.send(X32) if uploads is not None else xp.asarray(X32)
        return xp.asarray(self._staged(X32, labels)), rows32

    def _replayed(self, X32: np.ndarray, labels: np.ndarray | None) -> np.ndarray | None:
        """``_run_chunk``'s outputs, on the host, from the call's captured graph, or None if it
        has none (yet)."""
        n, learning = len(X32), labels is not None
        state = (*self.weights, self.normals, self.offsets, self.moments.total,
                 self.moments.total_sq, self.moments_shift)
        outputs = self._replays.replayed(
            (n, learning), state, self._staged(X32, labels),
            lambda packed: self._chunk_on_device(packed, None, n, learning)[0],
        )
        if outputs is not None and learning:  # the graph updated the totals in place
            m = self.moments
            self.moments = RunningMoments(m.count + n, m.total, m.total_sq)
            self.examples_seen += n
        return outputs

    def _chunk_on_device(
        self, packed: Any, rows32: Any, n: int, learning: bool
    ) -> tuple[Any, RunningMoments]:
        """The device's work for a chunk staged by ``_staged`` (its float32 rows ``rows32``
        when they were not staged): outputs (n, G) and the moments after the chunk.

        Reads and writes only device arrays (the weights and, on the GPU, the moments' totals
        in place) and changes nothing on the host, so a call's launches can be captured.
        """
        x64, count, rates, targets = self._unpacked(packed, rows32, n)
        z, base_logits, after = self._scale(x64, count, learning)
        contexts = self._contexts(z)
        outputs = self._network_pass(
            self.weights, contexts, base_logits, targets, rates, bias_logit=self._bias_logit,
            pred_clip=self.pred_clip, weight_clip=self.weight_clip, learn=learning,
        )
        return outputs, after

    def _staged(self, X32: np.ndarray, labels: np.ndarray | None) -> np.ndarray:
        """What a chunk sends to the device, as one host buffer: its rows widened to float64
        (chunks of at most ``HOST_WIDENED_ROWS``), the example count before it (float64), and
        its learning rates (n,) and one-vs-all targets (n, G) as float32, zero when not
        learning.

        A short chunk goes in one copy, its rows widened here (exactly): each copy to a GPU,
        and each launch that would widen the rows there, costs microseconds of its own, which
        a single-example call feels. A long chunk's rows travel as float32, half the bytes, and
        are widened on the device.
        """
        n, d = X32.shape
        glns = self.num_glns
        rows_bytes = 8 * n * d if n <= HOST_WIDENED_ROWS else 0
        host = np.zeros(rows_bytes + 8 + 4 * n * (1 + glns), dtype=np.uint8)
        if rows_bytes:
            host[:rows_bytes].view(np.float64).reshape(n, d)[...] = X32
        host[rows_bytes:rows_bytes + 8].view(np.float64)[0] = self.moments.count
        if labels is not None:
            rates_and_targets = host[rows_bytes + 8:].view(np.float32)
            steps = np.arange(self.examples_seen + 1, self.examples_seen + n + 1)
            rates_and_targets[:n] = self.schedule(steps)
            positive = 1 if glns == 1 else np.arange(glns)
            rates_and_targets[n:] = (labels[:, None] == positive).ravel()
        return host

    def _unpacked(self, packed: Any, rows32: Any, n: int) -> tuple[Any, Any, Any, Any]:
        """Views of a staged chunk on the device: rows (n, d) float64 (``rows32`` widened
        when given), count (1, 1) float64, rates (n,) and targets (n, G) float32."""
        xp, d = self._xp, self.num_features
        rows_bytes = 0 if rows32 is not None else 8 * n * d
        x64 = (rows32.astype(xp.float64) if rows32 is not None
               else packed[:rows_bytes].view(xp.float64).reshape(n, d))
        count = packed[rows_bytes:rows_bytes + 8].view(xp.float64).reshape(1, 1)
        small = packed[rows_bytes + 8:].view(xp.float32)
        return x64, count, small[:n], small[n:].reshape(n, self.num_glns)

    @property
    def _bias_logit(self) -> float:
        return float(np.float32(math.log(self.bias / (1.0 - self.bias))))

    def _class_probabilities(self, outputs: np.ndarray | None, n: int) -> np.ndarray:
        if outputs is None:
            return np.zeros((n, self.num_classes))
        q = outputs.astype(np.float64)
        if self.num_glns == 1:
            return np.concatenate([1.0 - q, q], axis=1)
        return q / q.sum(axis=1, keepdims=True)

    # ------------------------------------------------------------------ bytes
    def to_bytes(self) -> bytes:
        """A versioned, checksummed snapshot (header + raw arrays; no pickle)."""
        from gln.serialize import model_to_bytes  # noqa: PLC0415 - avoids an import cycle

        return model_to_bytes(self)

    @classmethod
    def from_bytes(cls, blob: bytes, device: str | None = None, *,
                   use_kernels: bool = True) -> GLN:
        """Rebuild a model from ``to_bytes`` output, optionally on another device; a snapshot
        does not keep ``use_kernels`` (the reference path is a choice of the host, not state)."""
        from gln.serialize import model_from_bytes  # noqa: PLC0415

        return model_from_bytes(cls, blob, device, use_kernels)

    @staticmethod
    def config_of_bytes(blob: bytes) -> dict[str, Any]:
        """The configuration a ``to_bytes`` blob was saved with, read from its header alone.

        Cheap (the arrays are neither read nor checked; ``from_bytes`` does that), so a host
        given a blob can size the model it would build with ``estimate_nbytes`` first.
        Raises ``SnapshotFormatError`` if the blob is not a GLN snapshot.
        """
        from gln.serialize import snapshot_config  # noqa: PLC0415

        return snapshot_config(blob)

    def __reduce__(self) -> tuple[Any, ...]:
        """Copies (``copy.deepcopy``) and pickles go through ``to_bytes``: the same state on the
        same device, with the same ``use_kernels``; a copy learns without touching the original.
        """
        return (_copied, (self.to_bytes(), self.use_kernels))

    def __repr__(self) -> str:
        return (f"GLN(num_features={self.num_features}, num_classes={self.num_classes}, "
                f"layer_sizes={self.layer_sizes}, context_dim={self.context_dim}, "
                f"device={self._device!r}, examples_seen={self.examples_seen})")




def _copied(blob: bytes, use_kernels: bool) -> GLN:
    """The model ``GLN.__reduce__`` describes."""
    from gln.serialize import model_from_bytes  # noqa: PLC0415

    return model_from_bytes(GLN, blob, None, use_kernels)
