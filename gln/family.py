"""A family of models of one configuration, stored as stacked arrays: the rows of many models
learned in one call, each model ending byte for byte where it would have alone.

A server that keeps one small model per customer receives rows of many of them at once. Each
``GLN.learn`` call has a fixed cost of its own (checks, staging, a dozen array calls, the
kernels' launches): tens of microseconds, against a few of arithmetic for a small model's row.
A ``GLNFamily`` holds ``size`` members that share a configuration, seed included, and so their
hyperplanes; everything else a model learns is per member and stacked on a leading axis:

* ``weights``: each layer's (M, G, K, 2^m, I);
* the running input statistics (``gln.scaling``): count (M,), sums and sums of squares (M, d),
  and the shift (M, d), each member's first row learned;
* ``examples_seen`` (M,): the t of each member's learning-rate schedule.

``learn(X, y, members)`` takes rows of any members in any order; ``members[t]`` says whose row
t is. Rows of one member are learned in their order, each scaled with its member's statistics
as of that row and stepped with its member's t; rows of different members are independent.
The call is one pass of the single model's work over the whole chunk (``gln.pipeline``): the
rows are scaled (on the GPU first grouped by member, a stable sort that keeps each member's
rows in their order), gated by the shared hyperplanes in one product, and run through every
layer, where each row reads and updates its own member's weights. Each step does, for each member,
the float operations a model of its own makes on that member's rows in the same order, so the
bytes are the same (``member(i).to_bytes()`` equals those of a model that learned member i's
rows alone, and so do the prequential probabilities):

* the statistics: ``gln.scaling.family_moments_before_each_row`` (the specification) is
  ``gln.scaling.moments_before_each_row`` on each member's rows; the GPU's fold
  (``gln.kernels.cuda.cuda_family_moments``) is the single model's sequential kernel on each
  member's run of rows, all in one launch;
* the layers: ``gln.network.reference_family_layer_pass`` is ``gln.network.reference_layer_pass``
  on each row with its member's weights; the compiled kernels (``gln.kernels.cpu_family``)
  are the single model's kernels with the weights indexed by member, and the GPU's
  (``gln_family_layer_pass``, ``gln.kernels.cuda.cuda_family_network_pass``) one launch a
  layer whose warps each run one member's neuron through that member's rows, in order, as
  the single model's streaming kernel runs a neuron through a chunk.

Members must share the seed: the hyperplanes are what makes one gating product serve every
row of a chunk. They are random directions, drawn before any data and never learned, so
tenants lose nothing by sharing them; a family of seeds would need a product, and a 16-bit
copy of the normals, per member: the costs a family exists to share.

Members of ``side_info="given"`` take each row's side information with it
(``learn(X, y, members, side_info=Z)``): one chunk's rows may each be gated by side
information of their own, in their own member. That makes many independent binary models
one model: ``gln.density`` learns the 784 pixel models of an image, each gated by the pixels
before its own, in one call.

The family runs on its configuration's device, as a ``GLN`` does: ``device="cuda"`` keeps the
stacked arrays in GPU memory (the counters stay on the host), and each member ends with the
bytes of a ``GLN(device="cuda")`` that learned its rows alone, and a member's snapshot loads
on any device (``GLN.from_bytes(blob, device=...)``). ``use_kernels=False`` runs the array
code that the kernels are tested against, as for a ``GLN``.

>>> import numpy as np
>>> from gln import GLN, GLNFamily
>>> family = GLNFamily(3, num_features=2, layer_sizes=(4, 1), seed=0)
>>> X, y = np.array([[0.0, 1.0], [1.0, 0.0], [0.5, 0.5]]), np.array([1, 0, 1])
>>> first = family.learn(X, y, members=[2, 0, 2])     # rows 0 and 2 are member 2's, in order
>>> alone = GLN(num_features=2, layer_sizes=(4, 1), seed=0)
>>> _ = alone.learn(X[[0, 2]], y[[0, 2]])
>>> family.member(2).to_bytes() == alone.to_bytes()
True
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from gln import checks
from gln.backend import to_numpy
from gln.config import Config
from gln.kernels import family_moments_fold_for, family_network_pass_for
from gln.model import CHUNK_ROWS, CHUNK_ROWS_GPU, GLN, class_probabilities
from gln.pipeline import Pipeline
from gln.scaling import FusedScaling, scale_inputs
from gln.serialize import snapshot_bytes
from gln.staging import chunk_bounds
from gln.state import State, estimate_nbytes


class GLNFamily:
    """``size`` GLNs of one configuration (the ``GLN`` constructor's keyword arguments), each
    starting as ``GLN(**config)`` starts, learned and predicted by rows tagged with their
    member (see the module).

    ``GLNFamily.from_models`` stacks existing models (or their snapshots); ``member(i)`` gives
    member i as a ``GLN`` of its own (a copy), ``member_bytes(i)`` its snapshot. A family is not
    safe to call from two threads at once: as for a model, one writer at a time.
    """

    def __init__(self, size: int, **config: Any) -> None:
        size = checks.positive_int("size", size)
        first = GLN(**config)
        self._take(first._config, first._state, size)
        self._fill(slice(None), first._state)

    @classmethod
    def with_capacity(cls, capacity: int, **config: Any) -> GLNFamily:
        """A family with room for ``capacity`` members and none set yet: each member's state
        is written where ``set_member`` puts a model there, and until then holds no memory
        of the machine (the arrays are allocated, not touched), so a host may make room for
        every model it could come to hold at the cost of address space alone. (A GPU family's
        arrays take the device's memory when they are allocated.)"""
        capacity = checks.positive_int("capacity", capacity)
        first = GLN(**config)
        family = cls.__new__(cls)
        family._take(first._config, first._state, capacity)
        return family

    # ------------------------------------------------------------------ building
    @classmethod
    def from_models(cls, models: Sequence[Any], *, use_kernels: bool | None = None) -> GLNFamily:
        """A family whose member i is ``models[i]`` (a ``GLN``, or a snapshot of one as
        ``to_bytes`` gives it), as it stands. Every model must have the first one's
        configuration (``GLN.config``, seed included) and therefore its hyperplanes;
        ``ValueError`` names the first that does not. ``use_kernels``: the family's choice
        (default: the first model's)."""
        models = [GLN.from_bytes(m) if isinstance(m, bytes | bytearray | memoryview) else m
                  for m in models]
        if not models:
            raise ValueError("models must hold at least one GLN")
        first = models[0]
        if not isinstance(first, GLN):
            raise ValueError(f"models[0] must be a GLN or its snapshot, got {type(first).__name__}")
        config = first._config
        if use_kernels is not None and bool(use_kernels) != config.use_kernels:
            config = GLN._checked_config(first.config, bool(use_kernels))
        family = cls.__new__(cls)
        family._take(config, first._state, len(models))
        for index, model in enumerate(models):
            family._check_fits(model, f"models[{index}]")
            family._fill(index, model._state)
        return family

    def _take(self, config: Config, state: State, size: int) -> None:
        """Take the configuration, the hyperplanes of ``state`` and room for ``size`` members'
        state (``ValueError`` where it does not fit in memory)."""
        self._config = config
        self._pipeline = pipeline = Pipeline(config)
        config.as_dict()  # ValueError for a callable learning rate: no snapshot could hold it
        xp = pipeline.xp  # the stacked arrays live on the family's device; counters on the host
        self._normals = xp.asarray(state.normals)
        self._offsets = xp.asarray(state.offsets)
        d = config.num_features
        try:
            self._weights = [xp.empty((size, *w.shape), xp.float32) for w in state.weights]
            self._totals, self._totals_sq, self._shifts = (
                xp.empty((size, d), xp.float64) for _ in "abc")
        except MemoryError:  # CuPy's OutOfMemoryError is one
            one = estimate_nbytes(config.for_estimate(pipeline.device))
            raise ValueError(f"a family of {size} models needs about {size * one} bytes, "
                             "more memory than is available") from None
        # One call at a time: members share the arrays (and the kernels' scratch).
        self.lock = threading.RLock()
        self._counts = np.zeros(size, np.int64)  # each member's moments.count
        self._seen = np.zeros(size, np.int64)  # each member's examples_seen
        self._network_pass = family_network_pass_for(xp, config.use_kernels)
        self._moments_fold = family_moments_fold_for(xp, config.use_kernels)
        fused = pipeline.fused_scaling
        # Each row's x less its member's shift, then the single model's compiled
        # standardisation with no shift: x - 0.0 is x, bit for bit (-0.0 included).
        self._fused = None if fused is None else FusedScaling(
            lambda x64, counts, sums, sums_sq, min_std, cap, shift: fused.standardize(
                x64 - shift, counts, sums, sums_sq, min_std, cap),
            fused.unit, fused.per_row_side_info)

    def _fill(self, index: int | slice, state: State) -> None:
        """Member(s) ``index`` set to ``state`` (on the family's device: its configuration's)."""
        xp = self._pipeline.xp
        for stacked, w in zip(self._weights, state.weights, strict=True):
            stacked[index] = xp.asarray(w)
        m = state.moments
        self._totals[index] = xp.asarray(m.total)
        self._totals_sq[index] = xp.asarray(m.total_sq)
        self._shifts[index] = xp.asarray(state.moments_shift)
        self._counts[index], self._seen[index] = m.count, state.examples_seen

    def _check_fits(self, model: Any, name: str) -> None:
        """``ValueError`` naming ``model`` unless it is a GLN of the family's configuration and
        hyperplanes."""
        if not isinstance(model, GLN):
            raise ValueError(f"{name} must be a GLN or its snapshot, got {type(model).__name__}")
        ours, theirs = self.config, model.config
        if ours != theirs:
            keys = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
            raise ValueError(f"{name} has another configuration than the family's (differs "
                             f"in {', '.join(keys)}): a family's members share one")
        if not (np.array_equal(to_numpy(model.normals), to_numpy(self._normals))
                and np.array_equal(to_numpy(model.offsets), to_numpy(self._offsets))):
            raise ValueError(f"{name} has other hyperplanes than the family's configuration "
                             "samples: a family's members share them")

    # ------------------------------------------------------------------ members
    @property
    def size(self) -> int:
        """The number of members."""
        return len(self._seen)

    def __len__(self) -> int:
        return self.size

    @property
    def config(self) -> dict[str, Any]:
        """Every member's configuration, as ``GLN.config``."""
        return self._config.as_dict()

    @property
    def use_kernels(self) -> bool:
        """Whether the compiled kernels run (else the array code); not kept in snapshots."""
        return self._config.use_kernels

    @property
    def examples_seen(self) -> np.ndarray:
        """Each member's examples learned (M,), a copy."""
        return self._seen.copy()

    def warm_up(self) -> None:
        """Make the first call of many members as fast as the ones after it; changes nothing
        the family holds. A process's first family call loads the family's kernels (compiles
        them where Numba's cache is empty: seconds), and checks them once
        (``gln.kernels.cpu_family.family_pass_agrees``); a server would otherwise charge that
        to the first pass that learns rows of two members. A family of two members of this
        configuration learns and predicts two rows: the same kernels, on scratch."""
        scratch = GLNFamily(2, **self.config)
        size = self._config.side_info_size
        X = np.zeros((2, self._config.num_features), np.float32)
        side = np.zeros((2, size), np.float32) if size else None
        members = np.arange(2)
        scratch.learn(X, np.zeros(2, np.int64), members, side_info=side)
        scratch.predict_proba(X, members, side_info=side)

    def member(self, index: int) -> GLN:
        """Member ``index`` as a ``GLN`` of its own: a copy, which learns without touching the
        family (``set_member`` puts it back). Its ``to_bytes()`` is a model's snapshot."""
        state = self._member_state(self._index(index), copy=True)
        model = GLN.__new__(GLN)
        model._own(self._config, Pipeline(self._config), state)
        return model

    def member_bytes(self, index: int) -> bytes:
        """``member(index).to_bytes()``, without the copy of the member in between."""
        return snapshot_bytes(self.config, self._member_state(self._index(index), copy=False))

    def set_member(self, index: int, model: Any) -> None:
        """Member ``index`` becomes ``model`` (a ``GLN`` of the family's configuration, or its
        snapshot), as it stands: a tenant restored, or replaced by a fresh model."""
        index = self._index(index)
        if isinstance(model, bytes | bytearray | memoryview):
            model = GLN.from_bytes(model)
        self._check_fits(model, "model")
        with self.lock:
            self._fill(index, model._state)

    def _index(self, index: Any) -> int:
        """``index`` as a member's index; ``ValueError`` naming it where it is not one."""
        if isinstance(index, bool | np.bool_) or not isinstance(index, int | np.integer):
            raise ValueError(f"a member's index must be an integer, got {index!r}")
        if not 0 <= index < self.size:
            raise ValueError(f"member index must be in [0, {self.size}), got {index}")
        return int(index)

    def _member_state(self, index: int, copy: bool) -> State:
        """Member ``index``'s state: views of the family's arrays, or copies (on its device)."""
        own = self._pipeline.xp.copy if copy else (lambda a: a)
        arrays = {
            "normals": own(self._normals), "offsets": own(self._offsets),
            "moments_total": own(self._totals[index]),
            "moments_total_sq": own(self._totals_sq[index]),
            "moments_shift": own(self._shifts[index]),
            **{f"weights_{i}": own(w[index]) for i, w in enumerate(self._weights)},
        }
        return State(arrays, moments_count=int(self._counts[index]),
                     examples_seen=int(self._seen[index]))

    # ------------------------------------------------------------------ checks
    def check_input(
        self, X: Any, y: Any, members: Any, *, strict: bool = False
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """Check a batch as ``GLN.check_input`` does (``y`` None: no labels; ``strict``: values
        outside [0, 1] refused where ``input_scaling="unit"``), and ``members``: one member's
        index per row. Returns X float32 (n, d), y int64 (n,) or None, members int64 (n,);
        ``ValueError`` names what is wrong."""
        X32 = self._config.checked_rows(X, strict=strict)
        labels = None if y is None else self._config.checked_labels(y, len(X32))
        return X32, labels, self._checked_members(members, len(X32))

    def _checked_members(self, members: Any, n: int) -> np.ndarray:
        try:
            index = np.asarray(to_numpy(members) if hasattr(members, "__cuda_array_interface__")
                               else members)
        except (TypeError, ValueError) as error:
            raise ValueError(f"members must be a 1-D array of member indices: {error}") from None
        if index.ndim != 1 or index.shape[0] != n:
            raise ValueError(f"members must be 1-D with one member index per row ({n}), "
                             f"got shape {index.shape}")
        if index.size and index.dtype.kind not in "iu":
            raise ValueError(f"members must be integers, got dtype {index.dtype}")
        valid = (index >= 0) & (index < self.size)
        if not valid.all():
            first = int(np.argmin(valid))
            raise ValueError(f"members must be member indices in [0, {self.size}); "
                             f"members[{first}] is {index[first].item()!r}")
        return np.ascontiguousarray(index, dtype=np.int64)

    # ------------------------------------------------------------------ verbs
    def learn(self, X: Any, y: Any, members: Any, *, side_info: Any = None,
              checked: bool = False) -> np.ndarray:
        """Learn every row, row t as member ``members[t]``'s next example: one OGD step each,
        rows of one member in their order. Returns each row's class probabilities predicted
        before its own update (n, num_classes), as ``GLN.learn``. Each member ends where a
        model of its own that learned its rows in order would, byte for byte. Invalid input
        (a row, a label, a member index, the side information) raises ``ValueError`` before
        anything is learned. ``side_info``: each row's own (n, side_info_size), for members of
        ``side_info="given"``: row t is gated by it in member ``members[t]``.

        ``checked=True``: ``X`` and ``y`` are what ``check_input`` returned, and ``members``
        valid indices (int64 (n,)); none of them is checked again."""
        if y is None:
            raise ValueError("learn needs labels y, one class index per row (predict_proba "
                             "predicts without learning)")
        return self._probabilities(*self._call(X, y, members, side_info, checked))

    def predict_proba(self, X: Any, members: Any, *, side_info: Any = None,
                      checked: bool = False) -> np.ndarray:
        """Class probabilities (n, num_classes) of each row by its member ``members[t]``, as
        that member's ``predict_proba`` (with the row's ``side_info``, where given). Learns
        nothing. ``checked`` as for ``learn``."""
        return self._probabilities(*self._call(X, None, members, side_info, checked))

    def predict(self, X: Any, members: Any, *, side_info: Any = None) -> np.ndarray:
        """The most probable class of each row by its member (n,)."""
        return np.argmax(self.predict_proba(X, members, side_info=side_info), axis=1)

    # ------------------------------------------------------------------ internals
    def _call(self, X: Any, y: Any, members: Any, side_info: Any, checked: bool
              ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray | None]:
        """A call's rows, labels, members and side information, checked unless ``checked``
        says they are (then only the members are made int64)."""
        if checked:
            members = np.ascontiguousarray(members, dtype=np.int64)
        else:
            X, y, members = self.check_input(X, y, members)
        return X, y, members, checks.checked_side_info(side_info, self._config.side_info_size,
                                                       len(X))

    def _probabilities(self, X32: np.ndarray, labels: np.ndarray | None, members: np.ndarray,
                       given: np.ndarray | None) -> np.ndarray:
        """Class probabilities of checked rows, one call at a time; learns given labels."""
        with self.lock:
            return class_probabilities(self._outputs(X32, labels, members, given), len(X32),
                                       self._config.num_classes)

    def _outputs(self, X32: np.ndarray, labels: np.ndarray | None, members: np.ndarray,
                 given: np.ndarray | None = None) -> np.ndarray | None:
        """The networks' outputs (n, G) for checked rows (and their checked side information
        ``given``, where the members take it), chunk by chunk; learns when labels are given."""
        n = len(X32)
        if not n:
            return None
        if labels is not None and self._config.input_scaling == "standardize":
            self._anchor_shifts(X32, members)
        outputs = np.empty((n, self._config.num_glns), np.float32)
        for start, stop in chunk_bounds(n, self._chunk_rows):
            outputs[start:stop] = self._chunk_outputs(
                X32[start:stop], None if labels is None else labels[start:stop],
                members[start:stop], None if given is None else given[start:stop])
        return outputs

    @property
    def _chunk_rows(self) -> int:
        """The device's chunk length, as a model's (``GLN._chunk_rows``)."""
        return CHUNK_ROWS_GPU if self._pipeline.device == "cuda" else CHUNK_ROWS

    def _anchor_shifts(self, X32: np.ndarray, members: np.ndarray) -> None:
        """Each member with nothing learned yet takes its first row here as its shift, as a
        model does at its first row (``GLN._anchor_moments``)."""
        fresh = np.flatnonzero(self._counts[members] == 0)
        if fresh.size:
            xp = self._pipeline.xp
            firsts, at = np.unique(members[fresh], return_index=True)
            self._shifts[xp.asarray(firsts)] = xp.asarray(X32[fresh[at]], dtype=xp.float64)

    def _steps(self, members: np.ndarray) -> np.ndarray:
        """Each row's t (its member's examples before it, plus one), with every member's
        ``examples_seen`` advanced past the chunk."""
        n = len(members)
        order = np.argsort(members, kind="stable")
        ordered = members[order]
        starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
        lengths = np.diff(np.append(starts, n))
        steps = np.empty(n, np.int64)
        steps[order] = self._seen[ordered] + (np.arange(n) - np.repeat(starts, lengths)) + 1
        self._seen[ordered[starts]] += lengths
        return steps

    def _chunk_outputs(self, X32: np.ndarray, labels: np.ndarray | None,
                       members: np.ndarray, given: np.ndarray | None = None) -> np.ndarray:
        """One chunk through every member's network: outputs (n, G) in the chunk's order;
        learns when labels are given. On the GPU the rows go grouped by member (a stable sort,
        so each member's rows keep their order, which is all that a member's bytes depend
        on): its kernels take a member's rows as one run. The CPU's take rows in any order."""
        if self._pipeline.device != "cuda":
            return self._member_outputs(X32, labels, members, given)
        order = np.argsort(members, kind="stable")
        outputs = np.empty((len(X32), self._config.num_glns), np.float32)
        outputs[order] = to_numpy(self._member_outputs(
            X32[order], None if labels is None else labels[order], members[order],
            None if given is None else given[order]))
        return outputs

    def _member_outputs(self, X32: np.ndarray, labels: np.ndarray | None,
                        members: np.ndarray, given: np.ndarray | None) -> Any:
        """``gln.pipeline.Pipeline.outputs`` with a member per row: outputs (n, G) on the
        family's device (rows grouped by member there, on the GPU)."""
        config, pipeline, xp = self._config, self._pipeline, self._pipeline.xp
        n, glns = len(X32), config.num_glns
        x64 = xp.asarray(X32).astype(xp.float64)
        rows_members = xp.asarray(members)  # to gather the members' state on the device
        learning = labels is not None
        if learning:  # as gln.staging.Staging.staged: float32 rates, one-vs-all targets
            counts, sums, sums_sq = self._moments_fold(
                members, x64, self._shifts, self._counts, self._totals, self._totals_sq)
            rates = config.schedule(self._steps(members)).astype(np.float32)
            if glns == 1:
                targets = (labels == 1).astype(np.float32)[:, None]
            else:
                targets = (labels[:, None] == np.arange(glns)).astype(np.float32)
        else:
            counts = xp.asarray(self._counts[members].astype(np.float64)[:, None])
            sums, sums_sq = self._totals[rows_members], self._totals_sq[rows_members]
            rates, targets = np.zeros(n, np.float32), np.zeros((n, glns), np.float32)
        z, base_logits = scale_inputs(
            xp, x64, counts, sums, sums_sq, mode=config.input_scaling,
            pred_clip=config.pred_clip, min_std=config.min_std, side_info=config.side_info,
            blur=pipeline.blur, fused=self._fused, shift=self._shifts[rows_members],
            given=None if given is None else xp.asarray(given))
        contexts = pipeline.layer_contexts(z, self._normals, self._offsets, config.context_dim,
                                           glns, config.layer_sizes)
        return self._network_pass(
            self._weights, members, contexts, base_logits, xp.asarray(targets),
            xp.asarray(rates), bias_logit=config.bias_logit, pred_clip=config.pred_clip,
            weight_clip=config.weight_clip, learn=learning)

    def __repr__(self) -> str:
        config = self._config
        return (f"GLNFamily(size={self.size}, num_features={config.num_features}, "
                f"num_classes={config.num_classes}, layer_sizes={config.layer_sizes}, "
                f"context_dim={config.context_dim})")
