"""Named features and classes over HTTP: a model created with ``feature_names`` and
``class_names`` takes rows as objects by name and labels as names (JSON and ``.npz``), answers
predictions with the most probable class by name, keeps its names through export and import,
and refuses a row or label that does not fit with a 422 naming it (nothing learned). Each test
runs over the engine in the app's process and over one across a socket (``GLN_WORKERS`` > 1).
"""

from __future__ import annotations

import io
from typing import Any

import httpx
import numpy as np
import pytest

from gln import GLN

FEATURES = ["amount", "country_risk", "hour", "age", "score", "count"]
CLASSES = ["ok", "fraud", "review"]
NPZ = {"content-type": "application/x-npz", "accept": "application/x-npz"}


def npz(**arrays: Any) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


@pytest.fixture
def named_config(small_config: dict[str, Any]) -> dict[str, Any]:
    return {**small_config, "feature_names": FEATURES, "class_names": CLASSES}


async def test_rows_and_labels_by_name_learn_as_their_lists_and_indices_would(
    engine_client: httpx.AsyncClient, create_model, make_data, small_config, named_config
):
    info = await create_model(engine_client, "named", named_config)
    assert (info["config"]["feature_names"], info["config"]["class_names"]) == (FEATURES,
                                                                                CLASSES)
    X, y = make_data(12)
    by_name = [dict(reversed(list(zip(FEATURES, row, strict=True)))) for row in X]
    learned = await engine_client.post("/v1/models/named/learn", json={
        "features": by_name[:6], "labels": [CLASSES[label] for label in y[:6]]})
    binary = await engine_client.post("/v1/models/named/learn", headers=NPZ, content=npz(
        features=np.asarray(X[6:]), labels=np.asarray([CLASSES[label] for label in y[6:]])))
    assert learned.status_code == 200 and binary.status_code == 200, (learned.text, binary.text)
    reference = GLN(**small_config)
    probs = reference.learn(np.asarray(X), np.asarray(y))
    np.testing.assert_array_equal(learned.json()["probabilities"], probs[:6])
    np.testing.assert_array_equal(np.load(io.BytesIO(binary.content))["probabilities"], probs[6:])

    predicted = await engine_client.post("/v1/models/named/predict",
                                         json={"features": by_name[:4]})
    expected = reference.predict_proba(np.asarray(X[:4]))
    np.testing.assert_array_equal(predicted.json()["probabilities"], expected)
    assert predicted.json()["classes"] == [CLASSES[i] for i in expected.argmax(axis=1)]
    as_npz = await engine_client.post("/v1/models/named/predict", headers=NPZ,
                                      content=npz(features=np.asarray(X[:4])))
    assert np.load(io.BytesIO(as_npz.content))["classes"].tolist() == predicted.json()["classes"]


async def test_a_model_without_class_names_answers_each_rows_class_index(
    engine_client: httpx.AsyncClient, create_model, make_data
):
    await create_model(engine_client)
    X, _ = make_data(5)
    answer = (await engine_client.post("/v1/models/m/predict", json={"features": X})).json()
    assert answer["classes"] == np.argmax(answer["probabilities"], axis=1).tolist()


async def test_delayed_labels_may_be_class_names(
    engine_client: httpx.AsyncClient, create_model, make_data, named_config
):
    await create_model(engine_client, "named", named_config)
    X, y = make_data(3)
    await engine_client.post("/v1/models/named/predict", json={"features": X,
                                                               "ids": ["a", "b", "c"]})
    r = await engine_client.post("/v1/models/named/labels", json={
        "ids": ["a", "b", "c"], "labels": [CLASSES[label] for label in y]})
    assert r.status_code == 200, r.text
    assert r.json()["learned"] == 3


@pytest.mark.parametrize(("body", "detail"), [
    ({"features": [{"amount": 1.0}], "labels": ["ok"]},
     "features: row 0 lacks 'country_risk', 'hour', 'age', 'score', 'count'; the model's "
     "features are 'amount', 'country_risk', 'hour', 'age', 'score', 'count'"),
    ({"features": [dict.fromkeys([*FEATURES, "zip"], 0.0)], "labels": ["ok"]},
     "features: row 0 has unknown 'zip'"),
    ({"features": [dict.fromkeys(FEATURES, 0.0)], "labels": ["fruad"]},
     "labels[0] is 'fruad', which is no class of this model: its classes are 'ok', 'fraud', "
     "'review'"),
])
async def test_a_row_or_label_that_does_not_fit_the_names_is_a_422_naming_it(
    engine_client: httpx.AsyncClient, create_model, named_config, body, detail: str
):
    await create_model(engine_client, "named", named_config)
    r = await engine_client.post("/v1/models/named/learn", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith(detail)
    assert (await engine_client.get("/v1/models/named")).json()["examples_seen"] == 0


async def test_names_that_do_not_fit_the_config_are_refused_at_create(
    engine_client: httpx.AsyncClient, small_config
):
    r = await engine_client.post("/v1/models", json={"name": "m", "config": {
        **small_config, "class_names": ["ok", "fraud"]}})
    assert r.status_code == 422, r.text
    assert "class_names must give one name per class (3), got 2" in r.json()["detail"]


async def test_names_travel_with_an_export(
    engine_client: httpx.AsyncClient, create_model, named_config
):
    await create_model(engine_client, "named", named_config)
    blob = (await engine_client.get("/v1/models/named/export")).content
    imported = await engine_client.post("/v1/models/copy/import", content=blob,
                                        headers={"content-type": "application/octet-stream"})
    assert imported.status_code == 201, imported.text
    assert imported.json()["config"]["class_names"] == CLASSES
    r = await engine_client.post("/v1/models/copy/learn", json={
        "features": [dict.fromkeys(FEATURES, 0.5)], "labels": ["review"]})
    assert r.status_code == 200, r.text
