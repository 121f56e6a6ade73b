"""The public GLN class: one-vs-all classification, online input scaling, learn/predict.

This module holds the verbs (learn, predict, the bytes) and how a call is cut into chunks.
Each other part of ``GLN`` has a module of its own, mixed in: the configuration
(``gln.config``), the state and its size (``gln.state``), saliency (``gln.saliency``) and a
chunk's way to the device and back (``gln.staging``). The paper's Algorithm 1 is
``gln.network``.

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

from gln import checks, staging
from gln.backend import to_numpy
from gln.config import ConfigMixin
from gln.kernels import page_locks
from gln.kernels.replay import REPLAY_MAX_ROWS
from gln.kernels.uploads import ChunkUploads
from gln.saliency import SaliencyMixin
from gln.scaling import RunningMoments, scale_inputs
from gln.schedules import Evaluated, PerExample
from gln.staging import StagingMixin
from gln.state import StateMixin

CHUNK_ROWS = 256  # CPU: a neuron's weights reused from cache, the chunk's projections a few MB
CHUNK_ROWS_GPU = 4096  # GPU: a chunk's launches and host waits amortised
PROGRESS_CHUNKS = 8  # learn(progress=True)'s bar moves about once a second (MNIST, two cores)


class GLN(ConfigMixin, StateMixin, SaliencyMixin, StagingMixin):
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
        # Plain arrays only: a subclass (a masked array) is checked, as on the CPU, first.
        if (self._device == "cuda" and type(X) is np.ndarray and X.ndim == 2
                and len(X) > staging.PREDICT_CHUNK_ROWS_GPU):
            return self._class_probabilities(self._predicted_by_chunk(X), len(X))
        X32, _ = self.check_input(X)
        return self._predict_proba_checked(X32)

    def _predict_proba_checked(self, X32: np.ndarray) -> np.ndarray:
        """``predict_proba`` of rows that ``check_input`` returned, not checked again (see
        ``_learn_checked``)."""
        if self._device == "cuda" and len(X32) > staging.PREDICT_CHUNK_ROWS_GPU:
            return self._class_probabilities(self._predicted_by_chunk(X32), len(X32))
        return self._class_probabilities(self._outputs(X32, None), len(X32))

    def predict(self, X: Any) -> np.ndarray:
        """The most probable class of each row (n,)."""
        return np.argmax(self.predict_proba(X), axis=1)

    @contextlib.contextmanager
    def page_locked(self, X: np.ndarray) -> Iterator[np.ndarray]:
        """``X`` with its memory page-locked while the block runs, so that a GPU model's long
        predictions of its slices are copied to the GPU from where they lie with no lock of
        their own: for scoring a dataset in batches. A CPU model changes nothing.

        Outside such a block each ``predict_proba`` of more than ``PREDICT_CHUNK_ROWS_GPU`` rows
        locks its own rows and unlocks them (``gln.kernels.uploads.SEND_REGISTERED``: about
        0.75 ms of a 4,096-row float32 call on an H200's host, docs/gpu.md). The block locks
        ``X`` once, at about the same cost a byte, and holds it. Slices that gain are
        C-contiguous rows of ``X`` in a dtype that travels as it lies (float32, or pixels as
        uint8). Where the driver refuses (``X`` in page-locked memory already) or ``X`` is not a
        C-contiguous NumPy array, the calls go as they would without the block.

        >>> with model.page_locked(X_test) as rows:          # doctest: +SKIP
        ...     probabilities = [model.predict_proba(rows[i:i + 4096])
        ...                      for i in range(0, len(rows), 4096)]
        """
        if self._device != "cuda" or type(X) is not np.ndarray or not X.flags.c_contiguous:
            yield X
            return
        with page_locks.held(self._xp, X):
            yield X

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
        return self._learn_checked(X32, labels, progress=progress)

    def _learn_checked(
        self, X32: np.ndarray, labels: np.ndarray, *, progress: bool = False
    ) -> np.ndarray:
        """``learn`` of rows and labels that ``check_input`` returned (C-contiguous float32
        (n, num_features), every value finite; int64 class indices (n,)), not checked again.

        For a caller that has checked them already: the service checks its clients' rows
        (strictly) before they join a model's queue, and a single-row learn would otherwise
        check them twice. Rows not so checked may fail halfway or learn garbage.
        """
        if isinstance(self.schedule, PerExample):
            with self._user_rates_checked(len(X32)):
                return self._learned(X32, labels, progress)
        return self._learned(X32, labels, progress)

    def _learned(self, X32: np.ndarray, labels: np.ndarray, progress: bool) -> np.ndarray:
        """``learn``'s result for checked rows, with the model's rates ready to read."""
        if progress:
            return self._learned_with_progress(X32, labels)
        return self._class_probabilities(self._outputs(X32, labels), len(X32))

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
        """For a call learning ``n`` examples with a user's callable schedule (``PerExample``):
        the schedule evaluated for all of them at once (``ValueError`` naming a bad rate before
        anything is learned), then read from that evaluation. The built-in schedules need none
        of this, and their calls skip it (a context manager costs a one-row call microseconds).
        """
        schedule = self.schedule
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

    def _scale(self, rows: Any, count: Any, learning: bool) -> tuple[Any, Any, RunningMoments]:
        """Side information z, base logits, and the moments after the chunk (``rows``: float64,
        or float32 where the model's kernels read them so; ``count``: ``moments.count`` as a
        (1, 1) float64 array on the model's device)."""
        xp, m, shift = self._xp, self.moments, self.moments_shift
        if learning:
            counts, sums, sums_sq, after = self._moments_fold(m, rows, count, shift)
        else:
            counts, sums, sums_sq, after = count, m.total[None, :], m.total_sq[None, :], m
        z, base_logits = scale_inputs(
            xp, rows, counts, sums, sums_sq,
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
        if n <= self._chunk_rows:  # one chunk (or none): no uploads to share, no list to join
            return to_numpy(self._run_chunk(X32, labels)) if n else None
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

    def _class_probabilities(self, outputs: np.ndarray | None, n: int) -> np.ndarray:
        """The network's outputs (n, G) float32 as class probabilities (n, num_classes)."""
        if outputs is None:
            return np.zeros((n, self.num_classes))
        if self.num_classes == 2:  # [1 - q, q], written in place (no list to concatenate)
            probs = np.empty((n, 2))
            q = probs[:, 1:]
            q[...] = outputs
            np.subtract(1.0, q, out=probs[:, :1])
            return probs
        q = outputs.astype(np.float64)
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
