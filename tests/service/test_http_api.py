"""Every route of the HTTP API, its happy path and its error codes, through real HTTP."""

from __future__ import annotations

import json
import re

import httpx
import numpy as np
import pytest

from gln import GLN
from service.api.app import create_app

JSON = {"content-type": "application/json"}


# -- create / list / get / delete ----------------------------------------------------------------

async def learn_in_requests(client, X, y, rows: int) -> tuple[list[float], list[bool]]:
    """Learn X, y in requests of ``rows``; each row's prequential log loss and correctness."""
    losses, correct = [], []
    for i in range(0, len(X), rows):
        labels = y[i : i + rows]
        body = (
            await client.post("/v1/models/m/learn", json={"features": X[i : i + rows],
                                                          "labels": labels})
        ).json()
        p = np.array(body["probabilities"])
        losses += list(-np.log(p[np.arange(len(labels)), labels]))
        correct += list(p.argmax(axis=1) == np.array(labels))
    return losses, correct

async def test_create_returns_201_with_info_and_the_model_born_in_the_log(
    client: httpx.AsyncClient, small_config, create_model
):
    info = await create_model(client, "fraud")
    assert info["name"] == "fraud"
    assert info["examples_seen"] == 0
    assert info["config"]["num_features"] == small_config["num_features"]
    assert info["config"]["layer_sizes"] == small_config["layer_sizes"]
    assert info["config"]["device"] == "cpu"  # the server's GLN_DEVICE
    assert info["snapshot"] is None  # durable by its birth in the log; a snapshot comes later
    assert info["metrics"]["recent"] == {"examples": 0, "log_loss": None, "accuracy": None}
    assert info["nbytes"] > 0


async def test_the_config_a_model_shows_creates_the_same_model(
    client: httpx.AsyncClient, create_model
):
    shown = (await create_model(client, "a"))["config"]
    r = await client.post("/v1/models", json={"name": "b", "config": shown})
    assert r.status_code == 201, r.text
    assert r.json()["config"] == shown


async def test_create_existing_name_is_409_and_keeps_the_first(
    client: httpx.AsyncClient, small_config, create_model, make_data
):
    await create_model(client, "a")
    X, y = make_data(3)
    await client.post("/v1/models/a/learn", json={"features": X, "labels": y})
    r = await client.post("/v1/models", json={"name": "a", "config": small_config})
    assert r.status_code == 409
    assert "already exists" in r.json()["detail"]
    assert (await client.get("/v1/models/a")).json()["examples_seen"] == 3


async def test_a_name_differing_only_in_case_is_409_until_the_first_is_deleted(
    client: httpx.AsyncClient, small_config, create_model, make_data
):
    # On a case-insensitive file system the two would share one snapshot directory and log.
    await create_model(client, "fraud")
    X, y = make_data(3)
    await client.post("/v1/models/fraud/learn", json={"features": X, "labels": y})
    blob = (await client.get("/v1/models/fraud/export")).content
    for refused in (
        client.post("/v1/models", json={"name": "Fraud", "config": small_config}),
        client.post("/v1/models/FRAUD/import", content=blob,
                    headers={"content-type": "application/octet-stream"}),
    ):
        r = await refused
        assert r.status_code == 409, r.text
        assert "'fraud' exists" in r.json()["detail"] and "case" in r.json()["detail"]
    names = [m["name"] for m in (await client.get("/v1/models")).json()]
    assert names == ["fraud"]
    assert (await client.get("/v1/models/fraud")).json()["examples_seen"] == 3
    assert (await client.delete("/v1/models/fraud")).status_code == 204
    assert (await create_model(client, "Fraud"))["name"] == "Fraud"


@pytest.mark.parametrize("name", ["", "a b", "x" * 65, "sl/ash", "ü", "a:b", "a\n", "..", ".",
                                  ".gln-service.lock", ".tmp-x"])  # the server's own files
async def test_create_invalid_name_is_422(client: httpx.AsyncClient, name: str, small_config):
    r = await client.post("/v1/models", json={"name": name, "config": small_config})
    assert r.status_code == 422
    assert r.json()["detail"].startswith("name:")
    assert (await client.get("/v1/models")).json() == []


@pytest.mark.parametrize("name", ["a", "A.b-c_9", "x" * 64, "-rf", "_.", "a.."])
async def test_create_accepts_the_whole_name_alphabet(
    client: httpx.AsyncClient, name: str, create_model
):
    await create_model(client, name)
    assert (await client.get(f"/v1/models/{name}")).json()["name"] == name


@pytest.mark.parametrize(
    "config, fragment",
    [
        ({"num_classes": 2}, "num_features"),  # GLN raises TypeError: missing argument
        ({"num_features": 0, "num_classes": 2}, "num_features"),
        ({"num_features": 3, "num_classes": 1}, "num_classes"),
        ({"num_features": 3, "layer_sizes": [4, 2]}, "layer_sizes"),
        ({"num_features": 3, "bogus_option": 1}, "unknown key(s) 'bogus_option'"),
        ({"num_features": 3, "use_kernels": False}, "unknown key(s) 'use_kernels'"),
        ({"num_features": 3, "layer_sizes": []}, "layer_sizes must end in a single neuron"),
        ({"num_features": 3, "layer_sizes": [4, 0, 1]}, "layer_sizes[1]"),
        ({"num_features": 3, "context_dim": 17}, "context_dim must be <= 16"),
        ({"num_features": 3, "seed": -1}, "seed must be >= 0"),
        ({"num_features": 3, "device": "cuda"}, "device"),
        # Requests carry no side information apart from the rows: refused, not a model that
        # would refuse every request.
        ({"num_features": 3, "side_info": "given", "side_info_size": 4}, "side_info 'given'"),
        # Its blur matrices would take 29 GB: sized (and refused) before anything is built.
        ({"num_features": 60_000, "layer_sizes": [1], "context_dim": 1, "side_info": "per_row",
          "image_shape": [1, 60_000], "side_info_blur": 1.0}, "GLN_MAX_MODEL_BYTES"),
    ],
)
async def test_invalid_config_is_422_and_creates_nothing(
    client: httpx.AsyncClient, config: dict, fragment: str
):
    r = await client.post("/v1/models", json={"name": "bad", "config": config})
    assert r.status_code == 422, r.text
    assert fragment in r.json()["detail"]
    assert (await client.get("/v1/models/bad")).status_code == 404


async def test_list_get_delete(client: httpx.AsyncClient, create_model):
    await create_model(client, "b")
    await create_model(client, "a")
    listed = (await client.get("/v1/models")).json()
    assert [m["name"] for m in listed] == ["a", "b"]
    assert (await client.get("/v1/models/a")).json() == listed[0]

    r = await client.delete("/v1/models/a")
    assert r.status_code == 204 and r.content == b""
    assert (await client.get("/v1/models/a")).status_code == 404
    assert [m["name"] for m in (await client.get("/v1/models")).json()] == ["b"]
    # The name is free again, and the new model starts from scratch.
    assert (await create_model(client, "a"))["examples_seen"] == 0


@pytest.mark.parametrize(
    "method, path",
    [
        ("GET", "/v1/models/nope"),
        ("DELETE", "/v1/models/nope"),
        ("POST", "/v1/models/nope/predict"),
        ("POST", "/v1/models/nope/learn"),
        ("POST", "/v1/models/nope/explain"),
        ("POST", "/v1/models/nope/snapshot"),
    ],
)
async def test_unknown_model_is_404(client: httpx.AsyncClient, method: str, path: str):
    body = {"features": [[0.0] * 6], "labels": [0]} if path.endswith("learn") else None
    if path.endswith(("predict", "explain")):
        body = {"features": [[0.0] * 6]}
    r = await client.request(method, path, json=body)
    assert r.status_code == 404
    assert r.json() == {"detail": "model 'nope' not found"}


# -- learn / predict / explain --------------------------------------------------------------------
async def test_learn_answers_prequential_probabilities_like_the_library(
    client: httpx.AsyncClient, small_config, create_model, make_data
):
    await create_model(client)
    reference = GLN(**small_config)
    X, y = make_data(40)
    sequence = 0
    for start in (0, 1, 11, 30):  # uneven requests: 1, 10, 19, 10 rows
        stop = {0: 1, 1: 11, 11: 30, 30: 40}[start]
        r = await client.post(
            "/v1/models/m/learn", json={"features": X[start:stop], "labels": y[start:stop]}
        )
        assert r.status_code == 200, r.text
        body = r.json()
        expected = reference.learn(np.array(X[start:stop]), np.array(y[start:stop]))
        assert body["examples"] == stop - start
        assert body["sequence"] == sequence
        np.testing.assert_array_equal(np.array(body["probabilities"]), expected)
        losses = -np.log(expected[np.arange(stop - start), y[start:stop]])
        assert body["log_loss"] == pytest.approx(losses.mean(), rel=1e-12)
        sequence += stop - start
    info = (await client.get("/v1/models/m")).json()
    assert info["examples_seen"] == 40
    assert info["pending_examples"] == 0

    r = await client.post("/v1/models/m/predict", json={"features": X[:5]})
    assert r.status_code == 200
    np.testing.assert_array_equal(
        np.array(r.json()["probabilities"]), reference.predict_proba(np.array(X[:5]))
    )
    # Predicting does not learn.
    assert (await client.get("/v1/models/m")).json()["examples_seen"] == 40


async def test_single_rows_learned_between_refused_ones_give_the_library_s_bits(
    client: httpx.AsyncClient, small_config, create_model, make_data
):
    """The model learns and predicts the rows the registry checked without checking them
    again: one-row requests, with refused ones between them (422, nothing of them learned),
    leave the bytes of the library's public ``learn`` on the accepted rows."""
    await create_model(client)
    reference = GLN(**small_config)
    X, y = make_data(12)
    for i in range(12):
        refused = await client.post("/v1/models/m/learn", json={
            "features": [X[i][:3] + [1e39] + X[i][4:]], "labels": [y[i]]})
        assert refused.status_code == 422 and "row 0, column 3" in refused.json()["detail"]
        r = await client.post("/v1/models/m/learn", json={"features": [X[i]], "labels": [y[i]]})
        assert r.status_code == 200, r.text
        np.testing.assert_array_equal(np.array(r.json()["probabilities"]),
                                      reference.learn(np.array([X[i]]), np.array([y[i]])))
        r = await client.post("/v1/models/m/predict", json={"features": [X[(i + 5) % 12]]})
        np.testing.assert_array_equal(np.array(r.json()["probabilities"]),
                                      reference.predict_proba(np.array([X[(i + 5) % 12]])))
    assert (await client.get("/v1/models/m")).json()["examples_seen"] == 12
    r = await client.get("/v1/models/m/export")
    assert r.status_code == 200, r.text
    assert r.content == reference.to_bytes()


async def test_online_metrics_window_and_total(client: httpx.AsyncClient, create_model, make_data):
    await create_model(client)
    X, y = make_data(30)
    losses, correct = await learn_in_requests(client, X, y, 10)
    m = (await client.get("/v1/models/m")).json()["metrics"]
    assert m["window_size"] == 1000
    assert m["recent"]["examples"] == 30 and m["total"]["examples"] == 30
    assert m["recent"]["log_loss"] == pytest.approx(np.mean(losses))
    assert m["total"]["log_loss"] == pytest.approx(np.mean(losses))
    assert m["recent"]["accuracy"] == pytest.approx(np.mean(correct))


async def test_recent_window_keeps_only_the_last_examples(
    settings, tmp_path, create_model, make_data, serve
):
    async with serve(create_app(settings.model_copy(update={"recent_window": 8}))) as client:
        await create_model(client)
        X, y = make_data(20)
        all_losses, _ = await learn_in_requests(client, X, y, 5)  # 5-row requests wrap the ring
        m = (await client.get("/v1/models/m")).json()["metrics"]
        assert m["recent"]["examples"] == 8
        assert m["recent"]["log_loss"] == pytest.approx(np.mean(all_losses[-8:]))
        assert m["total"]["log_loss"] == pytest.approx(np.mean(all_losses))


async def test_explain_returns_saliency_per_row_class_feature(
    client: httpx.AsyncClient, small_config, create_model, make_data
):
    await create_model(client)
    X, y = make_data(10)
    await client.post("/v1/models/m/learn", json={"features": X, "labels": y})
    reference = GLN(**small_config)
    reference.learn(np.array(X), np.array(y))
    r = await client.post("/v1/models/m/explain", json={"features": X[:4]})
    assert r.status_code == 200
    saliency = np.array(r.json()["saliency"])
    assert saliency.shape == (4, 3, 6)
    np.testing.assert_array_equal(saliency, reference.saliency(np.array(X[:4])))


async def test_snapshot_route_writes_a_new_version_of_a_changed_model_only(
    client: httpx.AsyncClient, create_model, make_data
):
    await create_model(client)
    first = await client.post("/v1/models/m/snapshot")  # as created: version 1 holds it
    assert first.status_code == 200 and first.json()["version"] == 1
    X, y = make_data(3)
    await client.post("/v1/models/m/learn", json={"features": X, "labels": y})
    r = await client.post("/v1/models/m/snapshot")
    assert r.status_code == 200
    snap = r.json()
    assert snap["version"] == 2 and snap["nbytes"] > 0 and len(snap["sha256"]) == 64
    assert (await client.get("/v1/models/m")).json()["snapshot"] == snap
    assert (await client.post("/v1/models/m/snapshot")).json() == snap  # nothing new to write


# -- bad data: 422 and nothing changes ------------------------------------------------------------
BAD_LEARN_BODIES = [
    ({"features": [[0.0] * 5], "labels": [0]}, "6 features"),  # wrong width
    ({"features": [[0.0] * 7], "labels": [0]}, "6 features"),
    ({"features": [[0.0] * 6, [0.0] * 5], "labels": [0, 1]}, "row 1 has 5"),  # ragged
    ({"features": [[0.0] * 6], "labels": [3]}, "labels"),  # out of range
    ({"features": [[0.0] * 6], "labels": [-1]}, "labels"),
    ({"features": [[0.0] * 6, [0.0] * 6], "labels": [0]}, "labels"),  # count mismatch
    ({"features": [], "labels": []}, "features"),  # no rows
    ({"features": [[0.0] * 6]}, "labels"),  # labels missing
    ({"features": [["a"] * 6], "labels": [0]}, "features"),  # not numbers
    ({"features": [[0.0] * 6], "labels": [0.5]}, "labels"),
    ({"features": [[1e39] + [0.0] * 5], "labels": [0]}, "float32"),  # finite, beyond float32
]


@pytest.mark.parametrize("body, fragment", BAD_LEARN_BODIES)
async def test_bad_learn_body_is_422_and_changes_nothing(
    client: httpx.AsyncClient, body: dict, fragment: str, create_model
):
    await create_model(client)
    r = await client.post("/v1/models/m/learn", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, str) and fragment in detail
    info = (await client.get("/v1/models/m")).json()
    assert info["examples_seen"] == 0 and info["metrics"]["total"]["examples"] == 0


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("route", ["learn", "predict", "explain"])
async def test_nan_and_infinity_tokens_are_422(
    client: httpx.AsyncClient, token: str, route: str, create_model, make_data
):
    await create_model(client)
    X, y = make_data(2)
    await client.post("/v1/models/m/learn", json={"features": X, "labels": y})
    before = (await client.post("/v1/models/m/predict", json={"features": X})).json()
    row = f"[1.0, {token}, 0.0, 0.0, 0.0, 0.0]"
    body = f'{{"features": [[0,0,0,0,0,0], {row}], "labels": [0, 1]}}'
    if route != "learn":
        body = f'{{"features": [[0,0,0,0,0,0], {row}]}}'
    r = await client.post(f"/v1/models/m/{route}", content=body.encode(), headers=JSON)
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith("features must be finite: row 1, column 1")
    assert (await client.get("/v1/models/m")).json()["examples_seen"] == 2
    assert (await client.post("/v1/models/m/predict", json={"features": X})).json() == before


async def test_malformed_json_is_422_with_a_string_detail(client: httpx.AsyncClient, create_model):
    await create_model(client)
    r = await client.post("/v1/models/m/learn", content=b'{"features": [[1, 2', headers=JSON)
    assert r.status_code == 422
    assert "Invalid JSON" in r.json()["detail"]


async def test_too_many_rows_is_422(settings, serve, create_model, make_data):
    async with serve(create_app(settings.model_copy(update={"max_rows_per_request": 4}))) as c:
        await create_model(c)
        X, y = make_data(5)
        r = await c.post("/v1/models/m/learn", json={"features": X, "labels": y})
        assert r.status_code == 422
        assert "GLN_MAX_ROWS_PER_REQUEST=4" in r.json()["detail"]
        assert (await c.post("/v1/models/m/predict", json={"features": X[:4]})).status_code == 200
        assert (await c.get("/v1/models/m")).json()["examples_seen"] == 0


async def test_an_answer_of_too_many_numbers_is_422(settings, serve, create_model, make_data):
    """Answers are built in memory: their size is bounded, not only their rows (SMALL_CONFIG:
    3 classes, 6 features, so a learn or predict row answers 3 numbers and explain 18)."""
    limited = settings.model_copy(update={"max_response_values": 36})
    async with serve(create_app(limited)) as c:
        await create_model(c)
        X, y = make_data(13)
        r = await c.post("/v1/models/m/learn", json={"features": X, "labels": y})
        assert r.status_code == 422
        assert r.json()["detail"] == (
            "features: the answer to 13 rows would hold 39 numbers (3 a row), more than "
            "GLN_MAX_RESPONSE_VALUES=36; send at most 12 rows a request"
        )
        assert (await c.get("/v1/models/m")).json()["examples_seen"] == 0
        assert (await c.post("/v1/models/m/predict", json={"features": X})).status_code == 422
        assert (await c.post("/v1/models/m/predict", json={"features": X[:12]})).status_code == 200
        r = await c.post("/v1/models/m/explain", json={"features": X[:3]})
        assert r.status_code == 422 and "(18 a row)" in r.json()["detail"]
        assert (await c.post("/v1/models/m/explain", json={"features": X[:2]})).status_code == 200
    tight = settings.model_copy(update={"max_response_values": 17})
    async with serve(create_app(tight)) as c:  # not one row's explanation (18) fits
        r = await c.post("/v1/models/m/explain", json={"features": X[:1]})
        assert r.status_code == 422 and r.json()["detail"].endswith(
            "GLN_MAX_RESPONSE_VALUES=17; not even one row's fits: only a server with a larger "
            "limit answers it")


async def test_bad_request_between_good_ones_leaves_no_gap(
    client: httpx.AsyncClient, create_model, make_data
):
    await create_model(client)
    X, y = make_data(4)
    first = await client.post("/v1/models/m/learn", json={"features": X[:2], "labels": y[:2]})
    bad = await client.post("/v1/models/m/learn", json={"features": X[2:], "labels": [0, 9]})
    second = await client.post("/v1/models/m/learn", json={"features": X[2:], "labels": y[2:]})
    assert (first.status_code, bad.status_code, second.status_code) == (200, 422, 200)
    assert second.json()["sequence"] == 2


# -- operations -----------------------------------------------------------------------------------
async def test_healthz_readyz_openapi(client: httpx.AsyncClient):
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    r = await client.get("/readyz")
    assert r.status_code == 200 and r.json() == {"status": "ready", "problems": []}
    for probe in ("/healthz", "/readyz"):  # load balancers often probe with HEAD
        head = await client.head(probe)
        assert head.status_code == 200 and head.content == b""
    spec = (await client.get("/openapi.json")).json()
    for path in [
        "/v1/models",
        "/v1/models/{name}",
        "/v1/models/{name}/learn",
        "/v1/models/{name}/predict",
        "/v1/models/{name}/explain",
        "/v1/models/{name}/snapshot",
        "/healthz",
        "/readyz",
        "/metrics",
    ]:
        assert path in spec["paths"], path
    assert (await client.get("/docs")).status_code == 200


async def test_the_docs_page_needs_no_internet(client: httpx.AsyncClient):
    """/docs loads Swagger UI from the server itself: every script and style it names is
    served here, and none is taken from another host."""
    page = (await client.get("/docs")).text
    assets = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert assets and not [url for url in assets if "://" in url]
    for url in assets:
        r = await client.get(url)
        assert r.status_code == 200 and len(r.content) > 0, url
    assert "/openapi.json" in page


async def test_openapi_lists_every_status_a_prediction_can_get(client: httpx.AsyncClient):
    spec = (await client.get("/openapi.json")).json()
    statuses = set(spec["paths"]["/v1/models/{name}/predict"]["post"]["responses"])
    assert {"200", "401", "404", "409", "413", "422", "503"} <= statuses


async def test_unknown_route_is_404_json(client: httpx.AsyncClient):
    r = await client.get("/v2/nothing")
    assert r.status_code == 404
    assert json.loads(r.text) == {"detail": "Not Found"}


async def test_large_requests_take_the_threaded_paths(
    client: httpx.AsyncClient, small_config, create_model, make_data
):
    """Bodies over 64 KiB are parsed, big inputs checked, big answers encoded off the loop."""
    await create_model(client)
    X, y = make_data(4000, seed=5)
    body = json.dumps({"features": X, "labels": y}).encode()
    assert len(body) > 64 * 1024
    r = await client.post("/v1/models/m/learn", content=body, headers=JSON)
    assert r.status_code == 200
    reference = GLN(**small_config)
    np.testing.assert_array_equal(
        np.array(r.json()["probabilities"]), reference.learn(np.array(X), np.array(y))
    )
    r = await client.post("/v1/models/m/explain", json={"features": X[:2000]})
    np.testing.assert_array_equal(
        np.array(r.json()["saliency"]), reference.saliency(np.array(X[:2000]))
    )
    bad = X[:3999] + [[float("nan")] * 6]
    r = await client.post(
        "/v1/models/m/predict", content=json.dumps({"features": bad}).encode(), headers=JSON
    )
    assert r.status_code == 422
    assert r.json()["detail"].startswith("features must be finite: row 3999")
