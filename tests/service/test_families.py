"""Small models of one configuration are served as members of one family (service.engine.
families): a pass learns the waiting rows of many of them in one library call, and each one
ends byte for byte where a model learning alone would, its answers too."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gln import GLN, GLNFamily
from service.api.app import create_app
from service.settings import Settings
from tests.service.conftest import (
    assert_each_as_if_alone,
    learn_every_model_one_row_at_a_time,
    make_data,
    serve,
)

MODELS = 12


async def test_spread_learns_are_learned_together_and_each_model_as_if_alone(
    settings: Settings, small_config, family_calls
):
    streams = {f"t{i}": make_data(8, seed=i) for i in range(MODELS)}
    async with serve(create_app(settings)) as client:
        answers, exported = await learn_every_model_one_row_at_a_time(
            client, small_config, streams)
    assert max(family_calls) > 1  # rows of several models were learned in one call
    assert_each_as_if_alone(answers, exported, streams, small_config)


async def test_a_deleted_models_room_is_a_new_model_of_its_own(settings: Settings, small_config):
    X, y = make_data(5)
    async with serve(create_app(settings)) as client:
        for name in ("a", "b"):
            await client.post("/v1/models", json={"name": name, "config": small_config})
            await client.post(f"/v1/models/{name}/learn", json={"features": X, "labels": y})
        assert (await client.delete("/v1/models/a")).status_code == 204
        await client.post("/v1/models", json={"name": "c", "config": small_config})
        info = (await client.get("/v1/models/c")).json()
        exported = (await client.get("/v1/models/c/export")).content
        b = (await client.get("/v1/models/b")).json()
    assert info["examples_seen"] == 0 and b["examples_seen"] == 5
    assert exported == GLN(**small_config).to_bytes()


async def test_a_family_the_machine_cannot_make_room_for_leaves_its_models_apart(
    settings: Settings, small_config, make_data, monkeypatch: pytest.MonkeyPatch
):
    def refused(capacity, **config):
        raise ValueError(f"a family of {capacity} models needs more memory than is available")

    monkeypatch.setattr(GLNFamily, "with_capacity", refused)
    X, y = make_data(4)
    async with serve(create_app(settings)) as client:
        r = await client.post("/v1/models", json={"name": "m", "config": small_config})
        assert r.status_code == 201, r.text
        r = await client.post("/v1/models/m/learn", json={"features": X, "labels": y})
        assert r.status_code == 200
        exported = (await client.get("/v1/models/m/export")).content
    alone = GLN(**small_config)
    alone.learn(np.asarray(X, np.float32), y)
    assert exported == alone.to_bytes()


async def test_an_entry_the_log_refuses_fails_only_its_own_models_requests(
    settings: Settings, small_config, family_calls
):
    """The entries of a pass's family members go to the log together; one the log refuses
    (its model's log changed behind the writer, as in a failover) answers that model's
    request with 503 and rebuilds it from its snapshot and log, and every other member
    learns its row as if alone."""
    streams = {f"t{i}": make_data(2, seed=i) for i in range(MODELS)}
    behind_its_back = make_data(1, seed=99)
    app = create_app(settings)
    async with serve(app) as client:
        firsts, _ = await learn_every_model_one_row_at_a_time(
            client, small_config, {name: (X[:1], y[:1]) for name, (X, y) in streams.items()})
        wal = app.state.engine.registry.wal
        wal.append("t0", np.asarray(behind_its_back[0], np.float32),
                   np.asarray(behind_its_back[1], np.int64))
        calls_before = len(family_calls)

        async def second_row(name: str):
            X, y = streams[name]
            return await client.post(f"/v1/models/{name}/learn",
                                     json={"features": [X[1]], "labels": [y[1]]})

        seconds = dict(zip(streams, await asyncio.gather(*map(second_row, streams)),
                           strict=True))
        exported = {name: (await client.get(f"/v1/models/{name}/export")).content
                    for name in streams}
        rebuilt = (await client.get("/v1/models/t0")).json()
    assert max(family_calls[calls_before:]) > 1
    refused = seconds.pop("t0")
    assert refused.status_code == 503 and "rebuilt from its snapshot" in refused.text
    assert rebuilt["examples_seen"] == 2  # its first row and the entry logged behind its back
    answers = {name: [firsts[name][0], r.json()] for name, r in seconds.items()}
    assert_each_as_if_alone(answers, {name: exported[name] for name in seconds},
                            {name: streams[name] for name in seconds}, small_config)
