"""The data routes (learn, predict, explain) skip FastAPI's per-request dependency solving
(service.api.routes.DataRoute); what they answer and document must not change because of it."""

from __future__ import annotations

import httpx
import pytest

from service.api.app import create_app
from service.settings import Settings

DATA_ROUTES = ["learn", "predict", "explain"]


@pytest.mark.parametrize("verb", DATA_ROUTES)
async def test_data_route_before_start_up_is_503(settings: Settings, verb: str):
    """Without the lifespan there is no registry: the same 503 as the other routes."""
    app = create_app(settings)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
        r = await client.post(f"/v1/models/m/{verb}", json={"features": [[0.0]], "labels": [0]})
        other = await client.get("/v1/models/m")
    assert r.status_code == other.status_code == 503
    assert r.json() == {"detail": "service is starting"}


async def test_openapi_documents_the_data_routes(client: httpx.AsyncClient):
    spec = (await client.get("/openapi.json")).json()
    for verb, schema in [("learn", "LearnRequest"), ("predict", "PredictRequest"),
                         ("explain", "FeaturesRequest"), ("labels", "LabelsRequest")]:
        post = spec["paths"][f"/v1/models/{{name}}/{verb}"]["post"]
        expected = [("name", "path", True)]
        if verb == "learn":
            expected.append(("Idempotency-Key", "header", False))
        assert [(p["name"], p["in"], p["required"]) for p in post["parameters"]] == expected
        body = post["requestBody"]["content"]["application/json"]["schema"]
        assert body["title"] == schema
        assert "200" in post["responses"] and "422" in post["responses"]


async def test_model_name_reaches_the_registry(client: httpx.AsyncClient, create_model,
                                               make_data):
    """The path parameter is passed through as it is: another name is another model."""
    await create_model(client, "a.b-c_1")
    X, y = make_data(3)
    r = await client.post("/v1/models/a.b-c_1/learn", json={"features": X, "labels": y})
    assert r.status_code == 200 and r.json()["examples"] == 3
    missing = await client.post("/v1/models/other/predict", json={"features": X})
    assert missing.status_code == 404
    assert missing.json() == {"detail": "model 'other' not found"}
