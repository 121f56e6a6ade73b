"""gln.sklearn.GLNClassifier: scikit-learn's estimator checks, labels of any kind, and the
same model as a plain GLN learning the same rows."""

from __future__ import annotations

import inspect
import pickle
import subprocess
import sys

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.utils.estimator_checks import parametrize_with_checks

from gln import GLN
from gln.sklearn import GLNClassifier

# Every check scikit-learn runs on a classifier passes (docs/adapters.md); a check that stops
# passing fails here, and one added to this table with its reason is documented there too.
EXPECTED_FAILED_CHECKS: dict[str, str] = {}


@parametrize_with_checks([GLNClassifier()],
                         expected_failed_checks=lambda _: EXPECTED_FAILED_CHECKS)
def test_scikit_learn_estimator_checks(estimator, check):
    check(estimator)


def small(**overrides) -> GLNClassifier:
    return GLNClassifier(**{"layer_sizes": (8, 4, 1), "context_dim": 3, "seed": 7,
                            **overrides})


def rows(n: int = 120, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Rows of 4 features and string labels of three classes, first seen out of order."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4))
    y = np.array(["spam", "ham", "eggs"])[(X[:, 0] > 0).astype(int) + (X[:, 1] > 1)]
    return X, y


def plain_gln(X: np.ndarray, indices: np.ndarray, num_classes: int, passes: int = 1) -> GLN:
    """The GLN that the small classifier should hold after ``passes`` over the rows."""
    model = GLN(num_features=X.shape[1], num_classes=num_classes, layer_sizes=(8, 4, 1),
                context_dim=3, seed=7)
    for _ in range(passes):
        model.learn(X, indices)
    return model


def test_the_constructor_takes_the_glns_configuration_with_its_defaults():
    # What the data decides is not a parameter: the width and the classes, and their names
    # (scikit-learn's feature_names_in_ and classes_).
    # Nor side information given beside the rows, which fit(X, y) has no place for.
    from_data = ("num_features", "num_classes", "feature_names", "class_names",
                 "side_info_size")
    gln_arguments = {name: p.default for name, p in inspect.signature(GLN).parameters.items()
                     if name not in from_data}
    assert GLNClassifier().get_params() == {**gln_arguments, "epochs": 1}


def test_string_labels_map_to_sorted_class_indices_and_back():
    X, y = rows()
    clf = small().fit(X, y)
    assert clf.classes_.tolist() == ["eggs", "ham", "spam"]
    indices = np.searchsorted(clf.classes_, y)
    model = plain_gln(X, indices, 3)
    assert clf.model_.to_bytes() == model.to_bytes()
    probabilities = clf.predict_proba(X)  # column i is classes_[i]
    np.testing.assert_array_equal(probabilities, model.predict_proba(X))
    np.testing.assert_array_equal(clf.predict(X), clf.classes_[model.predict(X)])
    assert clf.score(X, y) > 0.8


def test_binary_integer_labels_keep_their_order():
    X, y = rows()
    labels = np.where(y == "spam", 7, -3)
    clf = small().fit(X, labels)
    assert clf.classes_.tolist() == [-3, 7]
    assert clf.model_.to_bytes() == plain_gln(X, (labels == 7).astype(int), 2).to_bytes()
    assert set(clf.predict(X).tolist()) == {-3, 7}


def test_partial_fit_in_chunks_leaves_the_bytes_of_fit():
    X, y = rows()
    whole = small().fit(X, y)
    chunked = small()
    for start in range(0, len(X), 50):
        chunked.partial_fit(X[start:start + 50], y[start:start + 50],
                            classes=["spam", "ham", "eggs"] if start == 0 else None)
    assert chunked.model_.to_bytes() == whole.model_.to_bytes()
    assert chunked.model_.examples_seen == len(X)


def test_partial_fit_needs_classes_first_and_refuses_labels_outside_them():
    X, y = rows()
    clf = small()
    with pytest.raises(ValueError, match="classes must be given on the first call"):
        clf.partial_fit(X, y)
    clf.partial_fit(X[:10], y[:10], classes=["eggs", "ham", "spam"])
    before = clf.model_.to_bytes()
    with pytest.raises(ValueError, match=r"y\[1\] = 'toast' is not one of classes_"):
        clf.partial_fit(X[:2], np.array(["ham", "toast"]))
    with pytest.raises(ValueError, match="differs from the first call's"):
        clf.partial_fit(X[:2], y[:2], classes=["ham", "spam"])
    assert clf.model_.to_bytes() == before  # nothing learned from a refused call


def test_epochs_are_passes_over_the_rows_in_order():
    X, y = rows()
    clf = small(epochs=3).fit(X, y)
    assert clf.model_.to_bytes() == plain_gln(X, np.searchsorted(clf.classes_, y), 3,
                                              passes=3).to_bytes()
    with pytest.raises(ValueError, match="epochs must be a whole number >= 1, got 0"):
        small(epochs=0).fit(X, y)


def test_the_configuration_is_checked_at_fit_and_names_the_argument():
    clf = GLNClassifier(pred_clip=0.7)  # stored as given
    assert clf.pred_clip == 0.7
    with pytest.raises(ValueError, match="pred_clip must be in"):
        clf.fit(*rows())
    with pytest.raises(ValueError, match="at least 2 classes, got 1 class"):
        small().fit(np.ones((5, 4)), ["ham"] * 5)


def test_fit_starts_a_new_model_each_time():
    X, y = rows()
    clf = small().fit(X, y)
    first = clf.model_.to_bytes()
    assert clf.fit(X, y).model_.to_bytes() == first


def test_a_pickled_classifier_predicts_the_same_and_a_clone_is_unfitted():
    X, y = rows()
    clf = small().fit(X, y)
    copied = pickle.loads(pickle.dumps(clf))
    assert copied.model_.to_bytes() == clf.model_.to_bytes()
    np.testing.assert_array_equal(copied.predict_proba(X), clf.predict_proba(X))
    fresh = clone(clf)
    assert fresh.get_params() == clf.get_params()
    assert not hasattr(fresh, "model_")
    assert fresh.fit(X, y).model_.to_bytes() == clf.model_.to_bytes()


def test_import_gln_imports_neither_scikit_learn_nor_river():
    code = ("import sys, gln; print(sorted(m for m in ('sklearn', 'river', 'pandas') "
            "if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=120)
    assert result.stdout.strip() == "[]"
