"""Moving models: ``GET /v1/models/{name}/export`` gives a model's bytes, and
``POST /v1/models/{name}/import`` serves bytes (an export, or ``GLN.to_bytes()`` of a model
trained with the library) under a new name.

A refused import must create nothing, so the error tests also list the models afterwards.
"""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from gln import GLN
from service.api.app import create_app
from service.settings import Settings
from tests.gln.snapshot_bytes import with_config, with_header
from tests.support.forged_snapshots import blob, mutate, split

OCTETS = {"content-type": "application/octet-stream"}


def with_counters(blob: bytes, **counters: int) -> bytes:
    """``blob`` with the counters in its header (``examples_seen``, ``moments_count``) set."""
    return with_header(blob, lambda header: json.dumps({**header, **counters}))


async def import_blob(client: httpx.AsyncClient, name: str, blob: bytes) -> httpx.Response:
    return await client.post(f"/v1/models/{name}/import", content=blob, headers=OCTETS)


async def predict(client: httpx.AsyncClient, name: str, rows) -> list[list[float]]:
    r = await client.post(f"/v1/models/{name}/predict", json={"features": rows})
    assert r.status_code == 200, r.text
    return r.json()["probabilities"]


async def names(client: httpx.AsyncClient) -> list[str]:
    return [m["name"] for m in (await client.get("/v1/models")).json()]


async def test_an_export_is_the_model_with_every_learn_answered_before_it(
    client, create_model, make_data
):
    X, y = make_data(70)
    probe, _ = make_data(5, seed=3)
    await create_model(client, "fraud")
    r = await client.post("/v1/models/fraud/learn", json={"features": X[:40], "labels": y[:40]})
    assert r.status_code == 200

    r = await client.get("/v1/models/fraud/export")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/octet-stream"
    assert r.headers["content-disposition"] == 'attachment; filename="fraud.gln"'
    exported = GLN.from_bytes(r.content)
    assert exported.examples_seen == 40
    assert exported.config == (await client.get("/v1/models/fraud")).json()["config"]
    np.testing.assert_array_equal(exported.predict_proba(np.array(probe)),
                                  await predict(client, "fraud", probe))
    # It goes on learning exactly as the served model does.
    r = await client.post("/v1/models/fraud/learn", json={"features": X[40:], "labels": y[40:]})
    np.testing.assert_array_equal(exported.learn(np.array(X[40:]), np.array(y[40:])),
                                  r.json()["probabilities"])


async def test_an_import_serves_a_model_trained_with_the_library(
    client, small_config, make_data
):
    X, y = make_data(90)
    probe, _ = make_data(5, seed=3)
    offline = GLN(**small_config)
    offline.learn(np.array(X[:60]), np.array(y[:60]))

    r = await import_blob(client, "offline", offline.to_bytes())
    assert r.status_code == 201, r.text
    info = r.json()
    assert info["name"] == "offline"
    assert info["config"] == offline.config
    assert info["examples_seen"] == 60
    assert info["metrics"]["total"]["examples"] == 0  # the online metrics start afresh
    assert info["snapshot"]["version"] == 1
    assert info["nbytes"] == GLN.estimate_nbytes(offline.config)  # warmed up as imported
    np.testing.assert_array_equal(offline.predict_proba(np.array(probe)),
                                  await predict(client, "offline", probe))
    # The stream goes on where the library left it.
    r = await client.post("/v1/models/offline/learn",
                          json={"features": X[60:], "labels": y[60:]})
    assert r.json()["sequence"] == 60
    np.testing.assert_array_equal(r.json()["probabilities"],
                                  offline.learn(np.array(X[60:]), np.array(y[60:])))
    assert (await client.get("/v1/models/offline")).json()["metrics"]["total"]["examples"] == 30


async def test_an_imported_copy_learns_on_its_own_and_survives_a_restart(
    store_settings: Settings, serve, create_model, make_data
):
    X, y = make_data(50)
    probe, _ = make_data(5, seed=3)
    async with serve(create_app(store_settings)) as client:
        await create_model(client, "a")
        await client.post("/v1/models/a/learn", json={"features": X[:20], "labels": y[:20]})
        blob = (await client.get("/v1/models/a/export")).content
        assert (await import_blob(client, "b", blob)).status_code == 201
        r = await client.post("/v1/models/b/learn", json={"features": X[20:], "labels": y[20:]})
        assert r.json()["sequence"] == 20
        a_before = await predict(client, "a", probe)
        b_before = await predict(client, "b", probe)
        assert a_before != b_before
        # What b learned left a as it was exported.
        assert (await client.get("/v1/models/a")).json()["examples_seen"] == 20
        np.testing.assert_array_equal(GLN.from_bytes(blob).predict_proba(np.array(probe)),
                                      a_before)

    async with serve(create_app(store_settings)) as client:
        assert await names(client) == ["a", "b"]
        assert (await client.get("/v1/models/b")).json()["examples_seen"] == 50
        assert await predict(client, "a", probe) == a_before
        assert await predict(client, "b", probe) == b_before


async def test_bytes_that_are_not_a_model_are_refused_and_create_nothing(
    client, create_model, small_config
):
    await create_model(client, "m")
    blob = GLN(**small_config).to_bytes()
    refused = {
        "empty": (b"", "not a GLN snapshot"),
        "json": (json.dumps({"config": small_config}).encode(), "not a GLN snapshot"),
        "truncated": (blob[:-1], "checksum"),
        "flipped-bit": (blob[:-1] + bytes([blob[-1] ^ 1]), "checksum"),
        "arrays-of-another-shape": (with_config(blob, num_classes=4), "does not fit"),
        "unknown-argument": (with_config(blob, colour="red"), "colour"),
        "invalid-argument": (with_config(blob, pred_clip=0.9), "pred_clip"),
        # Counts a loader takes (below 2**62), but that learning could take past it, into
        # snapshots no start-up would load:
        "examples-seen-without-room": (with_counters(blob, examples_seen=2**61),
                                       "leaves no room to learn"),
        "moments-count-without-room": (with_counters(blob, moments_count=2**62 - 1),
                                       "leaves no room to learn"),
    }
    for case, (body, message) in refused.items():
        r = await import_blob(client, "new", body)
        assert r.status_code == 422, (case, r.text)
        assert r.json()["detail"].startswith("invalid model bytes: "), (case, r.text)
        assert message in r.json()["detail"], (case, r.text)
    assert await names(client) == ["m"]

    r = await import_blob(client, "m", blob)
    assert r.status_code == 409
    assert r.json()["detail"] == "model 'm' already exists"
    assert (await client.get("/v1/models/m")).json()["examples_seen"] == 0


@pytest.mark.parametrize("name", ["a%20b", "%2E", "x" * 65, "caf%C3%A9"])
async def test_an_import_under_an_invalid_name_is_refused(client, small_config, name):
    r = await import_blob(client, name, GLN(**small_config).to_bytes())
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith("name in the path: ")
    assert await names(client) == []


async def test_an_import_past_the_servers_limits_is_refused_before_it_is_built(
    settings: Settings, serve, small_config
):
    blob = GLN(**small_config).to_bytes()
    needed = GLN.estimate_nbytes(small_config)
    limited = settings.model_copy(update={
        "max_model_bytes": needed, "max_total_model_bytes": needed + needed // 2,
    })
    async with serve(create_app(limited)) as client:
        # The header claims a model of terabytes around a payload of kilobytes: sized from the
        # header alone, it is refused without allocating anything.
        r = await import_blob(client, "huge", with_config(blob, num_features=10**12))
        assert r.status_code == 422, r.text
        assert "GLN_MAX_MODEL_BYTES" in r.json()["detail"]
        assert (await import_blob(client, "first", blob)).status_code == 201
        r = await import_blob(client, "second", blob)
        assert r.status_code == 409, r.text
        assert "GLN_MAX_TOTAL_MODEL_BYTES" in r.json()["detail"]
        assert await names(client) == ["first"]


async def test_exporting_a_model_that_does_not_exist_is_404(client):
    r = await client.get("/v1/models/nope/export")
    assert r.status_code == 404
    assert r.json()["detail"] == "model 'nope' not found"


async def test_hostile_model_bytes_never_get_a_5xx_and_create_nothing(client):
    """Forged blobs (headers rewritten, checksums recomputed) are answered 201 or 422."""
    header, payload = split(blob())
    rng = np.random.default_rng(7)
    statuses: dict[int, int] = {}
    for i in range(300):
        r = await client.post(f"/v1/models/fuzz-{i}/import", content=mutate(rng, header, payload),
                              headers={"content-type": "application/octet-stream"})
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        assert r.status_code in (201, 422), r.text
    created = {m["name"] for m in (await client.get("/v1/models")).json()}
    assert len(created) == statuses.get(201, 0) and statuses[422] > 150
