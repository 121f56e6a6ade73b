"""One member of a family (``gln.family``) served as a model of its own: learned, predicted,
explained and snapshotted in place, in the family's arrays.

A host that keeps many tenants of one configuration in one ``GLNFamily`` serves each tenant
through its ``FamilyMember``: the verbs of a ``GLN`` that a server calls for one model, while
the host remains free to learn rows of many members in one ``GLNFamily.learn``. A member is a
view: what the family holds for its index is what it is, and ``set`` puts another model there
(a restore, a rebuild).

A call of one member's rows runs the single model's code on a ``GLN`` whose arrays are views
of the member's in the family (its "shell", made once), the counters copied in before and
out after: a family call has a fixed cost of its own (~30 us: rows sorted by member, each
member's statistics gathered), which a call of one member need not pay. Both give the bytes a
model of its own would (``gln.family``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from gln.model import GLN
from gln.scaling import RunningMoments

if TYPE_CHECKING:
    from gln.family import GLNFamily
    from gln.state import State


class FamilyMember:
    """Member ``index`` of ``family`` (``ValueError`` if it has no such member). Like a ``GLN``,
    not safe to call from two threads at once for one member; members of one family may be
    called from different threads (the family takes one call at a time)."""

    def __init__(self, family: GLNFamily, index: int) -> None:
        self.family, self.index = family, family._index(index)
        self._config = family._config
        self._shell_model: GLN | None = None
        self._state_nbytes = self._state.nbytes  # fixed by the configuration

    def _shell(self) -> GLN:
        """(family lock) The single model on views of this member's arrays, its counters
        copied in from the family's (``_counters_out`` copies them back)."""
        family, i = self.family, self.index
        shell = self._shell_model
        if shell is None:  # the family's code paths: one copy of the normals for all
            shell = self._shell_model = GLN.__new__(GLN)
            shell._own(self._config, family._pipeline, family._member_state(i, copy=False))
        state = shell._state
        state.examples_seen = int(family._seen[i])
        state.moments = RunningMoments(int(family._counts[i]), family._totals[i],
                                       family._totals_sq[i])
        return shell

    def _counters_out(self, shell: GLN) -> None:
        """(family lock) The shell's counters and statistics back into the family's arrays."""
        family, i, state = self.family, self.index, shell._state
        family._seen[i] = state.examples_seen
        family._counts[i] = state.moments.count
        family._totals[i] = state.moments.total  # in place already, or new arrays
        family._totals_sq[i] = state.moments.total_sq

    # ------------------------------------------------------------------ what it is
    @property
    def config(self) -> dict[str, Any]:
        """The configuration, as ``GLN.config``."""
        return self.family.config

    @property
    def num_features(self) -> int:
        return self._config.num_features

    @property
    def num_classes(self) -> int:
        return self._config.num_classes

    @property
    def layer_sizes(self) -> tuple[int, ...]:
        return self._config.layer_sizes

    @property
    def examples_seen(self) -> int:
        """Examples learned, as ``GLN.examples_seen``."""
        return int(self.family._seen[self.index])

    @property
    def moments(self) -> RunningMoments:
        """The running input statistics, as ``GLN.moments`` (views of the family's arrays)."""
        return self._state.moments

    @property
    def weights(self) -> list[Any]:
        """Each layer's weights, as ``GLN.weights`` (views of the family's arrays, on its
        device)."""
        return self._state.weights

    @property
    def _state(self) -> State:
        """The member's state as views of the family's arrays, as ``GLN._state`` is read by
        ``gln.serialize.SnapshotBuffer``."""
        return self.family._member_state(self.index, copy=False)

    @property
    def nbytes(self) -> int:
        """What a ``GLN`` of its own would hold (the hyperplanes and the copy of the normals
        are the family's, shared by every member)."""
        return self._state_nbytes + self.family._pipeline.nbytes

    def config_for_estimate(self) -> dict[str, Any]:
        """As ``GLN.config_for_estimate``."""
        return self._config.for_estimate("cpu")

    # ------------------------------------------------------------------ checks
    def check_input(
        self, X: Any, y: Any = None, *, strict: bool = False
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """As ``GLN.check_input``."""
        X32 = self._config.checked_rows(X, strict=strict)
        return X32, None if y is None else self._config.checked_labels(y, len(X32))

    def check_labels(self, y: Any, num_rows: int | None = None) -> np.ndarray:
        """As ``GLN.check_labels``."""
        return self._config.checked_labels(y, num_rows)

    def class_of(self, probabilities: np.ndarray) -> np.ndarray:
        """As ``GLN.class_of``."""
        return self._config.class_of(probabilities)

    # ------------------------------------------------------------------ verbs
    def learn(self, X: Any, y: Any, *, checked: bool = False) -> np.ndarray:
        """As ``GLN.learn``: every row learned as this member's, in order."""
        if not checked:
            if y is None:
                raise ValueError("learn needs labels y, one class index per row")
            X, y = self.check_input(X, y)
        with self.family.lock:
            shell = self._shell()
            try:
                return shell.learn(X, y, checked=True)
            finally:
                self._counters_out(shell)

    def predict_proba(self, X: Any, *, checked: bool = False) -> np.ndarray:
        """As ``GLN.predict_proba``."""
        if not checked:
            X, _ = self.check_input(X)
        with self.family.lock:
            return self._shell().predict_proba(X, checked=True)

    def predict(self, X: Any) -> np.ndarray:
        """The most probable class of each row (n,)."""
        return np.argmax(self.predict_proba(X), axis=1)

    def saliency(self, X: Any) -> np.ndarray:
        """As ``GLN.saliency``."""
        with self.family.lock:
            return self._shell().saliency(X)

    def warm_up(self) -> None:
        """As ``GLN.warm_up``: loads the kernels, learns nothing."""
        self.predict_proba(np.zeros((1, self.num_features), dtype=np.float32), checked=True)

    def to_bytes(self) -> bytes:
        """The member's snapshot, as ``GLN.to_bytes`` of a model of its own."""
        return self.family.member_bytes(self.index)

    def set(self, model: GLN | bytes) -> None:
        """This member becomes ``model`` (a ``GLN`` of the family's configuration, or its
        snapshot), as it stands."""
        self.family.set_member(self.index, model)

    def __repr__(self) -> str:
        return f"FamilyMember({self.index} of {self.family!r})"
