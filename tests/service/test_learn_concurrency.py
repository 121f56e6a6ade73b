"""One writer per model: concurrent learners give exactly the sequential result.

Many clients learn at once; the service coalesces their requests into chunks. Each response
says where its rows landed in the model's stream (``sequence``), so replaying every request
in that order on a fresh model must reproduce every answered probability and the final bytes.
Concurrent predictions must each equal the model's prediction at some request boundary, never
a state in the middle of a chunk.
"""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import numpy as np
import pytest

from gln import GLN
from service.api.app import create_app
from service.api.shutdown_answer import UNKNOWN, WITHDRAWN
from service.storage.store import open_store

CLIENTS = 8
REQUESTS_PER_CLIENT = 25


async def _learner(client: httpx.AsyncClient, rng: np.random.Generator, make_data) -> list[dict]:
    answered = []
    for _ in range(REQUESTS_PER_CLIENT):
        n = int(rng.integers(1, 4))  # 1-3 rows per request
        X, y = make_data(n, seed=int(rng.integers(1 << 30)))
        r = await client.post("/v1/models/m/learn", json={"features": X, "labels": y})
        assert r.status_code == 200, r.text
        answered.append({"X": X, "y": y, **r.json()})
    return answered


async def test_concurrent_learners_equal_a_sequential_replay(
    client: httpx.AsyncClient, settings, small_config, create_model, make_data
):
    await create_model(client)
    rngs = [np.random.default_rng(100 + i) for i in range(CLIENTS)]
    per_client = await asyncio.gather(*(_learner(client, rng, make_data) for rng in rngs))
    answered = sorted((a for batch in per_client for a in batch), key=lambda a: a["sequence"])

    # The sequences tile the stream: no gap, no overlap.
    total = sum(a["examples"] for a in answered)
    expected_start = 0
    for a in answered:
        assert a["sequence"] == expected_start
        expected_start += a["examples"]
    info = (await client.get("/v1/models/m")).json()
    assert info["examples_seen"] == total
    assert info["metrics"]["total"]["examples"] == total

    # Replaying request by request in stream order reproduces every answer exactly.
    replay = GLN(**small_config)
    for a in answered:
        probs = replay.learn(np.array(a["X"]), np.array(a["y"]))
        np.testing.assert_array_equal(np.array(a["probabilities"]), probs)

    # ... and the final state, byte for byte (read back through a snapshot).
    version = (await client.post("/v1/models/m/snapshot")).json()["version"]
    store = open_store(None, settings.snapshot_dir)
    blob, snap = store.load("m")
    assert snap.version == version
    assert blob == replay.to_bytes()


async def test_coalescing_happens_under_load(client: httpx.AsyncClient, app, create_model):
    """With many requests waiting, the worker learns them in fewer model calls than requests."""
    await create_model(client)
    entry = await app.state.engine.registry.get("m")
    calls = 0
    learn = entry.model.learn  # what the worker calls (with checked=True)

    def counting_learn(X, y, **kwargs):
        nonlocal calls
        calls += 1
        return learn(X, y, **kwargs)

    entry.model.learn = counting_learn
    body = {"features": [[0.1] * 6], "labels": [1]}
    responses = await asyncio.gather(
        *(client.post("/v1/models/m/learn", json=body) for _ in range(64))
    )
    assert all(r.status_code == 200 for r in responses)
    assert sorted(r.json()["sequence"] for r in responses) == list(range(64))
    assert 1 <= calls < 64


async def test_predictions_never_see_half_a_chunk(
    client: httpx.AsyncClient, small_config, create_model, make_data
):
    await create_model(client)
    probe, _ = make_data(3, seed=999)

    async def learner(seed: int) -> list[dict]:
        answered = []
        for i in range(10):
            X, y = make_data(16, seed=seed * 100 + i)
            r = await client.post("/v1/models/m/learn", json={"features": X, "labels": y})
            answered.append({"X": X, "y": y, **r.json()})
        return answered

    async def predictor() -> list[list[list[float]]]:
        seen = []
        for _ in range(30):
            r = await client.post("/v1/models/m/predict", json={"features": probe})
            seen.append(r.json()["probabilities"])
        return seen

    results = await asyncio.gather(learner(1), learner(2), learner(3), predictor(), predictor())
    answered = sorted((a for batch in results[:3] for a in batch), key=lambda a: a["sequence"])
    predictions = results[3] + results[4]

    # Every state a reader may legally see: before any request, and after each one.
    replay = GLN(**small_config)
    legal = [replay.predict_proba(np.array(probe)).tolist()]
    for a in answered:
        replay.learn(np.array(a["X"]), np.array(a["y"]))
        legal.append(replay.predict_proba(np.array(probe)).tolist())
    for p in predictions:
        assert p in legal


@pytest.mark.parametrize("rows", [1, 50])
async def test_pending_examples_drain_to_zero(client: httpx.AsyncClient, create_model, rows):
    await create_model(client)
    body = {"features": [[0.3] * 6] * rows, "labels": [2] * rows}
    await asyncio.gather(*(client.post("/v1/models/m/learn", json=body) for _ in range(10)))
    info = (await client.get("/v1/models/m")).json()
    assert info["pending_examples"] == 0
    assert info["examples_seen"] == 10 * rows


async def test_a_failing_model_call_is_a_500_and_the_worker_lives_on(
    app, serve, create_model, make_data
):
    async with serve(app) as _:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            await create_model(client)
            entry = await app.state.engine.registry.get("m")
            learn = entry.model.learn  # what the worker calls (with checked=True)

            def broken_once(X, y, **kwargs):
                entry.model.learn = learn
                raise RuntimeError("device lost")

            entry.model.learn = broken_once
            X, y = make_data(3)
            r = await client.post("/v1/models/m/learn", json={"features": X, "labels": y})
            assert r.status_code == 500
            request_id = r.headers["x-request-id"]
            assert r.json() == {"detail": "internal error: RuntimeError; see the service log "
                                          f"(request {request_id})"}
            r = await client.post("/v1/models/m/learn", json={"features": X, "labels": y})
            assert r.status_code == 200 and r.json()["sequence"] == 0
            info = (await client.get("/v1/models/m")).json()
            assert info["examples_seen"] == 3 and info["pending_examples"] == 0


async def _a_learn_held_by_the_worker(app, client, body: bytes):
    """Start learning ``body`` on model "m" and return (its task, the gate that releases it)
    once the worker holds it; a raw ASGI call (its task, its sent messages) follows."""
    entry = await app.state.engine.registry.get("m")
    gate = threading.Event()
    learn = entry.model.learn  # what the worker calls (with checked=True)

    def held(X, y, **kwargs):
        gate.wait(10)
        return learn(X, y, **kwargs)

    entry.model.learn = held
    first = asyncio.create_task(client.post("/v1/models/m/learn", content=body, headers={
        "content-type": "application/json"}))
    for _ in range(100):  # until the worker holds it
        await asyncio.sleep(0.01)
        if not entry._queue and entry.pending_examples > 0:
            break
    return first, gate


def _raw_call(app, method: str, path: str, body: bytes = b""):
    """``app`` called as uvicorn calls it, in a task (which a test may cancel, as a shutdown
    does): the task and the list its answer's messages go to."""
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "client": ("127.0.0.1", 1), "server": ("localhost", 80),
        "headers": [(b"host", b"localhost"), (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode())],
    }
    return asyncio.create_task(app(scope, receive, send)), sent


async def test_a_request_a_shutdown_stops_waiting_for_is_withdrawn_and_answered_503(
    app, serve, create_model, make_data
):
    """uvicorn cancels the handlers still open when GLN_SHUTDOWN_TIMEOUT_S has passed: a
    request still queued is withdrawn (not learned by the shutdown's drain) and answered with
    a JSON 503 that says so, not uvicorn's plain-text 500; the one being learned completes."""
    X, y = make_data(3)
    body = json.dumps({"features": X, "labels": y}).encode()
    async with serve(app) as client:
        await create_model(client)
        entry = await app.state.engine.registry.get("m")
        first, gate = await _a_learn_held_by_the_worker(app, client, body)
        second, sent = _raw_call(app, "POST", "/v1/models/m/learn", body)
        for _ in range(100):  # until it is queued behind the held one
            await asyncio.sleep(0.01)
            if entry.pending_examples == 6:
                break
        assert entry.pending_examples == 6
        second.cancel()
        await second  # answered: it ends as a request does, not as a cancelled task
        gate.set()
        assert (await first).status_code == 200
        info = (await client.get("/v1/models/m")).json()
        scrape = (await client.get("/metrics")).text
    assert sent[0]["status"] == 503 and (b"retry-after", b"1") in sent[0]["headers"]
    assert json.loads(sent[1]["body"])["detail"] == WITHDRAWN
    assert info["examples_seen"] == 3 and info["pending_examples"] == 0
    assert 'route="/v1/models/{name}/learn",status="503"' in scrape


async def test_a_delete_a_shutdown_stops_waiting_for_lets_the_batch_under_way_finish(
    app, serve, create_model, make_data
):
    """Cancelling a DELETE's handler must not cancel the model's worker halfway through the
    batch it waits for: that batch's requests are answered (they were carried out), and the
    DELETE's client is told its outcome is unknown."""
    X, y = make_data(3)
    async with serve(app) as client:
        await create_model(client)
        first, gate = await _a_learn_held_by_the_worker(
            app, client, json.dumps({"features": X, "labels": y}).encode())
        delete, sent = _raw_call(app, "DELETE", "/v1/models/m")
        await asyncio.sleep(0.1)  # the delete waits for the worker's batch
        delete.cancel()
        await delete
        gate.set()
        answer = await asyncio.wait_for(first, 10)
    assert answer.status_code == 200 and answer.json()["examples"] == 3
    assert sent[0]["status"] == 503 and json.loads(sent[1]["body"])["detail"] == UNKNOWN


async def test_a_shutdown_ends_while_the_label_expiry_waits_for_a_learn_under_way(
    settings, create_model, make_data
):
    """The expiry loop, cancelled while a pass carries out its learn of expired rows, waits
    for that learn (as a request's handler does) and must then stop, not go round again:
    else the shutdown waits for it for ever."""
    app = create_app(settings.model_copy(update={"label_ttl_s": 0.2, "label_default": 1}))
    X, _ = make_data(2)
    lifespan = app.router.lifespan_context(app)
    await lifespan.__aenter__()
    try:
        await app.state.engine.registry.wait_restored()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            await create_model(client)
            entry = await app.state.engine.registry.get("m")
            gate, learn = threading.Event(), entry.model.learn
            entry.model.learn = lambda *a, **k: (gate.wait(10), learn(*a, **k))[1]
            await client.post("/v1/models/m/predict", json={"features": X, "ids": ["a", "b"]})
            for _ in range(200):  # until the expiry's learn of the two rows is under way
                await asyncio.sleep(0.02)
                if not entry._queue and entry.pending_examples == 2:
                    break
            assert entry.pending_examples == 2
    finally:
        closing = asyncio.create_task(lifespan.__aexit__(None, None, None))
        await asyncio.sleep(0.2)
        gate.set()
        await asyncio.wait_for(closing, 20)
    assert entry.model.examples_seen == 2
