"""A River classifier around ``gln.GLN``: rows as dicts, one at a time (``learn_one``,
``predict_proba_one``, ``predict_one``) or as pandas DataFrames (``learn_many``,
``predict_proba_many``, ``predict_many``).

With River installed (``pip install 'gln-service[river]'``) the class is a
``river.base.MiniBatchClassifier``, so River's pipelines, metrics and
``river.evaluate.progressive_val_score`` take it; without River it has the same methods (the
``*_many`` ones need pandas). ``import gln`` imports neither. docs/adapters.md sets it beside
River's ``LogisticRegression``.

A GLN's size is fixed when it is made, so two things a River model usually discovers online are
fixed here: the labels, given up front (``classes``; ``(False, True)`` by default, which ``0``
and ``1`` also match), and the features, taken from the first row the model sees (its keys, or
a DataFrame's columns). A later row must have exactly those keys, in any order: a missing or a
new one is a ``ValueError`` naming it. The GLN's columns are the features sorted by name (as
strings), so the order of a row's keys, the first row's too, never changes what is learned.

>>> from gln.river import GLNRiverClassifier
>>> model = GLNRiverClassifier(classes=("ham", "spam"), layer_sizes=(8, 1))
>>> for _ in range(50):
...     model.learn_one({"links": 9.0, "words": 10.0}, "spam")
...     model.learn_one({"links": 0.0, "words": 200.0}, "ham")
>>> model.predict_one({"words": 12.0, "links": 7.0})
'spam'
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from gln.model import GLN

if TYPE_CHECKING:
    import pandas as pd

try:
    from river.base import MiniBatchClassifier as _Classifier
except ImportError:  # River is optional: the same methods, without River's base class
    _Classifier = object


class GLNRiverClassifier(_Classifier):
    """A Gated Linear Network as a River classifier.

    classes: every label the model will see, at least two; the order is the GLN's class
        order (class index i is ``classes[i]``).
    config: ``gln.GLN``'s keyword arguments but ``num_features`` (the first row's width) and
        ``num_classes`` (``len(classes)``), checked here (``GLN``'s ``ValueError`` naming
        the argument, ``TypeError`` for one it does not take).

    ``model`` is the ``GLN`` once a row has made it (``None`` before): its ``to_bytes()`` is
    the snapshot the service imports; ``features`` the feature names in the GLN's column order.
    Every ``learn_one`` is one ``GLN.learn`` step, and ``learn_many`` learns its rows in order
    exactly as ``learn_one`` would, row by row.
    """

    def __init__(self, classes: Sequence[Hashable] = (False, True), **config: Any) -> None:
        self.classes = classes
        self.config = config
        labels = list(classes)
        if len(labels) < 2 or len(set(labels)) < len(labels):
            raise ValueError(f"classes must be at least 2 distinct labels, got {classes!r}")
        for fixed in ("num_features", "num_classes"):
            if fixed in config:
                raise TypeError(f"{fixed} is not an argument here: the first row gives the "
                                "number of features, classes the number of classes")
        # Any width checks the rest; an image's rows are as wide as the image.
        width = math.prod(config.get("image_shape") or (1,))
        GLN.check_config({"num_features": width, "num_classes": len(labels), **config})
        self._labels = labels
        self._index = {label: i for i, label in enumerate(labels)}
        self.features: list[Hashable] | None = None
        self.model: GLN | None = None

    @property
    def _multiclass(self) -> bool:
        """River's flag: more than two classes (a binary metric refuses such a model)."""
        return len(self._labels) > 2

    # ------------------------------------------------------------------ one row
    def learn_one(self, x: dict[Hashable, Any], y: Hashable) -> None:
        """Learn one row: one online step of the GLN."""
        row = self._row(x)
        self._model_for(x).learn(row, [self._class_index(y)])

    def predict_proba_one(self, x: dict[Hashable, Any]) -> dict[Hashable, float]:
        """The probability of each label; learns nothing."""
        row = self._row(x)
        probabilities = self._model_for(x).predict_proba(row)[0]
        return dict(zip(self._labels, probabilities.tolist(), strict=True))

    def predict_one(self, x: dict[Hashable, Any]) -> Hashable:
        """The most probable label."""
        probabilities = self.predict_proba_one(x)
        return max(probabilities, key=probabilities.__getitem__)

    # ------------------------------------------------------------------ many rows
    def learn_many(self, X: pd.DataFrame, y: pd.Series) -> None:
        """Learn the rows in order, exactly as ``learn_one`` would one by one."""
        rows = self._rows(X)
        self._model_for(X.columns).learn(
            rows, [self._class_index(label, i) for i, label in enumerate(y)])

    def predict_proba_many(self, X: pd.DataFrame) -> pd.DataFrame:
        """The probability of each label (a column per label, in ``classes`` order) for each
        row (``X``'s index); learns nothing."""
        import pandas as pd

        rows = self._rows(X)
        probabilities = self._model_for(X.columns).predict_proba(rows)
        return pd.DataFrame(probabilities, index=X.index, columns=self._labels)

    def predict_many(self, X: pd.DataFrame) -> pd.Series:
        """The most probable label of each row."""
        return self.predict_proba_many(X).idxmax(axis="columns")

    # ------------------------------------------------------------------ internals
    def _model_for(self, features: Any) -> GLN:
        """The GLN, made for ``features`` (a row's keys, a frame's columns) if it is the first
        row the model sees."""
        if self.model is None:
            self.features = sorted(features, key=str)
            self.model = GLN(num_features=len(self.features), num_classes=len(self._labels),
                             **self.config)
        return self.model

    def _row(self, x: dict[Hashable, Any]) -> np.ndarray:
        """``x``'s values (1, num_features) in the model's feature order."""
        features = self.features if self.features is not None else sorted(x, key=str)
        self._check_features(x.keys(), features)
        return self._numbers([[x[name] for name in features]])

    def _rows(self, X: pd.DataFrame) -> np.ndarray:
        """``X``'s values (n, num_features) in the model's feature order."""
        features = self.features if self.features is not None else sorted(X.columns, key=str)
        self._check_features(X.columns, features)
        return self._numbers(X[features].to_numpy())

    @staticmethod
    def _check_features(names: Any, features: list[Hashable]) -> None:
        """``ValueError`` unless ``names`` are exactly ``features``, in any order."""
        if len(names) == len(features) and all(name in names for name in features):
            return
        missing = [name for name in features if name not in names]
        new = [name for name in names if name not in set(features)]
        raise ValueError(f"a row's features must be the model's {features} (fixed by the "
                         f"first row it saw): missing {missing}, new {new}")

    @staticmethod
    def _numbers(values: Any) -> np.ndarray:
        """``values`` as float64; ``ValueError`` for one that is not a number."""
        try:
            return np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError) as error:
            raise ValueError(f"every feature's value must be a number: {error}") from None

    def _class_index(self, label: Hashable, position: int | None = None) -> int:
        """The class index of ``label``; ``position``: where it stands in a batch's labels,
        for the error."""
        try:
            return self._index[label]
        except (KeyError, TypeError):
            where = "y" if position is None else f"y[{position}]"
            raise ValueError(f"{where} = {label!r} is not one of classes {self._labels}"
                             ) from None
