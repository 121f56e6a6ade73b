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
    assert r.json()["detail"] == f"path.name: {NAME_RULE}, got '.hidden'"


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


@pytest.mark.parametrize("bad, shown", [(5, "5"), ("row", "'row'"), ({"a": 1}, "an object")])
async def test_a_row_that_is_not_a_list_is_named_by_its_place(
    client: httpx.AsyncClient, create_model, make_data, bad, shown: str
):
    await create_model(client)
    X, _ = make_data(1)
    r = await client.post("/v1/models/m/predict", json={"features": [X[0], bad]})
    assert r.status_code == 422, r.text
    assert r.json()["detail"] == f"features[1]: a row is a list of numbers, got {shown}"
