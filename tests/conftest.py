"""Shared pytest fixtures: a real Redis, and a real NATS server, for the tests that need one.

``redis_url`` gives a Redis URL for the whole session. When the environment variable
``REDIS_URL`` names a server that answers PING within a second, that server is used;
otherwise a private ``redis-server`` is started on a free local port (no persistence, in a
temporary directory) and stopped at the end of the session. A Redis that merely happens to run
on this machine is never used unless ``REDIS_URL`` points at it.

``redis_key_prefix`` gives each test its own key prefix and deletes only the keys under it
afterwards, so tests can share a server (even a shared one) without FLUSHDB.

``nats_url`` gives a private ``nats-server`` with JetStream for the whole session (skipped where
none is installed), and ``nats_prefix`` each test its own streams on it, deleted afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import redis

from tests.support.nats_process import NatsProcess
from tests.support.redis_process import RedisProcess


def _redis_answers(url: str, timeout_s: float = 1.0) -> bool:
    """True when the Redis at ``url`` answers PING within ``timeout_s`` seconds."""
    try:
        client = redis.Redis.from_url(
            url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s
        )
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (redis.RedisError, OSError, ValueError):
        return False


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a reachable Redis: ``$REDIS_URL`` if it answers, else a private redis-server."""
    env_url = os.environ.get("REDIS_URL")
    if env_url and _redis_answers(env_url):
        yield env_url
        return

    try:
        server = RedisProcess(tmp_path_factory.mktemp("redis"), appendonly=False)
    except FileNotFoundError as exc:
        pytest.skip(f"{exc}")
    with server:
        yield server.url


@pytest.fixture
def redis_key_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix unique to this test; its keys (and only those) are deleted afterwards."""
    prefix = f"gln-test-{uuid.uuid4().hex}"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=500))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start:start + 500])
    finally:
        client.close()


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a private single ``nats-server`` with JetStream, for the whole session."""
    try:
        server = NatsProcess(tmp_path_factory.mktemp("nats"))
    except FileNotFoundError as exc:
        pytest.skip(f"{exc}")
    with server:
        yield server.url


@pytest.fixture
def nats_prefix(nats_url: str) -> Iterator[str]:
    """A stream prefix unique to this test; its streams are deleted afterwards."""
    import asyncio
    import concurrent.futures

    import nats

    prefix = f"t{uuid.uuid4().hex[:16]}"
    yield prefix

    async def delete_streams() -> None:
        nc = await nats.connect(nats_url)
        try:
            js = nc.jetstream()
            for info in await js.streams_info():
                if info.config.name.startswith(f"{prefix}-"):
                    await js.delete_stream(info.config.name)
        finally:
            await nc.close()

    # On a thread of its own: an async test's loop may still be this thread's.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, delete_streams()).result(30)
