"""What a client reads when a request body is not of the API's shape: one plain clause per
mistake, naming its place as Python writes it (``ids[0]``) and the value sent, never pydantic's
pattern or one clause per number of a row."""

from __future__ import annotations

import httpx
import pytest

JSON = {"content-type": "application/json"}
ID_RULE = "an id is 1 to 200 visible ASCII characters without spaces"
NAME_RULE = ("a model name is 1 to 64 ASCII letters, digits, '_', '-' or '.', not starting "
             "with '.'")
LABEL_RULE = "a label is a class index (an integer) or, for a model with class_names, a name"
SINGLE_ROW = ("features: a list of rows, got a list of numbers (wrap a single row as "
              "[[x1, x2, ...]])")


async def _nothing_learned(client: httpx.AsyncClient) -> bool:
    info = (await client.get("/v1/models/m")).json()
    return info["examples_seen"] == 0 and info["waiting_for_labels"] == 0


# -- ids and names --------------------------------------------------------------------------------
@pytest.mark.parametrize("bad, shown", [
    ("a b", "'a b'"), ("", "''"), ("ü", "'ü'"), ("tab\there", r"'tab\there'"), (5, "5"),
    (None, "null"), ("x" * 300, f"'{'x' * 40}'... (300 characters)"),
])
@pytest.mark.parametrize("route", ["predict", "labels"])
async def test_an_invalid_id_says_what_an_id_is(
    client: httpx.AsyncClient, create_model, make_data, route: str, bad, shown: str
):
    await create_model(client)
    X, y = make_data(2)
    body = {"ids": ["ok", bad]}
    body |= {"features": X} if route == "predict" else {"labels": y}
    r = await client.post(f"/v1/models/m/{route}", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["detail"] == f"ids[1]: {ID_RULE}, got {shown}"
    assert await _nothing_learned(client)


@pytest.mark.parametrize("bad, shown", [(".hidden", "'.hidden'"), ("a b", "'a b'"),
                                        ("x" * 65, f"'{'x' * 40}'... (65 characters)"),
                                        (7, "7")])
async def test_an_invalid_model_name_says_what_a_name_is(
    client: httpx.AsyncClient, small_config, bad, shown: str
):
    r = await client.post("/v1/models", json={"name": bad, "config": small_config})
    assert r.status_code == 422, r.text
    assert r.json()["detail"] == f"name: {NAME_RULE}, got {shown}"
    assert (await client.get("/v1/models")).json() == []


async def test_an_invalid_name_to_import_under_says_what_a_name_is(client: httpx.AsyncClient):
    r = await client.post("/v1/models/.hidden/import", content=b"gln",
                          headers={"content-type": "application/octet-stream"})
    assert r.status_code == 422, r.text
    assert r.json()["detail"] == f"name in the path: {NAME_RULE}, got '.hidden'"


# -- rows -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("route", ["learn", "predict", "explain"])
async def test_a_single_row_without_its_outer_brackets_is_one_clause(
    client: httpx.AsyncClient, create_model, route: str
):
    """A 784-feature row sent as ``features`` made 784 clauses; it is one, saying what to do."""
    await create_model(client)
    body = {"features": [0.5] * 784} | ({"labels": [0]} if route == "learn" else {})
    r = await client.post(f"/v1/models/m/{route}", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["detail"] == SINGLE_ROW
    assert await _nothing_learned(client)


async def test_a_single_row_clause_keeps_the_body_s_other_mistakes(
    client: httpx.AsyncClient, create_model
):
    await create_model(client)
    r = await client.post("/v1/models/m/learn", json={"features": [1, 2.5, 3], "labels": [True]})
    assert r.status_code == 422, r.text
    assert r.json()["detail"] == f"{SINGLE_ROW}; labels[0]: {LABEL_RULE}, got true"


@pytest.mark.parametrize("bad, shown", [(5, "5"), ("row", "'row'"), (None, "null")])
async def test_a_row_that_is_not_a_list_is_named_by_its_place(
    client: httpx.AsyncClient, create_model, make_data, bad, shown: str
):
    await create_model(client)
    X, _ = make_data(1)
    r = await client.post("/v1/models/m/predict", json={"features": [X[0], bad]})
    assert r.status_code == 422, r.text
    assert r.json()["detail"] == (f"features[1]: a row is a list of numbers or, for a model "
                                  f"with feature_names, an object of numbers by name, got {shown}")


@pytest.mark.parametrize(("rows", "message"), [
    ([{"a": 1.0}], "rows given by name need a model with feature_names"),
    ([[0.0] * 6, {"a": 1.0}], "row 1 is given by name (an object), row 0 as a list"),
])
async def test_rows_by_name_to_a_model_without_names_are_refused_saying_why(
    client: httpx.AsyncClient, create_model, rows, message: str
):
    await create_model(client)
    r = await client.post("/v1/models/m/learn", json={"features": rows, "labels": [0] * len(rows)})
    assert r.status_code == 422, r.text
    assert message in r.json()["detail"]
    assert await _nothing_learned(client)


# -- labels ---------------------------------------------------------------------------------------
async def test_labels_sent_as_whole_floats_are_learned_as_class_indices(
    client: httpx.AsyncClient, create_model, make_data
):
    """NumPy and pandas clients send labels as 1.0: learned as 1, the same answer as ints."""
    await create_model(client, "ints")
    await create_model(client, "floats")
    X, y = make_data(20)
    as_ints = await client.post("/v1/models/ints/learn", json={"features": X, "labels": y})
    as_floats = await client.post("/v1/models/floats/learn",
                                  json={"features": X, "labels": [float(label) for label in y]})
    assert as_floats.status_code == 200, as_floats.text
    assert as_floats.json()["probabilities"] == as_ints.json()["probabilities"]
    assert as_floats.json()["log_loss"] == as_ints.json()["log_loss"]


async def test_delayed_labels_sent_as_whole_floats_are_learned(
    client: httpx.AsyncClient, create_model, make_data
):
    await create_model(client)
    X, y = make_data(2)
    await client.post("/v1/models/m/predict", json={"features": X, "ids": ["a", "b"]})
    r = await client.post("/v1/models/m/labels",
                          json={"ids": ["a", "b"], "labels": [float(label) for label in y]})
    assert r.status_code == 200, r.text
    assert r.json()["learned"] == 2


@pytest.mark.parametrize("token, shown", [
    ("1.5", "1.5"), ('""', "''"), ("true", "true"), ("null", "null"), ("[1]", "a list"),
    ("NaN", "nan"), ("1e300", "1e+300"),
])
@pytest.mark.parametrize("route", ["learn", "labels"])
async def test_a_label_that_is_not_an_integer_is_one_clause_showing_it(
    client: httpx.AsyncClient, create_model, route: str, token: str, shown: str
):
    await create_model(client)
    rows = '"features": [[0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]]'
    if route == "labels":
        rows = '"ids": ["a", "b"]'
    body = f'{{{rows}, "labels": [0, {token}]}}'
    r = await client.post(f"/v1/models/m/{route}", content=body.encode(), headers=JSON)
    assert r.status_code == 422, r.text
    assert r.json()["detail"] == f"labels[1]: {LABEL_RULE}, got {shown}"
    assert await _nothing_learned(client)


@pytest.mark.parametrize("label", [3, 3.0, -1])
async def test_a_label_out_of_range_is_named_by_its_place_not_read_as_a_class(
    client: httpx.AsyncClient, create_model, make_data, label
):
    await create_model(client)
    X, _ = make_data(2)
    r = await client.post("/v1/models/m/learn", json={"features": X, "labels": [0, label]})
    assert r.status_code == 422, r.text
    assert r.json()["detail"] == (
        f"labels must be class indices in [0, 3); labels[1] is {int(label)}"
    )
    assert await _nothing_learned(client)


@pytest.mark.parametrize("route", ["learn", "labels"])
async def test_a_label_by_name_to_a_model_without_class_names_is_refused_naming_it(
    client: httpx.AsyncClient, create_model, route: str
):
    await create_model(client)
    rows = {"features": [[0.0] * 6] * 2} if route == "learn" else {"ids": ["a", "b"]}
    if route == "labels":
        await client.post("/v1/models/m/predict", json={"features": [[0.0] * 6] * 2,
                                                        "ids": ["a", "b"]})
    r = await client.post(f"/v1/models/m/{route}", json={**rows, "labels": [0, "1"]})
    assert r.status_code == 422, r.text
    assert r.json()["detail"] == ("labels[1] is '1': labels by name need a model with "
                                  "class_names (this one takes class indices)")
    info = (await client.get("/v1/models/m")).json()
    assert info["examples_seen"] == 0
    assert info["waiting_for_labels"] == (2 if route == "labels" else 0)  # they wait on
