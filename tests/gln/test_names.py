"""Feature and class names: rows by name (dicts, DataFrames), labels by name, names kept in
snapshots, and each mistake named."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gln import GLN

FEATURES = ["amount", "country_risk", "hour"]
CLASSES = ["ok", "fraud"]


def named_model(**kwargs) -> GLN:
    return GLN(3, 2, layer_sizes=(4, 1), feature_names=FEATURES, class_names=CLASSES, **kwargs)


def test_rows_and_labels_by_name_learn_what_their_positional_twins_learn():
    rows = np.random.default_rng(0).normal(size=(40, 3))
    labels = (rows[:, 0] > 0).astype(int)
    by_name, by_place = named_model(), GLN(3, 2, layer_sizes=(4, 1))
    dicts = [dict(zip(reversed(FEATURES), reversed(row.tolist()), strict=True)) for row in rows]
    by_name.learn(dicts, [CLASSES[label] for label in labels])
    by_place.learn(rows, labels)
    for named_layer, placed_layer in zip(by_name.weights, by_place.weights, strict=True):
        np.testing.assert_array_equal(named_layer, placed_layer)
    frame = pd.DataFrame(rows[:5], columns=FEATURES)[["hour", "amount", "country_risk"]]
    np.testing.assert_array_equal(by_name.predict_proba(frame), by_place.predict_proba(rows[:5]))


def test_labels_may_mix_names_and_indices_and_predict_names_answers_by_name():
    model = named_model()
    _, labels = model.check_input([[0, 0, 0]] * 3, ["fraud", 0, np.str_("ok")])
    assert labels.tolist() == [1, 0, 0]
    assert model.predict_names([[1.0, 2.0, 3.0]]).tolist()[0] in CLASSES
    assert GLN(3).predict_names([[1.0, 2.0, 3.0]]).dtype.kind == "i"


def test_names_survive_a_snapshot_and_a_model_without_them_keeps_its_old_header():
    restored = GLN.from_bytes(named_model().to_bytes())
    assert (restored.feature_names, restored.class_names) == (tuple(FEATURES), tuple(CLASSES))
    assert {"feature_names", "class_names"}.isdisjoint(GLN(3).config)


@pytest.mark.parametrize(("rows", "message"), [
    ([{"amount": 1, "country_risk": 2}], r"row 0 lacks 'hour'; the model's features are"),
    ([{"amount": 1, "country_risk": 2, "hour": 3, "zip": 4}], r"row 0 has unknown 'zip'"),
    ([{"amount": 1, "country_risk": 2, "hour": 3}, [1, 2, 3]], "row 1 is not given by name"),
    (pd.DataFrame({"amount": [1.0], "hour": [2.0]}), "the DataFrame lacks 'country_risk'"),
])
def test_a_row_by_name_that_does_not_fit_is_named(rows, message):
    with pytest.raises(ValueError, match=message):
        named_model().check_input(rows)


def test_an_unknown_class_name_and_names_sent_to_an_unnamed_model_are_refused():
    with pytest.raises(ValueError, match=r"labels\[1\] is 'fruad', which is no class"):
        named_model().check_labels(["ok", "fruad"])
    with pytest.raises(ValueError, match="need a model with class_names"):
        GLN(3).check_labels(["ok"])
    with pytest.raises(ValueError, match="need a model with feature_names"):
        GLN(3).check_input([{"amount": 1.0}])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"feature_names": ["a", "b"]}, r"one name per feature \(3\), got 2"),
    ({"feature_names": ["a", "b", "a"]}, "'a' appears twice"),
    ({"feature_names": "abc"}, "a list of 3 strings"),
    ({"feature_names": ["a", "", "c"]}, r"feature_names\[1\] must be a string of 1 to 200"),
    ({"class_names": ["yes", 1]}, r"class_names\[1\] must be a string"),
    ({"class_names": ["a", "b", "c"]}, r"one name per class \(2\), got 3"),
])
def test_names_that_do_not_fit_the_model_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GLN(3, 2, **kwargs)
