"""A scikit-learn classifier around ``gln.GLN``: ``fit``, ``partial_fit``, ``predict``,
``predict_proba``, ``score``, and pipelines, grid searches, ``clone`` and pickles with them.

Needs scikit-learn (``pip install 'gln-service[sklearn]'``); ``import gln`` never imports it.
The constructor's arguments are ``GLN``'s configuration, stored as given and checked at the
first ``fit`` or ``partial_fit`` (``GLN``'s ``ValueError`` naming the argument); the width of
a row and the classes come from the data. docs/adapters.md sets it beside scikit-learn's
``SGDClassifier`` and lists the estimator checks it does not pass, with why.

>>> import numpy as np
>>> from gln.sklearn import GLNClassifier
>>> X = np.array([[0.0, 1.0], [1.0, 0.0]] * 50)
>>> y = np.array(["spam", "ham"] * 50)
>>> clf = GLNClassifier(layer_sizes=(8, 1)).fit(X, y)
>>> clf.classes_.tolist()
['ham', 'spam']
>>> clf.predict(X[:2]).tolist()
['spam', 'ham']
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any, Self

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from gln.model import GLN
from gln.schedules import DEFAULT_LEARNING_RATE
from gln.state import DEFAULT_CONTEXT_DIM, DEFAULT_LAYER_SIZES


class GLNClassifier(ClassifierMixin, BaseEstimator):
    """A Gated Linear Network as a scikit-learn classifier.

    Parameters: those of ``gln.GLN`` (see there) but ``num_features`` and ``num_classes``
    (the data's) and ``side_info_size`` (side information given with each row, which
    ``fit(X, y)`` has no place for: ``side_info`` is ``"scaled"`` or ``"per_row"`` here), with
    its defaults, and

    epochs: passes over the rows that ``fit`` makes, each in the rows' order (default 1: one
        online pass, the GLN's own setting). More passes help where a dataset is small for the
        network (scikit-learn's ``SGDClassifier`` makes up to ``max_iter`` of them);
        ``partial_fit`` always makes one.

    Attributes after fitting: ``classes_`` (the labels, sorted; class index i of the GLN is
    ``classes_[i]`` and column i of ``predict_proba``), ``n_features_in_``,
    ``feature_names_in_`` (for a DataFrame with string column names) and ``model_``, the
    ``GLN`` itself (``model_.to_bytes()`` is the snapshot the service imports).

    ``fit`` starts a new model each time; ``partial_fit`` continues the one there is (the
    first call needs ``classes``, every label there will be). The rows are learned in order,
    one online step each, exactly as ``GLN.learn``: ``partial_fit`` over a dataset's chunks
    leaves the same model, byte for byte, as ``fit`` on the whole.

    The class lists ``ClassifierMixin`` before ``BaseEstimator``, the order scikit-learn's
    checks ask for.
    """

    def __init__(
        self,
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
        side_info_blur: float = 0.0,
        image_shape: Sequence[int] | None = None,
        gating_window: int = 0,
        seed: int = 0,
        device: str = "cpu",
        use_kernels: bool = True,
        epochs: int = 1,
    ) -> None:
        self.layer_sizes = layer_sizes
        self.context_dim = context_dim
        self.learning_rate = learning_rate
        self.pred_clip = pred_clip
        self.weight_clip = weight_clip
        self.bias = bias
        self.offset_scale = offset_scale
        self.input_scaling = input_scaling
        self.min_std = min_std
        self.side_info = side_info
        self.side_info_blur = side_info_blur
        self.image_shape = image_shape
        self.gating_window = gating_window
        self.seed = seed
        self.device = device
        self.use_kernels = use_kernels
        self.epochs = epochs

    def fit(self, X: Any, y: Any) -> Self:
        """A new model, learning the rows in order ``epochs`` times."""
        if (isinstance(self.epochs, bool) or not isinstance(self.epochs, numbers.Integral)
                or self.epochs < 1):
            raise ValueError(f"epochs must be a whole number >= 1, got {self.epochs!r}")
        X, y = validate_data(self, X, y, dtype=np.float32, order="C")
        check_classification_targets(y)
        classes = np.unique(y)
        model = self._new_model(X.shape[1], classes)
        self.classes_, self.model_ = classes, model  # before _indices, which reads classes_
        indices = self._indices(y)
        for _ in range(self.epochs):
            model.learn(X, indices, checked=True)
        return self

    def partial_fit(self, X: Any, y: Any, classes: Any = None) -> Self:
        """Learn the rows in order, once, continuing the model; its first call makes the model
        and needs ``classes``, every label there will be (scikit-learn's convention)."""
        first = not hasattr(self, "model_")
        X, y = validate_data(self, X, y, dtype=np.float32, order="C", reset=first)
        check_classification_targets(y)
        if classes is not None:
            classes = np.unique(np.asarray(classes))
        if first:
            if classes is None:
                raise ValueError("classes must be given on the first call to partial_fit: "
                                 "every label the model will see, e.g. classes=np.unique(y)")
            self.classes_, self.model_ = classes, self._new_model(X.shape[1], classes)
        elif classes is not None and not np.array_equal(classes, self.classes_):
            raise ValueError(f"classes={classes.tolist()} differs from the first call's "
                             f"{self.classes_.tolist()}")
        self.model_.learn(X, self._indices(y), checked=True)
        return self

    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities (n, len(classes_)), column i for ``classes_[i]``; learns
        nothing."""
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float32, order="C", reset=False)
        return self.model_.predict_proba(X)

    def predict(self, X: Any) -> np.ndarray:
        """The most probable label of each row (n,)."""
        probabilities = self.predict_proba(X)  # first: NotFittedError before fit
        return self.classes_[np.argmax(probabilities, axis=1)]

    def _new_model(self, num_features: int, classes: np.ndarray) -> GLN:
        """A new GLN of this configuration for ``classes``; ``GLN``'s ``ValueError`` for an
        argument it refuses."""
        if len(classes) < 2:
            raise ValueError(f"GLNClassifier needs at least 2 classes, got {len(classes)} "
                             f"class: {classes.tolist()}")
        config = self.get_params()
        del config["epochs"]
        return GLN(num_features=num_features, num_classes=len(classes), **config)

    def _indices(self, y: np.ndarray) -> np.ndarray:
        """The class index (int64) of each label; ``ValueError`` naming the first label that
        is not in ``classes_``."""
        indices = np.searchsorted(self.classes_, y)
        known = indices < len(self.classes_)
        known[known] = self.classes_[indices[known]] == y[known]
        if not known.all():
            first = int(np.argmin(known))
            label = y[first:first + 1].tolist()[0]  # as Python has it, not np.str_('a')
            raise ValueError(f"y[{first}] = {label!r} is not one of classes_ "
                             f"{self.classes_.tolist()}")
        return indices.astype(np.int64)
