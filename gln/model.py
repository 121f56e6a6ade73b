"""The public GLN class: one-vs-all classification, online input scaling, learn/predict.

This module holds the verbs (learn, predict, the bytes) and how a call is cut into chunks. A
call reads top-down through the modules: ``learn`` checks its rows (``gln.checks``), cuts
them into chunks (here), and each chunk is sent to the device (``gln.staging``), scaled
(``gln.scaling``), gated (``gln.gating``) and run through the network (``gln.network``, the
paper's Algorithm 1) by the kernels chosen for the device (``gln.pipeline``, ``gln.kernels``).

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
import functools
import inspect
import math
from collections.abc import Iterator, Sequence
from typing import Any, Self

import numpy as np
from tqdm import tqdm

from gln import checks, memory, staging
from gln.backend import to_numpy
from gln.config import Config
from gln.kernels import page_locks
from gln.kernels.replay import REPLAY_MAX_ROWS
from gln.kernels.uploads import ChunkUploads
from gln.pipeline import Pipeline
from gln.saliency import saliency_terms
from gln.schedules import DEFAULT_LEARNING_RATE, Evaluated, PerExample
from gln.serialize import (
    SnapshotFormatError,
    check_arrays,
    load_state,
    read_snapshot,
    snapshot_bytes,
    snapshot_config,
)
from gln.staging import Staging, chunk_bounds
from gln.state import (
    DEFAULT_CONTEXT_DIM,
    DEFAULT_LAYER_SIZES,
    State,
    allocating,
    estimate_nbytes,
    initial_state,
    layout_of,
)

CHUNK_ROWS = 256  # CPU: a neuron's weights reused from cache, the chunk's projections a few MB
CHUNK_ROWS_GPU = 4096  # GPU: a chunk's launches and host waits amortised
PROGRESS_CHUNKS = 8  # learn(progress=True)'s bar moves about once a second (MNIST, two cores)


class _Delegated:
    """An attribute of one of the model's parts (``part``: ``"_config"`` or ``"_state"``),
    read as the model's own; set through the model only where ``writable``."""

    def __init__(self, part: str, writable: bool = False) -> None:
        self._part, self._writable = part, writable

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, model: Any, owner: type | None = None) -> Any:
        return self if model is None else getattr(getattr(model, self._part), self._name)

    def __set__(self, model: Any, value: Any) -> None:
        if not self._writable:
            raise AttributeError(f"{self._name} is fixed when the model is made")
        setattr(getattr(model, self._part), self._name, value)


class GLN:
    """A Gated Linear Network classifier that learns from one example at a time.

    Parameters (the configuration; stored as given, checked once):

    num_features: width of each input row.
    num_classes: 2 gives one binary GLN; more gives one GLN per class (one-vs-all), whose
        outputs are normalised to sum to 1. Each output lies in [eps, 1 - eps], so the surest
        prediction of K classes is (1 - eps) / (1 - eps + (K - 1) eps): 0.917 for 10 classes at
        the default eps = 0.01, 0.5 for 100. Many classes want ``pred_clip`` <= 0.1 / K.
    layer_sizes: neurons per layer (at most 64 layers), the last one 1 (the paper's single output
        neuron). The default (32, 1), with context_dim 3 and the rate min(10 / t, 0.1), learns
        small tabular streams about as fast as an online logistic regression from the first
        rows (benchmarks/paper/uci.py); size it up for tens of thousands of rows and more.
    context_dim: m, hyperplanes per neuron, 1 to 16; each neuron has 2^m weight vectors. A
        configuration whose ``estimate_nbytes`` exceeds a tenth of the memory of its device
        warns (``gln.memory``) before anything is allocated.
    learning_rate: a number, ``{"schedule": "inverse_time", "scale": s, "cap": c}`` for
        ``min(s / t, c)`` (the paper's MNIST run used scale 100, cap 0.01), or a callable of t
        (a model with one cannot be serialised: ``config``, ``to_bytes``, copies and pickles
        refuse it).
    pred_clip: eps; every prediction is clipped to [eps, 1 - eps]; at least 2**-24 (float32).
    weight_clip: b; weights are projected onto [-b, b] after each update; below 1e6.
    bias: beta, the constant bias input of every layer, in [eps, 1 - eps] and not 0.5;
        the default sigmoid(1) makes its logit exactly 1.
    offset_scale: standard deviation of the hyperplane offsets (the paper: 1).
    input_scaling: ``"standardize"`` (running statistics, any features), ``"unit"`` (inputs
        already in [0, 1]) or ``"unit_fixed"`` (inputs in [0, 1], scaled with no statistics
        at all: each row's side information and base predictions are its own, so they do not
        drift when the stream changes, as in continual learning); see ``gln.scaling``. The
        default stays ``"standardize"``: the other two need inputs in [0, 1].
    min_std: floor of the standard deviation used in input scaling; a feature whose spread is
        below it is treated as constant. The default 1e-9 standardises features of any
        practical scale (1e-3, the default before, made a feature of spread 1e-4 invisible:
        online log loss 0.685 against 0.304 with 1e-9, which changed scikit-learn's datasets
        by at most 0.001).
    side_info: what the halfspace gating sees: ``"scaled"`` (the scaled inputs, default),
        ``"per_row"`` (each row centred on its own mean and normalised; see ``gln.scaling``)
        or ``"given"``: side information of ``side_info_size`` features that comes with each
        row (``learn(X, y, side_info=Z)``) and is used as it is, the rows then being only the
        base predictions (the paper's general form: what layer 1 mixes and what picks the
        weights may differ).
    side_info_size: the width of the given side information; 0 unless ``side_info="given"``.
    side_info_blur: for ``"per_row"`` with ``image_shape``, the std in pixels of a Gaussian
        blur of the side information (0: none).
    image_shape: (height, width) of rows that are images, height * width = num_features
        (= side_info_size for given side information); needed only for ``side_info_blur``
        and ``gating_window``.
    gating_window: for image rows, the side in pixels of a random square window that each
        hyperplane's normal is kept on (``gln.gating.restrict_to_windows``); 0 (default): the
        whole input, as in the paper.
    seed: seeds the hyperplanes; the same seed and data give the same bytes.
    feature_names: optional, one distinct name per feature: rows may then be given by name
        (a list of dicts, or a DataFrame, whose columns are picked by name); kept in snapshots.
    class_names: optional, one distinct name per class: labels may then be given by name
        (``"fraud"`` as well as its index); ``predict_names`` answers with them.
    device: ``"cpu"``, ``"cuda"`` or ``"auto"``.
    use_kernels: run the compiled CPU or CUDA kernels (default), or the plain array code that
        they are tested against (slower); a host's choice, not kept in snapshots.

    The model owns three parts, each in a module of its own: its configuration (``Config``,
    ``gln.config``), its state (``State``, ``gln.state``: the arrays it learns and its counters)
    and its device's code paths (``Pipeline``, ``gln.pipeline``), which ``Staging``
    (``gln.staging``) sends each chunk through. The arguments above, and the state's arrays,
    read as attributes of the model.
    """

    # The constructor's arguments as checked (gln.config.Config), and what follows from them.
    num_features = _Delegated("_config")
    num_classes = _Delegated("_config")
    layer_sizes = _Delegated("_config")
    context_dim = _Delegated("_config")
    learning_rate = _Delegated("_config")
    pred_clip = _Delegated("_config")
    weight_clip = _Delegated("_config")
    bias = _Delegated("_config")
    offset_scale = _Delegated("_config")
    input_scaling = _Delegated("_config")
    min_std = _Delegated("_config")
    side_info = _Delegated("_config")
    side_info_size = _Delegated("_config")
    side_info_blur = _Delegated("_config")
    image_shape = _Delegated("_config")
    gating_window = _Delegated("_config")
    seed = _Delegated("_config")
    feature_names = _Delegated("_config")  # a tuple, or None
    class_names = _Delegated("_config")  # a tuple, or None
    device = _Delegated("_config")
    use_kernels = _Delegated("_config")
    schedule = _Delegated("_config")  # the learning rate as a function of t
    num_glns = _Delegated("_config")  # one GLN for a binary problem, one per class otherwise
    # The state (gln.state.State): hyperplanes, input statistics, weights, examples learned.
    normals = _Delegated("_state")
    offsets = _Delegated("_state")
    moments = _Delegated("_state", writable=True)
    moments_shift = _Delegated("_state")
    weights = _Delegated("_state", writable=True)
    examples_seen = _Delegated("_state", writable=True)

    def __init__(
        self,
        num_features: int,
        num_classes: int = 2,
        layer_sizes: Sequence[int] = DEFAULT_LAYER_SIZES,
        context_dim: int = DEFAULT_CONTEXT_DIM,
        learning_rate: Any = DEFAULT_LEARNING_RATE,
        pred_clip: float = 0.01,
        weight_clip: float = 5.0,
        bias: float = 1.0 / (1.0 + math.exp(-1.0)),
        offset_scale: float = 1.0,
        input_scaling: str = "standardize",
        min_std: float = 1e-9,
        side_info: str = "scaled",
        side_info_size: int = 0,
        side_info_blur: float = 0.0,
        image_shape: Sequence[int] | None = None,
        gating_window: int = 0,
        seed: int = 0,
        feature_names: Sequence[str] | None = None,
        class_names: Sequence[str] | None = None,
        device: str = "cpu",
        use_kernels: bool = True,
    ) -> None:
        config = Config(**{name: value for name, value in locals().items() if name != "self"})
        pipeline = Pipeline(config)
        _warn_if_large(config, pipeline)
        with allocating(config, pipeline.device):
            state = initial_state(config, pipeline.xp)
        self._own(config, pipeline, state)

    def _own(self, config: Config, pipeline: Pipeline, state: State) -> None:
        """Take the model's parts: its configuration, its device's code paths, its state, and
        the staging that sends its chunks through them."""
        self._config, self._pipeline, self._state = config, pipeline, state
        self._staging = Staging(config, pipeline, state)

    @classmethod
    def _checked_config(cls, config: dict[str, Any], use_kernels: bool) -> Config:
        """``config`` (keyword arguments of the constructor, the rest its defaults) checked as
        the constructor checks it; a key the constructor does not take is a ``TypeError``, as it
        is for the constructor."""
        arguments = _signature(cls).bind(**config, use_kernels=use_kernels)
        arguments.apply_defaults()
        return Config(**arguments.arguments)

    @classmethod
    def check_config(cls, config: dict[str, Any]) -> None:
        """Raise what the constructor would raise for ``config`` (``ValueError`` naming the
        argument, ``TypeError`` for a key it does not take), without sampling a model's state:
        lets a host short of room still say first what is wrong with a configuration. What
        the configuration's device needs is set up (its blur matrices, which
        ``estimate_nbytes`` counts), so a host sizes the configuration first.

        >>> from gln import GLN
        >>> GLN.check_config({"num_features": 4, "pred_clip": 0.7})
        Traceback (most recent call last):
        ...
        ValueError: pred_clip must be in (0.0, 0.5), got 0.7
        """
        checked = cls._checked_config(config, use_kernels=False)
        _warn_if_large(checked, Pipeline(checked))

    @property
    def config(self) -> dict[str, Any]:
        """The constructor arguments, JSON-serialisable; ``GLN(**model.config)`` rebuilds it."""
        return self._config.as_dict()

    @property
    def nbytes(self) -> int:
        """Bytes held by the model's arrays (weights, hyperplanes, statistics) and its copy of
        the normals, once a call has made it: 16-bit on the CPU (a short call), int8 slices on
        the GPU (a long chunk)."""
        return self._state.nbytes + self._pipeline.nbytes

    def config_for_estimate(self) -> dict[str, Any]:
        """The size-determining arguments, as ``estimate_nbytes`` takes them."""
        return self._config.for_estimate(self._pipeline.device)

    @staticmethod
    def estimate_nbytes(config: dict[str, Any]) -> int:
        """Bytes a model with this configuration may hold, computed without building it.

        Lets a host refuse a configuration before allocating it. Needs ``num_features`` and
        optionally ``num_classes``, ``layer_sizes``, ``context_dim``, ``side_info_blur`` and
        ``image_shape`` (constructor defaults otherwise); raises the constructor's
        ``ValueError`` for any of them it would refuse.
        Counts the copy of the normals that a model on ``device`` (the constructor's,
        default "cpu") makes: the 16-bit one of a CPU model's first call of a few rows
        (``gln.kernels.cpu_int16_gating``), the int8 slices of a GPU model's first long chunk
        (``gln.kernels.int8_gating``); the larger of the two for "auto" or an unknown device.
        """
        return estimate_nbytes(config)

    # ------------------------------------------------------------------ input checks
    def check_input(
        self, X: Any, y: Any = None, *, strict: bool = False
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Check a batch; returns (X as float32 (n, d), y as int64 (n,) or None).

        Raises ``ValueError`` naming the problem for a wrong shape, a non-finite value (NaN,
        inf, or a magnitude beyond float32), or a label that is not a class index; with
        ``strict``, also for a value outside [0, 1] when ``input_scaling="unit"`` (learning
        clips those to [eps, 1 - eps]: a pixel sent as 0-255 would count as 1). The service
        checks its clients' rows strictly.
        """
        X32 = self._config.checked_rows(X, strict=strict)
        if y is None:
            return X32, None
        return X32, self.check_labels(y, X32.shape[0])

    def check_side_info(self, side_info: Any, num_rows: int) -> np.ndarray | None:
        """Check the side information of ``num_rows`` rows: C-contiguous float32
        (num_rows, side_info_size) for a model of ``side_info="given"``, which needs it, and
        None for any other, which refuses it. ``ValueError`` names what is wrong."""
        return checks.checked_side_info(side_info, self._config.side_info_size, num_rows)

    def check_labels(self, y: Any, num_rows: int | None = None) -> np.ndarray:
        """Check labels on their own (int64 (n,)); ``num_rows``: how many there must be.

        Raises ``ValueError`` naming the first label (by its index in ``y``) that is not a
        class index of this model, or (with ``class_names``) one of its class names.
        """
        return self._config.checked_labels(y, num_rows)

    # ------------------------------------------------------------------ public verbs
    def predict_proba(
        self, X: Any, *, checked: bool = False, side_info: Any = None
    ) -> np.ndarray:
        """Class probabilities (n, num_classes), rows summing to 1. Does not learn.

        ``checked=True``: ``X`` is what ``check_input`` returned (C-contiguous float32
        (n, num_features), every value finite) and is not checked again. ``side_info``: each
        row's (n, side_info_size), for a model of ``side_info="given"`` (always checked).
        """
        if self._config.side_info == "given" or side_info is not None:
            X32 = X if checked else self.check_input(X)[0]
            given = self.check_side_info(side_info, len(X32))
            return self._class_probabilities(self._outputs(X32, None, given), len(X32))
        gpu = self._pipeline.device == "cuda"
        if not checked:
            # A long plain array goes to the GPU as it is, each chunk checked as it is sent; a
            # subclass (a masked array) is checked first, as on the CPU.
            if (gpu and type(X) is np.ndarray and X.ndim == 2
                    and len(X) > staging.PREDICT_CHUNK_ROWS_GPU):
                return self._class_probabilities(self._staging.predicted_by_chunk(X), len(X))
            X, _ = self.check_input(X)
        if gpu and len(X) > staging.PREDICT_CHUNK_ROWS_GPU:
            return self._class_probabilities(self._staging.predicted_by_chunk(X), len(X))
        return self._class_probabilities(self._outputs(X, None), len(X))

    def predict(self, X: Any, *, side_info: Any = None) -> np.ndarray:
        """The most probable class of each row (n,)."""
        return np.argmax(self.predict_proba(X, side_info=side_info), axis=1)

    def class_of(self, probabilities: np.ndarray) -> np.ndarray:
        """The most probable class of each row of ``probabilities`` (n, num_classes): its name
        where the model has ``class_names`` (a str array), else its index."""
        return self._config.class_of(probabilities)

    def predict_names(self, X: Any, *, side_info: Any = None) -> np.ndarray:
        """The most probable class of each row, by name where the model has ``class_names``."""
        return self.class_of(self.predict_proba(X, side_info=side_info))

    def saliency(self, X: Any, *, side_info: Any = None) -> np.ndarray:
        """The collapsed weight product W_L(z) ... W_1(z) for each row and class.

        Shape (n, num_classes, num_features): entry [t, c, j] is how much the logit of base
        prediction j moves class c's output logit for row t (paper, section "Linear
        interpretability"; ``gln.saliency``). Bias inputs are not features: they enter as a
        constant term, so where no output is clipped,
        ``sigmoid(S[t, c] . logit(p0[t]) + bias_term[t, c])`` equals the GLN's output (see
        ``saliency_terms``). For a binary model class 0's map is the negative of class 1's.
        With more than two classes, class c's map is that of its one-vs-all network's output
        logit, before ``predict_proba`` divides the networks' outputs by their sum: it is not
        the slope of ``predict_proba``'s log-odds.
        """
        maps, _ = self.saliency_terms(X, side_info=side_info)
        return maps

    def saliency_terms(
        self, X: Any, *, side_info: Any = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Saliency maps (n, C, d) and the bias terms (n, C) that complete the output logit."""
        X32, _ = self.check_input(X)
        given = self.check_side_info(side_info, len(X32))
        return saliency_terms(self._pipeline, self._state, X32, self._chunk_rows, given)

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
        pipeline = self._pipeline
        if pipeline.device != "cuda" or type(X) is not np.ndarray or not X.flags.c_contiguous:
            yield X
            return
        with page_locks.held(pipeline.xp, X):
            yield X

    def warm_up(self) -> None:
        """Make the first call as fast as the ones after it; changes nothing the model holds.

        A process's first call loads (or compiles) the kernels, and a CPU model's first short
        call makes its 16-bit copy of the normals: hundreds of milliseconds, which a server
        would otherwise charge to its first request. One prediction of a row of zeros does
        both; a prediction learns nothing, so the model's bytes stay the same.
        """
        size = self._config.side_info_size
        self.predict_proba(np.zeros((1, self.num_features), dtype=np.float32),
                           side_info=np.zeros((1, size), dtype=np.float32) if size else None)

    def learn(
        self, X: Any, y: Any, *, progress: bool = False, checked: bool = False,
        side_info: Any = None,
    ) -> np.ndarray:
        """Learn every row in order, one OGD step per example.

        Returns the class probabilities predicted for each row before its own update
        (prequential predictions), shape (n, num_classes). The result and the final state
        equal those of learning the rows one call at a time. Invalid input raises
        ``ValueError`` before anything is changed. ``progress=True`` shows a progress bar
        (tqdm, on stderr) for a long offline pass; it changes nothing learned.

        ``checked=True``: ``X`` and ``y`` are what ``check_input`` / ``check_labels`` returned
        (C-contiguous float32 (n, num_features), every value finite; int64 class indices (n,))
        and are not checked again; rows not so checked may fail halfway or learn garbage.
        ``side_info``: each row's (n, side_info_size), for a model of ``side_info="given"``
        (always checked).
        """
        if not checked:
            if y is None:  # check_input's "no labels": predicting, which learn must not pass for
                raise ValueError("learn needs labels y, one class index per row (predict_proba "
                                 "predicts without learning)")
            X, y = self.check_input(X, y)
        given = None
        if self._config.side_info == "given" or side_info is not None:
            given = self.check_side_info(side_info, len(X))
        if isinstance(self._config.schedule, PerExample):
            with self._user_rates_checked(len(X)):
                return self._learned(X, y, progress, given)
        return self._learned(X, y, progress, given)

    def _learned(self, X32: np.ndarray, labels: np.ndarray, progress: bool,
                 given: np.ndarray | None) -> np.ndarray:
        """``learn``'s result for checked rows, with the model's rates ready to read."""
        if progress:
            return self._learned_with_progress(X32, labels, given)
        return self._class_probabilities(self._outputs(X32, labels, given), len(X32))

    def _learned_with_progress(self, X32: np.ndarray, labels: np.ndarray,
                               given: np.ndarray | None) -> np.ndarray:
        """``learn``'s result for checked rows, in pieces of a few chunks under a progress
        bar."""
        outputs = []  # on the host: each piece's call waits for its results, so the bar is true
        with tqdm(total=len(X32), unit="example", desc="learn") as bar:
            for start, stop in chunk_bounds(len(X32), PROGRESS_CHUNKS * self._chunk_rows):
                outputs.append(self._outputs(X32[start:stop], labels[start:stop],
                                             None if given is None else given[start:stop]))
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
        schedule = self._config.schedule
        first = self._state.examples_seen + 1
        self._staging.schedule = Evaluated(first, schedule(np.arange(first, first + n)))
        try:
            yield
        finally:
            self._staging.schedule = schedule

    @property
    def _chunk_rows(self) -> int:
        """The device's chunk length: rows per kernel call."""
        return CHUNK_ROWS_GPU if self._pipeline.device == "cuda" else CHUNK_ROWS

    def _anchor_moments(self, first_row: np.ndarray) -> None:
        """Take the first row learned as the shift of the running sums (``gln.scaling``: sums
        of ``x - shift`` keep the variance exact where a feature's mean dwarfs its spread).
        In place, so a captured graph reads it."""
        if self._config.input_scaling == "standardize":
            xp = self._pipeline.xp
            self._state.moments_shift[...] = xp.asarray(first_row, dtype=xp.float64)

    def _outputs(self, X32: np.ndarray, labels: np.ndarray | None,
                 given: np.ndarray | None = None) -> np.ndarray | None:
        """The network's outputs (n, G) for a checked batch (and its checked side information
        ``given``, for ``side_info="given"``), on the host; learns when labels are given. A
        short call on the GPU is replayed from its captured graph when it can be; a longer one
        goes in chunks of the device's chunk length."""
        n = len(X32)
        if labels is not None and n and self._state.moments.count == 0:
            self._anchor_moments(X32[0])
        if self._staging.replays is not None and 0 < n <= REPLAY_MAX_ROWS:
            replayed = self._staging.replayed(X32, labels)
            if replayed is not None:
                return replayed
        if n <= self._chunk_rows:  # one chunk (or none): no uploads to share, no list to join
            return to_numpy(self._staging.run_chunk(X32, labels, None, given)) if n else None
        chunks = chunk_bounds(n, self._chunk_rows)
        several = self._pipeline.device == "cuda" and len(chunks) > 1
        with (ChunkUploads(max(b - a for a, b in chunks), self._config.num_features) if several
              else contextlib.nullcontext()) as uploads:
            outputs = [
                self._staging.run_chunk(X32[start:stop],
                                        None if labels is None else labels[start:stop], uploads,
                                        None if given is None else given[start:stop])
                for start, stop in chunks
            ]
        return self._staging.fetched(outputs)

    def _class_probabilities(self, outputs: np.ndarray | None, n: int) -> np.ndarray:
        """The network's outputs (n, G) float32 as class probabilities (n, num_classes)."""
        return class_probabilities(outputs, n, self._config.num_classes)

    # ------------------------------------------------------------------ bytes
    def to_bytes(self) -> bytes:
        """A versioned, checksummed snapshot (header + raw arrays; no pickle)."""
        return snapshot_bytes(self.config, self._state)

    @classmethod
    def from_bytes(cls, blob: bytes, device: str | None = None, *,
                   use_kernels: bool = True) -> Self:
        """Rebuild a model from ``to_bytes`` output, optionally on another device; a snapshot
        does not keep ``use_kernels`` (the reference path is a choice of the host, not state).
        Raises ``SnapshotFormatError`` for bytes that are not a GLN snapshot of a configuration
        this class takes."""
        snapshot = read_snapshot(blob)
        saved = dict(snapshot.config)
        if device is not None:
            saved["device"] = device
        try:
            config = cls._checked_config(saved, use_kernels)
        except (TypeError, ValueError) as error:
            raise SnapshotFormatError(f"GLN snapshot of an invalid configuration: {error}"
                                      ) from None
        layout = layout_of(config)
        # Before anything is built: the arrays the header names must be the configuration's
        # and fill the payload exactly, so a small blob cannot make a large model.
        check_arrays(snapshot, layout)
        try:
            pipeline = Pipeline(config)
            with allocating(config, pipeline.device):
                state = load_state(snapshot, layout, pipeline.xp)
        except (MemoryError, ValueError) as error:
            if isinstance(error, SnapshotFormatError):
                raise
            raise SnapshotFormatError(f"GLN snapshot cannot be loaded here: {error}") from None
        model = cls.__new__(cls)
        model._own(config, pipeline, state)
        return model

    @staticmethod
    def config_of_bytes(blob: bytes) -> dict[str, Any]:
        """The configuration a ``to_bytes`` blob was saved with, read from its header alone.

        Cheap (the arrays are neither read nor checked; ``from_bytes`` does that), so a host
        given a blob can size the model it would build with ``estimate_nbytes`` first.
        Raises ``SnapshotFormatError`` if the blob is not a GLN snapshot.
        """
        return snapshot_config(blob)

    def __reduce__(self) -> tuple[Any, ...]:
        """Copies (``copy.deepcopy``) and pickles go through ``to_bytes``: the same state on the
        same device, with the same ``use_kernels``; a copy learns without touching the original.
        """
        return (_copied, (self.to_bytes(), self.use_kernels))

    def __repr__(self) -> str:
        return (f"GLN(num_features={self.num_features}, num_classes={self.num_classes}, "
                f"layer_sizes={self.layer_sizes}, context_dim={self.context_dim}, "
                f"device={self._pipeline.device!r}, examples_seen={self.examples_seen})")


@functools.cache
def _signature(cls: type) -> inspect.Signature:
    """The constructor's signature, read once: ``inspect.signature`` costs more than the rest
    of ``from_bytes`` for a small model."""
    return inspect.signature(cls)


def class_probabilities(outputs: np.ndarray | None, n: int, classes: int) -> np.ndarray:
    """The network's outputs (n, G) float32 (None: no rows) as the probabilities (n, classes)
    of ``classes`` classes: [1 - q, q] for two, else the one-vs-all outputs normalised."""
    if outputs is None:
        return np.zeros((n, classes))
    if classes == 2:  # [1 - q, q], written in place (no list to concatenate)
        probs = np.empty((n, 2))
        q = probs[:, 1:]
        q[...] = outputs
        np.subtract(1.0, q, out=probs[:, :1])
        return probs
    q = outputs.astype(np.float64)
    return q / q.sum(axis=1, keepdims=True)


def _warn_if_large(config: Config, pipeline: Pipeline) -> None:
    """Warn (``gln.memory``) where the model of ``config`` would take a large share of the
    memory of its device."""
    where = "the GPU's" if pipeline.device == "cuda" else "this machine's"
    memory.warn_if_large(estimate_nbytes(config.for_estimate(pipeline.device)),
                         memory.device_memory(pipeline.device, pipeline.xp), where)


def _copied(blob: bytes, use_kernels: bool) -> GLN:
    """The model ``GLN.__reduce__`` describes."""
    return GLN.from_bytes(blob, use_kernels=use_kernels)
