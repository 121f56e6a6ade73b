"""Redis Sentinel: with ``GLN_REDIS_URL=redis+sentinel://...`` the snapshots and the log go to
the primary that the Sentinels name, and after the primary dies the service writes to the
replica they promote, without a restart. With ``GLN_WAL_REPLICAS=1`` (every append held by a
replica before it is answered) nothing acknowledged is lost on the way.

Real processes throughout: a primary, two replicas and one Sentinel (tests/redis_process.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import redis

from gln import GLN
from service.api.app import create_app
from service.settings import Settings
from service.storage.common import parse_sentinel_url
from service.storage.store import RedisSnapshotStore
from tests.redis_process import (
    RedisProcess,
    SentinelProcess,
    free_port,
    primary_and_replicas,
)
from tests.service.staged_crash import model_bytes, skip_shutdown_snapshots


@pytest.fixture
def sentinel_group(tmp_path: Any) -> Iterator[tuple[RedisProcess, SentinelProcess]]:
    """A primary with two replicas in sync, and a Sentinel that knows all three."""
    try:
        with primary_and_replicas(tmp_path / "group", count=2) as (primary, _):
            with SentinelProcess(tmp_path / "sentinel", primary).start(replicas=2) as sentinel:
                yield primary, sentinel
    except FileNotFoundError as exc:
        pytest.skip(f"{exc}")


@pytest.mark.parametrize(("url", "message"), [
    ("redis+sentinel://h1/", "names the primary"),
    ("redis+sentinel://h1/gln/0/extra", "names the primary"),
    ("redis+sentinel://h1:port/gln", "each Sentinel is host"),
    ("redis+sentinel://h1,/gln", "each Sentinel is host"),
    ("redis+sentinel://h1:70000/gln", "each Sentinel is host"),
    ("redis+sentinel://h1/gln/db", "database of a Sentinel URL is a number"),
    ("redis+sentinel://h1/gln?timeout=1", "takes sentinel_password once and nothing else"),
    ("redis+sentinel://h1/gln?garbage", r"\(got garbage\)"),
    ("redis+sentinel://h1/gln?sentinel_password=a&sentinel_password=b", "a repeat"),
])
def test_a_malformed_sentinel_url_is_refused_naming_what_is_wrong(url: str, message: str):
    with pytest.raises(ValueError, match=message):
        parse_sentinel_url(url)
    with pytest.raises(ValueError, match=message):
        Settings(redis_url=url)


def test_a_sentinel_url_names_every_sentinel_the_primary_and_its_credentials():
    target = parse_sentinel_url("redis+sentinel://app:p%40ss@[::1]:26380,10.0.0.2/orders/3"
                                "?sentinel_password=s%26t")
    assert target.sentinels == (("::1", 26380), ("10.0.0.2", 26379))
    assert (target.service_name, target.db) == ("orders", 3)
    assert (target.username, target.password) == ("app", "p@ss")
    assert target.sentinel_password == "s&t"


def test_a_dead_sentinel_in_the_list_is_passed_over(sentinel_group):
    """The Sentinels are asked in turn: one that is down does not keep the store from the
    primary that the next one names."""
    primary, sentinel = sentinel_group
    url = sentinel.url.replace("127.0.0.1:", f"127.0.0.1:{free_port()},127.0.0.1:", 1)
    assert url.count(",") == 1
    with RedisSnapshotStore(url, key_prefix="t") as store:
        assert store.ping()
        store.save("m", b"bytes")
        assert store.load("m")[0] == b"bytes"


def test_sentinels_with_a_password_are_asked_with_it(sentinel_group, tmp_path):
    """Sentinels that require a password (``requirepass``) name the primary only to a client
    that gives it (``?sentinel_password=``); without it the store cannot reach Redis."""
    primary, _ = sentinel_group
    with SentinelProcess(tmp_path / "locked", primary, password="s3cret").start(
            replicas=2) as locked:
        with RedisSnapshotStore(locked.url, key_prefix="t") as store:
            assert store.ping()
            store.save("m", b"bytes")
        without = locked.url.partition("?")[0]
        with RedisSnapshotStore(without, key_prefix="t") as store:
            assert not store.ping()
            with pytest.raises(redis.RedisError):
                store.load("m")


def test_snapshots_go_to_the_primary_the_sentinel_names(sentinel_group):
    primary, sentinel = sentinel_group
    with RedisSnapshotStore(sentinel.url, key_prefix="t") as store:
        assert store.ping()
        info = store.save("m", b"model bytes")
        blob, loaded = store.load("m")
    assert (blob, loaded.sha256) == (b"model bytes", info.sha256)
    direct = redis.Redis.from_url(primary.url)
    try:
        assert any(key.startswith(b"t:") for key in direct.keys("*"))
    finally:
        direct.close()


async def test_learning_moves_to_the_promoted_replica_and_loses_nothing_acknowledged(
    sentinel_group, serve, small_config, create_model, make_data, tmp_path
):
    """The primary is killed between two learn requests. The service answers 503 until the
    Sentinel has promoted a replica (and the other replica follows it), then learns on it;
    every request is retried with its Idempotency-Key until it is answered. A server started
    afterwards from the same URL restores every acknowledged example exactly once."""
    primary, sentinel = sentinel_group
    batches = [make_data(3, seed=s) for s in range(6)]
    settings = Settings(redis_url=sentinel.url, redis_key_prefix="t", wal_replicas=1,
                        snapshot_interval_s=3600, snapshot_dir=str(tmp_path / "unused"))
    app = create_app(settings)
    refused = 0
    async with serve(app) as client:
        await create_model(client, "m", small_config)
        for i, (X, y) in enumerate(batches):
            if i == 2:
                primary.kill()
            deadline = time.monotonic() + 60
            while True:
                r = await client.post("/v1/models/m/learn", json={"features": X, "labels": y},
                                      headers={"Idempotency-Key": f"batch-{i}"})
                if r.status_code != 503 or time.monotonic() > deadline:
                    break
                refused += 1
                await asyncio.sleep(0.2)
            assert r.status_code == 200, r.text
        live_bytes = await model_bytes(app, "m")
        skip_shutdown_snapshots(app)  # the restart below restores from the log alone
    assert sentinel.primary_port() != primary.port
    assert refused > 0  # the dead primary was noticed, not skipped over

    reference = GLN(**small_config)
    for X, y in batches:
        reference.learn(np.asarray(X, dtype=np.float32), np.asarray(y))
    assert live_bytes == reference.to_bytes()

    restarted = create_app(settings)
    async with serve(restarted) as client:
        described = (await client.get("/v1/models/m")).json()
        restored_bytes = await model_bytes(restarted, "m")
        skip_shutdown_snapshots(restarted)
    assert described["examples_seen"] == sum(len(y) for _, y in batches)
    assert restored_bytes == reference.to_bytes()

