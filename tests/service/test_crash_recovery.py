"""``kill -9`` of a real server mid-load loses no acknowledged example and learns none twice.

For the file log and for the Redis log: a ``python -m service`` process snapshots every 0.3 s
(so the log is trimmed under load) while four threads post learn requests, each with its own
Idempotency-Key, retrying on any error with the same key. After some hundreds of
acknowledged requests the server is SIGKILLed and restarted on the same port; the learners
retry what they held and go on. At the end the acknowledged requests' sequences must tile the
model's stream exactly, and the model's bytes must equal a fresh model that learned exactly
the acknowledged rows in that order. A second test kills a server holding rows that wait for
delayed labels: after the restart they wait still, and are learned once.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from gln import GLN
from service.storage.store import open_store
from service.storage.wal import open_wal
from tests.service.durable_client import (
    ServerProcess,
    check_exactly_once,
    learn_on_a_new_model,
    reference_bytes,
)

ACKS_BEFORE_KILL = 400
ACKS_AFTER_RESTART = 100


@pytest.fixture(params=["file", "redis"])
def log_settings(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """GLN_* variables of a server whose snapshots and log go to a directory, or to Redis."""
    if request.param == "file":
        return {"GLN_SNAPSHOT_DIR": str(tmp_path / "snapshots")}
    return {
        "GLN_REDIS_URL": request.getfixturevalue("redis_url"),
        "GLN_REDIS_KEY_PREFIX": request.getfixturevalue("redis_key_prefix"),
        "GLN_SNAPSHOT_DIR": str(tmp_path / "unused"),
    }


def _store_and_log(env: dict[str, str]) -> tuple[Any, Any]:
    """The snapshot store and the log the server of ``env`` uses, opened from this process."""
    url, prefix = env.get("GLN_REDIS_URL"), env.get("GLN_REDIS_KEY_PREFIX", "gln")
    return (open_store(url, env["GLN_SNAPSHOT_DIR"], key_prefix=prefix),
            open_wal(url, env["GLN_SNAPSHOT_DIR"], key_prefix=prefix))


def _wait_for_snapshot_version(url: str, name: str, version: int, timeout_s: float) -> None:
    """Poll the model until its current snapshot has at least ``version``."""
    deadline = time.monotonic() + timeout_s
    while True:
        snapshot = httpx.get(f"{url}/v1/models/{name}").json().get("snapshot") or {}
        if snapshot.get("version", 0) >= version:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"snapshot {snapshot} after {timeout_s} s, wanted version {version}")
        time.sleep(0.05)


def test_kill_9_mid_load_then_restart_is_exactly_once(
    log_settings: dict[str, str], tmp_path: Path, small_config: dict[str, Any]
) -> None:
    server = ServerProcess(
        {**log_settings, "GLN_SNAPSHOT_INTERVAL_S": "0.3"}, tmp_path / "server.log"
    )
    with server:
        server.start()
        learners = learn_on_a_new_model(server, small_config, seed=11)
        try:
            learners.wait_for_acks(ACKS_BEFORE_KILL, timeout_s=60)
            # Periodic snapshots (and trims) must happen under load; a fast machine can reach
            # the acks first, so the load goes on until two of them have.
            _wait_for_snapshot_version(server.url, "m", 3, timeout_s=30)
            learners.wait_for_acks(len(learners.acks) + 50, timeout_s=60)  # still mid-load
            server.kill()
            learners.pause()  # nothing reaches the restarted server until we have looked

            # What the dead server left behind: a snapshot and the log after it.
            store, wal = _store_and_log(log_settings)
            with store, wal:
                blob, snap = store.load("m")
                tail = list(wal.read_after("m", snap.metadata.get("wal_id")))
            held = GLN.from_bytes(blob).examples_seen + sum(len(e.labels) for e in tail)
            assert snap.version >= 3, "no periodic snapshot (and trim) happened under load"

            server.env["GLN_SNAPSHOT_INTERVAL_S"] = "3600"  # keep the tail for the retries
            server.start()
            # Ready means replayed: the model holds the snapshot plus every logged entry.
            info = httpx.get(f"{server.url}/v1/models/m").json()
            assert (info["examples_seen"], info["pending_examples"]) == (held, 0)
            assert info["snapshot"]["version"] == snap.version
            restored = re.findall(
                r"restored 'm': snapshot version (\d+), then (\d+) log entries", server.log_text()
            )
            assert restored == [(str(snap.version), str(len(tail)))]

            learners.resume()
            learners.wait_for_acks(len(learners.acks) + ACKS_AFTER_RESTART, timeout_s=60)
        finally:
            learners.stop(timeout_s=90)
        assert not learners.failures, learners.failures
        assert not learners.abandoned, learners.abandoned
        assert any(ack.attempts > 1 for ack in learners.acks), "no request was in flight"

        examples_seen = httpx.get(f"{server.url}/v1/models/m").json()["examples_seen"]
        r = httpx.post(f"{server.url}/v1/models/m/snapshot")
        assert r.status_code == 200, r.text
        assert server.terminate() == 0, server.log_text()[-3000:]

    result = check_exactly_once(learners.acks, examples_seen)
    assert result.ok, result.summary()
    assert result.examples == examples_seen
    store, wal = _store_and_log(log_settings)
    with store, wal:
        blob, _ = store.load("m")
    model = GLN.from_bytes(blob)
    assert model.examples_seen == examples_seen
    assert model.to_bytes() == reference_bytes(small_config, result.order)


def test_kill_9_keeps_the_rows_waiting_for_labels(
    log_settings: dict[str, str], tmp_path: Path, small_config: dict[str, Any]
) -> None:
    """Rows predicted with ids wait through a real crash: those snapshotted and those only
    logged; a row learned before the crash is not learned again."""
    server = ServerProcess({**log_settings, "GLN_SNAPSHOT_INTERVAL_S": "3600"},
                           tmp_path / "server.log")
    rows = [[0.1 * i - 0.3 * j for j in range(small_config["num_features"])] for i in range(4)]
    with server, httpx.Client(timeout=30) as client:
        server.start()
        url = server.url
        client.post(f"{url}/v1/models", json={"name": "m", "config": small_config})
        made = client.post(f"{url}/v1/models/m/predict",
                           json={"features": rows[:2], "ids": ["a", "b"]}).json()
        assert client.post(f"{url}/v1/models/m/snapshot").status_code == 200
        made_later = client.post(f"{url}/v1/models/m/predict",
                                 json={"features": rows[2:], "ids": ["c", "d"]}).json()
        first = client.post(f"{url}/v1/models/m/labels", json={"ids": ["c"], "labels": [1]})
        assert first.json()["learned"] == 1
        server.kill()
        server.start()
        after = client.post(f"{url}/v1/models/m/labels",
                            json={"ids": ["d", "c", "a", "b"], "labels": [0, 1, 2, 0]})
        info = client.get(f"{url}/v1/models/m").json()
        assert client.post(f"{url}/v1/models/m/snapshot").status_code == 200
    assert [(r["id"], r["status"]) for r in after.json()["results"]] == [
        ("d", 200), ("c", 404), ("a", 200), ("b", 200)]
    assert info["examples_seen"] == 4
    probs = made["probabilities"] + made_later["probabilities"]
    expected = -(np.log(probs[3][0]) + np.log(probs[0][2]) + np.log(probs[1][0])) / 3
    assert info["metrics"]["total"]["log_loss"] == pytest.approx(expected, rel=1e-9)
    reference = GLN(**small_config)
    for i, label in [(2, 1), (3, 0), (0, 2), (1, 0)]:
        reference.learn(np.asarray(rows[i:i + 1], np.float32), np.array([label]))
    store, wal = _store_and_log(log_settings)
    with store, wal:
        blob, _ = store.load("m")
    assert GLN.from_bytes(blob).to_bytes() == reference.to_bytes()
