"""Binary rows (``application/x-npz``) on the data routes, the learning stream (WebSocket),
and the HTTP face over a remote engine (``RemoteEngine`` to an ``EngineServer``, in-process)."""

from __future__ import annotations

import io
import json
import warnings
import zipfile
from typing import Any

import numpy as np
import pytest
from starlette.websockets import WebSocketDisconnect

from gln import GLN
from service.api.app import create_app
from service.settings import Settings

with warnings.catch_warnings():  # Starlette's test client would rather have httpx2
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

NPZ = {"content-type": "application/x-npz"}


def npz(**arrays: Any) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def unpacked(content: bytes) -> dict[str, np.ndarray]:
    return dict(np.load(io.BytesIO(content), allow_pickle=False))


async def test_learning_npz_rows_equals_learning_json_rows(client, create_model, make_data):
    await create_model(client, "binary")
    await create_model(client, "json")
    X, y = make_data(40, seed=3)
    for i in range(0, 40, 10):
        r = await client.post("/v1/models/binary/learn", headers=NPZ,
                              content=npz(features=np.asarray(X[i:i + 10], np.float32),
                                          labels=np.asarray(y[i:i + 10])))
        assert r.status_code == 200, r.text
        r = await client.post("/v1/models/json/learn",
                              json={"features": X[i:i + 10], "labels": y[i:i + 10]})
        assert r.status_code == 200, r.text
    binary = (await client.get("/v1/models/binary/export")).content
    plain = (await client.get("/v1/models/json/export")).content
    assert GLN.from_bytes(binary).to_bytes() == GLN.from_bytes(plain).to_bytes()


async def test_npz_answers_hold_what_json_answers_hold(client, create_model, make_data):
    await create_model(client)
    X, y = make_data(6, seed=4)
    body = npz(features=np.asarray(X), labels=np.asarray(y))
    r = await client.post("/v1/models/m/learn", headers={**NPZ, "accept": "application/x-npz"},
                          content=body)
    assert r.headers["content-type"] == "application/x-npz"
    answer = unpacked(r.content)
    assert answer["examples"] == 6 and answer["sequence"] == 0 and not answer["duplicate"]
    assert answer["probabilities"].shape == (6, 3)
    r = await client.post("/v1/models/m/predict", headers={**NPZ, "accept": "application/x-npz"},
                          content=npz(features=np.asarray(X)))
    as_json = (await client.post("/v1/models/m/predict", json={"features": X})).json()
    np.testing.assert_array_equal(unpacked(r.content)["probabilities"],
                                  np.asarray(as_json["probabilities"]))


async def test_delayed_labels_travel_as_arrays(client, create_model, make_data):
    await create_model(client)
    X, _ = make_data(2, seed=5)
    r = await client.post("/v1/models/m/predict", headers=NPZ,
                          content=npz(features=np.asarray(X), ids=np.array(["a", "b"])))
    assert r.status_code == 200, r.text
    r = await client.post("/v1/models/m/labels", headers={**NPZ, "accept": "application/x-npz"},
                          content=npz(ids=np.array(["b", "zz"]), labels=np.array([2, 0])))
    answer = unpacked(r.content)
    assert answer["learned"] == 1
    assert answer["ids"].tolist() == ["b", "zz"] and answer["status"].tolist() == [200, 404]


def _lying_header() -> bytes:
    """An .npz whose features header claims 10^9 rows over 24 bytes of data."""
    member = io.BytesIO()
    np.lib.format.write_array(member, np.zeros((1, 3)))
    data = member.getvalue().replace(b"(1, 3)", b"(1000000000, 3)")
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("features.npy", data)
        zf.writestr("labels.npy", _npy(np.array([0])))
    return archive.getvalue()


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def _bomb() -> bytes:
    """A small archive whose features unpack to 80 MB (more than the body limit)."""
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("features.npy", _npy(np.zeros((10_000_000, 1))))
        zf.writestr("labels.npy", _npy(np.zeros(10_000_000, np.int64)))
    return archive.getvalue()


@pytest.mark.parametrize(("body", "words"), [
    (b"not a zip", "not an .npz archive"),
    (npz(features=np.zeros((2, 6))), "'labels' are missing"),
    (npz(features=np.zeros((2, 6)), labels=np.zeros(2, int), extra=np.zeros(1)),
     "unknown array 'extra'"),
    (npz(features=np.zeros(6), labels=np.zeros(1, int)), "2-D array"),
    (npz(features=np.array([["a"] * 6]), labels=np.zeros(1, int)), "must hold numbers"),
    (npz(features=np.array([[1.0] * 6], dtype=object), labels=np.zeros(1, int)),
     "must hold numbers"),
    (npz(features=np.full((1, 6), np.nan), labels=np.zeros(1, int)), "must be finite"),
    (npz(features=np.zeros((1, 6)), labels=np.array([7])), "label"),
    (_lying_header(), "claims shape"),
    (_bomb(), "unpack to more than"),
], ids=["garbage", "missing", "unknown", "1-D", "text", "pickled", "nan", "label", "header",
        "bomb"])
async def test_bad_npz_bodies_are_422_and_leave_the_model_unchanged(
    tmp_path, serve, create_model, body, words
):
    settings = Settings(snapshot_dir=str(tmp_path / "s"), max_body_bytes=1 << 20)
    async with serve(create_app(settings)) as client:
        await create_model(client)
        r = await client.post("/v1/models/m/learn", headers=NPZ, content=body)
        assert r.status_code == 422, r.text
        assert words in r.json()["detail"]
        assert (await client.get("/v1/models/m")).json()["examples_seen"] == 0


def _stream_client(settings: Settings) -> TestClient:
    return TestClient(create_app(settings), base_url="http://localhost")


WS_HOST = {"host": "localhost"}


def test_a_stream_answers_every_batch_in_order_as_learning_them_in_order_would(
    settings, small_config, make_data
):
    X, y = make_data(60, seed=8)
    batches = [(np.asarray(X[i:i + 5]), np.asarray(y[i:i + 5])) for i in range(0, 60, 5)]
    with _stream_client(settings) as http:
        assert http.post("/v1/models", json={"name": "m", "config": small_config}
                         ).status_code == 201
        with http.websocket_connect("/v1/models/m/stream", headers=WS_HOST) as ws:
            for i, (rows, labels) in enumerate(batches):  # every batch sent before any read
                if i == 3:
                    ws.send_text(json.dumps({"features": [[1.0]], "labels": [0]}))
                ws.send_bytes(npz(features=rows, labels=labels, key=np.array(f"b{i}")))
            answers = []
            for i in range(len(batches) + 1):
                answers.append(json.loads(ws.receive_text()) if i == 3
                               else unpacked(ws.receive_bytes()))
        exported = http.get("/v1/models/m/export").content
    refused = answers.pop(3)
    assert refused["error"]["status"] == 422
    assert [int(a["sequence"]) for a in answers] == list(range(0, 60, 5))
    reference = GLN(**small_config)
    for (rows, labels), answer in zip(batches, answers, strict=True):
        np.testing.assert_array_equal(reference.learn(rows, labels), answer["probabilities"])
    assert GLN.from_bytes(exported).to_bytes() == reference.to_bytes()


def test_a_stream_needs_the_token_when_one_is_set(tmp_path, small_config):
    settings = Settings(snapshot_dir=str(tmp_path / "s"), api_token="secret")
    with _stream_client(settings) as http:
        with pytest.raises(WebSocketDisconnect) as refused:
            with http.websocket_connect("/v1/models/m/stream", headers=WS_HOST):
                pass
        assert refused.value.code == 1008
        auth = {**WS_HOST, "authorization": "Bearer secret"}
        http.post("/v1/models", json={"name": "m", "config": small_config},
                  headers={"authorization": "Bearer secret"})
        with http.websocket_connect("/v1/models/m/stream", headers=auth) as ws:
            ws.send_text(json.dumps({"features": [[0.0] * 6], "labels": [1], "key": "k"}))
            assert json.loads(ws.receive_text())["examples"] == 1


async def test_the_http_face_over_a_remote_engine_answers_as_over_a_local_one(
    tmp_path, small_config, make_data, serve_over_a_remote_engine
):
    settings = Settings(snapshot_dir=str(tmp_path / "s"), snapshot_interval_s=3600)
    X, y = make_data(8, seed=9)
    async with serve_over_a_remote_engine(settings, tmp_path) as client:
        assert (await client.post("/v1/models", json={
            "name": "m", "config": small_config})).status_code == 201
        learned = await client.post("/v1/models/m/learn", json={"features": X, "labels": y})
        ragged = await client.post("/v1/models/m/learn", json={
            "features": [[0.0] * 6, [0.0]], "labels": [0, 1]})
        missing = await client.get("/v1/models/nope")
        binary = await client.post("/v1/models/m/predict", headers=NPZ,
                                   content=npz(features=np.asarray(X)))
        exported = (await client.get("/v1/models/m/export")).content
        imported = await client.post(
            "/v1/models/copy/import", content=exported,
            headers={"content-type": "application/octet-stream"})
        listed = [m["name"] for m in (await client.get("/v1/models")).json()]
        page = (await client.get("/metrics")).text
    reference = GLN(**small_config)
    probs = reference.learn(np.asarray(X), np.asarray(y))
    assert learned.status_code == 200
    np.testing.assert_allclose(learned.json()["probabilities"], probs, rtol=0, atol=0)
    assert ragged.status_code == 422 and "row 1" in ragged.json()["detail"]
    assert missing.status_code == 404
    np.testing.assert_array_equal(binary.json()["probabilities"],
                                  reference.predict_proba(np.asarray(X)))
    assert GLN.from_bytes(exported).to_bytes() == reference.to_bytes()
    assert imported.status_code == 201 and listed == ["copy", "m"]
    assert 'gln_examples_learned_total{model="m"} 8.0' in page
