"""Fixtures for the HTTP service tests: real apps, their lifespan, and real HTTP clients.

Every test talks HTTP to the real app through ``httpx.ASGITransport``; the lifespan (store,
thread pool, restore, shutdown snapshot) runs with ``app.router.lifespan_context``. Snapshots
go to a temporary directory, or to the real Redis of the ``redis_url`` fixture
(tests/conftest.py) under a key prefix private to the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI

from service.api.app import create_app
from service.settings import Settings
from tests.support.redis_process import RedisProcess, primary_and_replica

SMALL_CONFIG: dict[str, Any] = {
    "num_features": 6,
    "num_classes": 3,
    "layer_sizes": [8, 8, 1],
    "context_dim": 3,
    "learning_rate": 0.05,
    "seed": 7,
}


@contextlib.asynccontextmanager
async def serve(app: FastAPI, *, wait_restored: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    """Run ``app``'s lifespan and yield an HTTP client wired to it (no sockets)."""
    async with app.router.lifespan_context(app):
        if wait_restored:
            await app.state.engine.registry.wait_restored()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            yield client


def snapshots_at_create(settings: Settings) -> int:
    """How many snapshots a create writes under ``settings``: none where the log holds the
    model's birth (the file and Redis logs), else its first."""
    return 0 if settings.wal_enabled and not settings.wal_url else 1


async def create_model(
    client: httpx.AsyncClient,
    name: str = "m",
    config: dict[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """POST /v1/models and return the created model's info (asserts 201)."""
    r = await client.post(
        "/v1/models", json={"name": name, "config": config or SMALL_CONFIG}, **kwargs
    )
    assert r.status_code == 201, r.text
    return r.json()


def make_data(
    n: int, seed: int = 0, num_features: int = 6, num_classes: int = 3
) -> tuple[list[list[float]], list[int]]:
    """A learnable toy stream: the label is the argmax of a fixed projection of the row."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, num_features))
    W = np.random.default_rng(1234).normal(size=(num_features, num_classes))
    y = (X @ W).argmax(axis=1)
    return X.tolist(), y.tolist()


Stream = tuple[list[list[float]], list[int]]


async def learn_every_model_one_row_at_a_time(
    client: httpx.AsyncClient, config: dict[str, Any], streams: dict[str, Stream]
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, bytes]]:
    """A model of ``config`` per stream, then every stream's rows sent one request a row, all
    streams at once (many tenants, each a row now and then); each model's answers, and its
    exported bytes after."""
    for name in streams:
        r = await client.post("/v1/models", json={"name": name, "config": config})
        assert r.status_code == 201, r.text

    async def one_at_a_time(name: str) -> list[dict[str, Any]]:
        X, y = streams[name]
        return [(await client.post(f"/v1/models/{name}/learn", json={
            "features": [X[t]], "labels": [y[t]]})).json() for t in range(len(X))]

    answers = dict(zip(streams, await asyncio.gather(
        *(one_at_a_time(name) for name in streams)), strict=True))
    exported = {name: (await client.get(f"/v1/models/{name}/export")).content
                for name in streams}
    return answers, exported


def assert_each_as_if_alone(
    answers: dict[str, list[dict[str, Any]]], exported: dict[str, bytes],
    streams: dict[str, Stream], config: dict[str, Any], device: str = "cpu",
) -> None:
    """Each model's answers and bytes are those of a ``GLN`` on ``device`` that learned its
    stream alone, a row a call."""
    from gln import GLN

    for name, (X, y) in streams.items():
        alone = GLN(**config, device=device)
        for t, answer in enumerate(answers[name]):
            expected = alone.learn(np.asarray([X[t]], np.float32), [y[t]])
            assert answer["sequence"] == t
            assert answer["probabilities"] == expected.astype(np.float64).tolist()
        assert exported[name] == alone.to_bytes()


@pytest.fixture(autouse=True)
def _no_gln_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Settings in tests come from arguments only, never from a GLN_* variable of the shell."""
    for key in list(os.environ):
        if key.startswith("GLN_"):
            monkeypatch.delenv(key)
    yield


@pytest.fixture
def settings(tmp_path: Any) -> Settings:
    """Directory store in tmp_path; periodic snapshots effectively off (tests call them)."""
    return Settings(snapshot_dir=str(tmp_path / "snapshots"), snapshot_interval_s=3600)


@pytest.fixture(params=["directory", "redis"])
def store_settings(request: pytest.FixtureRequest, tmp_path: Any) -> Settings:
    """The same settings for each store kind: a directory, then a real Redis."""
    if request.param == "directory":
        return Settings(snapshot_dir=str(tmp_path / "snapshots"), snapshot_interval_s=3600)
    return Settings(
        redis_url=request.getfixturevalue("redis_url"),
        redis_key_prefix=request.getfixturevalue("redis_key_prefix"),
        snapshot_dir=str(tmp_path / "unused"),
        snapshot_interval_s=3600,
    )


@pytest.fixture
def app(settings: Settings) -> FastAPI:
    return create_app(settings)


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(app) as c:
        yield c


@contextlib.asynccontextmanager
async def serve_over_a_remote_engine(settings: Settings, socket_dir: Any) -> AsyncIterator[
        httpx.AsyncClient]:
    """The HTTP face over a :class:`RemoteEngine` talking to an :class:`EngineServer` in this
    process (what ``GLN_WORKERS`` > 1 runs across processes): every call crosses the socket."""
    from service.engine.ipc import EngineServer, RemoteEngine
    from service.engine.local import LocalEngine
    from service.metrics import ServiceMetrics

    engine = LocalEngine(settings, ServiceMetrics(settings.device, http=False,
                                                  models_with_series=settings.metrics_models))
    await engine.start()
    server = EngineServer(engine, f"ipc://{socket_dir}/engine.sock")
    serving = asyncio.create_task(server.serve())
    app = create_app(settings, RemoteEngine(server.address))
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport,
                                         base_url="http://localhost") as client:
                yield client
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        await engine.close()
        server.close()


@pytest.fixture(params=["local", "remote"])
async def engine_client(request: pytest.FixtureRequest, settings: Settings,
                        tmp_path: Any) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client of the app over each engine: in its own process, and across a socket."""
    if request.param == "local":
        async with serve(create_app(settings)) as client:
            yield client
    else:
        async with serve_over_a_remote_engine(settings, tmp_path) as client:
            yield client


# The helpers above as fixtures, so test modules need not import this conftest.
@pytest.fixture
def small_config() -> dict[str, Any]:
    return dict(SMALL_CONFIG)


@pytest.fixture(name="serve")
def serve_fixture() -> Callable[..., Any]:
    return serve


@pytest.fixture(name="create_model")
def create_model_fixture() -> Callable[..., Any]:
    return create_model


@pytest.fixture(name="serve_over_a_remote_engine")
def serve_over_a_remote_engine_fixture() -> Callable[..., Any]:
    return serve_over_a_remote_engine


@pytest.fixture
def family_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many distinct members each GLNFamily.learn call of the test learned."""
    from gln import GLNFamily

    calls: list[int] = []
    learn = GLNFamily.learn

    def counted(self, X, y, members, **kwargs):  # noqa: ANN001, ANN003, ANN202
        calls.append(len(set(np.asarray(members).tolist())))
        return learn(self, X, y, members, **kwargs)

    monkeypatch.setattr(GLNFamily, "learn", counted)
    return calls


@pytest.fixture(name="make_data")
def make_data_fixture() -> Callable[..., Any]:
    return make_data


@pytest.fixture
def replicated(tmp_path: Any) -> Iterator[tuple[RedisProcess, RedisProcess]]:
    """A private Redis primary and its replica, in sync (tests/support/redis_process.py)."""
    try:
        with primary_and_replica(tmp_path / "replicated") as pair:
            yield pair
    except FileNotFoundError as exc:
        pytest.skip(f"{exc}")
