"""The engine's passes: the batches of many models waiting at the same moment are served in
one hop to a thread, each model's requests still in their order, and none lost."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Executor
from typing import Any

import numpy as np

from gln import GLN
from service.api.app import create_app


class CountingExecutor(Executor):
    """An executor that counts the calls handed to it, and hands them on."""

    def __init__(self, inner: Executor) -> None:
        self.inner, self.calls = inner, 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.inner.submit(fn, *args, **kwargs)


async def test_many_models_waiting_together_are_served_in_one_pass(
    settings, serve, small_config, create_model, make_data
):
    app = create_app(settings.model_copy(update={"worker_threads": 1}))  # one lane
    X, y = make_data(24, seed=3)
    async with serve(app) as client:
        names = [f"m{i}" for i in range(24)]
        for name in names:
            await create_model(client, name)
        registry = app.state.engine.registry
        held = await registry.get("m0")
        gate, learn = threading.Event(), held.model.learn
        held.model.learn = lambda *a, **k: (gate.wait(10), learn(*a, **k))[1]
        passes = registry.passes
        counting = passes._executor = CountingExecutor(passes._executor)
        syncs_before = registry.wal.syncs
        first = asyncio.create_task(client.post(
            "/v1/models/m0/learn", json={"features": X[:1], "labels": y[:1]}))
        while counting.calls == 0:  # the lane holds m0's batch
            await asyncio.sleep(0.005)
        others = [asyncio.create_task(client.post(
            f"/v1/models/{name}/learn", json={"features": X[i:i + 1], "labels": y[i:i + 1]}))
            for i, name in enumerate(names) if i]
        waiting = [await registry.get(name) for name in names[1:]]
        while sum(1 for served in waiting if served.pending_examples) < 23:
            await asyncio.sleep(0.005)
        gate.set()
        answers = [await task for task in (first, *others)]
        syncs = registry.wal.syncs - syncs_before
        infos = {name: (await client.get(f"/v1/models/{name}")).json() for name in names}
    assert counting.calls == 2  # m0's pass, then one pass of the 23 others
    assert syncs == 2  # the file log synced once per pass, before its answers
    for i, (name, answer) in enumerate(zip(names, answers, strict=True)):
        assert answer.status_code == 200 and answer.json()["sequence"] == 0
        alone = GLN(**small_config)
        np.testing.assert_array_equal(answer.json()["probabilities"],
                                      alone.learn(np.asarray(X[i:i + 1]), np.asarray(y[i:i + 1])))
        assert infos[name]["examples_seen"] == 1


async def test_a_busy_model_does_not_starve_the_others(
    settings, serve, create_model, make_data
):
    """A model with more work after its batch goes to the back of the line."""
    app = create_app(settings.model_copy(update={"worker_threads": 1, "max_chunk_rows": 1}))
    X, y = make_data(40)
    async with serve(app) as client:
        await create_model(client, "busy")
        await create_model(client, "quiet")
        busy = [asyncio.create_task(client.post(
            "/v1/models/busy/learn", json={"features": X[i:i + 1], "labels": y[i:i + 1]}))
            for i in range(40)]
        await asyncio.sleep(0)
        quiet = await client.post("/v1/models/quiet/learn",
                                  json={"features": X[:1], "labels": y[:1]})
        busy_seen_then = (await client.get("/v1/models/busy")).json()["examples_seen"]
        sequences = [(await task).json()["sequence"] for task in busy]
    assert quiet.status_code == 200
    assert busy_seen_then < 40  # the quiet model was served while the busy one had work
    assert sorted(sequences) == list(range(40))
