"""The service with ``GLN_DEVICE=cuda``, on the emulated device (tests/gln/emulated_cupy.py).

Models live on the device; requests, snapshots, the write-ahead log and restore work as on the
CPU, and a snapshot taken on the device restores on a CPU-only server and back.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from gln import GLN
from service.api.app import create_app
from service.settings import Settings
from tests.gln.emulated_cupy import GXX, EmulatedCupy, emulated_cupy_installed
from tests.service.conftest import assert_each_as_if_alone, learn_every_model_one_row_at_a_time

pytestmark = pytest.mark.skipif(GXX is None, reason="the emulated device needs g++ on PATH")


@pytest.fixture
def device() -> Iterator[EmulatedCupy]:
    with emulated_cupy_installed() as module:
        yield module


def settings_on(device_name: str, tmp_path) -> Settings:
    return Settings(snapshot_dir=str(tmp_path / "snapshots"), snapshot_interval_s=3600,
                    device=device_name)


async def test_models_learn_on_the_device_and_move_to_a_cpu_server_and_back(
    device, tmp_path, serve, small_config, create_model, make_data
):
    X, y = make_data(50)
    probe, _ = make_data(7, seed=3)
    reference = GLN(**small_config, device="cpu")
    expected_learn = reference.learn(np.array(X[:30]), np.array(y[:30]))
    reference.learn(np.array(X[30:]), np.array(y[30:]))

    app = create_app(settings_on("cuda", tmp_path))
    async with serve(app) as client:
        await create_model(client, "fraud")
        r = await client.post("/v1/models/fraud/learn", json={"features": X[:30], "labels": y[:30]})
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(r.json()["probabilities"], expected_learn, atol=1e-4)
        r = await client.post("/v1/models/fraud/learn", json={"features": X[30:], "labels": y[30:]})
        assert r.json()["sequence"] == 30
        on_device = (await client.post("/v1/models/fraud/predict",
                                       json={"features": probe})).json()["probabilities"]
        np.testing.assert_allclose(on_device, reference.predict_proba(np.array(probe)), atol=1e-4)
        entry = await app.state.engine.registry.get("fraud")
        assert isinstance(entry.model.weights[0], device.ndarray)  # in device memory
        metrics = (await client.get("/metrics")).text
        assert 'device="cuda"' in metrics
        assert (await client.post("/v1/models/fraud/snapshot")).status_code == 200

    async with serve(create_app(settings_on("cpu", tmp_path))) as client:
        info = (await client.get("/v1/models/fraud")).json()
        assert info["examples_seen"] == 50
        on_cpu = (await client.post("/v1/models/fraud/predict",
                                    json={"features": probe})).json()["probabilities"]
        np.testing.assert_allclose(on_cpu, on_device, atol=1e-5)
        r = await client.post("/v1/models/fraud/learn", json={"features": X[:5], "labels": y[:5]})
        assert r.json()["sequence"] == 50

    async with serve(create_app(settings_on("cuda", tmp_path))) as client:
        info = (await client.get("/v1/models/fraud")).json()
        assert info["examples_seen"] == 55  # the CPU server's learning came back too


async def test_an_export_from_the_device_imports_on_a_cpu_server_and_back(
    device, tmp_path, serve, small_config, create_model, make_data
):
    X, y = make_data(40)
    probe, _ = make_data(7, seed=3)
    octets = {"content-type": "application/octet-stream"}
    async with serve(create_app(settings_on("cuda", tmp_path / "gpu"))) as client:
        await create_model(client, "fraud")
        await client.post("/v1/models/fraud/learn", json={"features": X[:20], "labels": y[:20]})
        from_device = (await client.get("/v1/models/fraud/export")).content
        on_device = (await client.post("/v1/models/fraud/predict",
                                       json={"features": probe})).json()["probabilities"]

    async with serve(create_app(settings_on("cpu", tmp_path / "cpu"))) as client:
        r = await client.post("/v1/models/moved/import", content=from_device, headers=octets)
        assert r.status_code == 201, r.text
        assert r.json()["config"]["device"] == "cpu"
        on_cpu = (await client.post("/v1/models/moved/predict",
                                    json={"features": probe})).json()["probabilities"]
        np.testing.assert_allclose(on_cpu, on_device, atol=1e-5)
        await client.post("/v1/models/moved/learn", json={"features": X[20:], "labels": y[20:]})
        from_cpu = (await client.get("/v1/models/moved/export")).content

    app = create_app(settings_on("cuda", tmp_path / "gpu"))
    async with serve(app) as client:
        r = await client.post("/v1/models/back/import", content=from_cpu, headers=octets)
        assert r.status_code == 201, r.text
        assert r.json()["examples_seen"] == 40
        entry = await app.state.engine.registry.get("back")
        assert isinstance(entry.model.weights[0], device.ndarray)  # in device memory
        np.testing.assert_allclose(
            (await client.post("/v1/models/back/predict", json={"features": probe})).json()[
                "probabilities"],
            GLN.from_bytes(from_cpu, "cpu").predict_proba(np.array(probe)), atol=1e-5,
        )


async def test_tenants_on_the_device_are_learned_together_each_as_if_alone(
    device, tmp_path, serve, small_config, make_data, family_calls
):
    """Small models on the device are members of one GPU family: a pass learns rows of
    several of them in one call (one launch a layer), and each ends with the bytes and
    answers of a GPU model that learned its rows alone."""
    streams = {f"t{i}": make_data(3, seed=i) for i in range(5)}
    async with serve(create_app(settings_on("cuda", tmp_path))) as client:
        answers, exported = await learn_every_model_one_row_at_a_time(
            client, small_config, streams)
    assert max(family_calls) > 1
    assert_each_as_if_alone(answers, exported, streams, small_config, device="cuda")
