"""The write-ahead log in NATS JetStream (``GLN_WAL_URL``), in the service: replay after a
restart, idempotency keys, and the stream's leader paused or killed under load.

Real processes throughout (tests/support/nats_process.py): a single ``nats-server`` for the
service in process, a three-node JetStream cluster (streams of three replicas) for a real server
process under keyed learn load from four client threads, whose stream leader is stopped with
SIGSTOP for 2.5 s and resumed, or killed with SIGKILL and started again. Every acknowledged request
must be in the model exactly once, and the model's bytes must equal a fresh model that learned
the acknowledged rows in order (tests/service/durable_client.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gln import GLN
from service.api.app import create_app
from service.settings import Settings
from service.storage.store import open_store
from service.storage.wal.nats_log import NatsWriteAheadLog
from tests.service.durable_client import (
    DurableLearners,
    ServerProcess,
    check_exactly_once,
    learn_on_a_new_model,
    reference_bytes,
)
from tests.service.staged_crash import learned_bytes, model_bytes, skip_shutdown_snapshots
from tests.support.nats_process import NatsCluster, nats_cluster

STREAM = "gln-wal"  # the log's stream under the default prefix
PAUSE_S = 2.5


async def test_a_restarted_app_replays_the_nats_log_and_knows_its_keys(
    nats_url, nats_prefix, tmp_path, serve, small_config, create_model, make_data
):
    """Learn (keyed, some requests coalesced), snapshot (the log is trimmed), learn more,
    crash: the restarted app holds exactly what was acknowledged, in the bytes it had, and
    answers a retried key as the duplicate it is, from the log."""
    settings = Settings(wal_url=nats_url, redis_key_prefix=nats_prefix,
                        snapshot_dir=str(tmp_path / "snapshots"), snapshot_interval_s=3600)
    batches = [make_data(n, seed=s) for s, n in enumerate([3, 1, 4, 2, 5, 1])]
    app = create_app(settings)
    answers = {}
    async with serve(app) as client:
        await create_model(client, "m", small_config)

        async def learn(i: int) -> None:
            X, y = batches[i]
            r = await client.post("/v1/models/m/learn", json={"features": X, "labels": y},
                                  headers={"Idempotency-Key": f"req-{i}"})
            assert r.status_code == 200, r.text
            answers[i] = r.json()

        await asyncio.gather(*(learn(i) for i in range(3)))
        assert (await client.post("/v1/models/m/snapshot")).status_code == 200
        for i in range(3, 6):
            await learn(i)
        crashed = await model_bytes(app, "m")
        skip_shutdown_snapshots(app)

    with NatsWriteAheadLog(nats_url, key_prefix=nats_prefix) as wal:
        tail = list(wal.read_after("m", open_store(None, settings.snapshot_dir).load("m")[1]
                                   .metadata["wal_id"]))
    assert [len(e.labels) for e in tail] == [2, 5, 1]  # the snapshot trimmed the rest

    restarted = create_app(settings)
    async with serve(restarted) as client:
        info = (await client.get("/v1/models/m")).json()
        assert await model_bytes(restarted, "m") == crashed
        X, y = batches[4]
        again = await client.post("/v1/models/m/learn", json={"features": X, "labels": y},
                                  headers={"Idempotency-Key": "req-4"})
        assert again.json() == {**answers[4], "duplicate": True}
        skip_shutdown_snapshots(restarted)
    assert info["examples_seen"] == 16
    order = sorted(range(6), key=lambda i: answers[i]["sequence"])
    assert crashed == learned_bytes(small_config, [batches[i] for i in order])


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    try:
        with nats_cluster(tmp_path / "nats") as started:
            yield started
    except FileNotFoundError as exc:
        pytest.skip(f"{exc}")


def _learn_through(
    cluster: NatsCluster, tmp_path: Path, small_config: dict[str, Any], fault: str,
) -> tuple[DurableLearners, float]:
    """A server on the cluster's R3 log, four keyed learners; after 100 acknowledged requests
    ``fault`` strikes the stream's leader. Returns the learners (stopped) and the seconds from
    the fault until a request sent after it was acknowledged."""
    server = ServerProcess({
        "GLN_WAL_URL": cluster.url, "GLN_SNAPSHOT_DIR": str(tmp_path / "snapshots"),
        "GLN_SNAPSHOT_INTERVAL_S": "1",  # snapshots and trims under load, across the fault
    }, tmp_path / "server.log")
    with server:
        server.start()
        learners = learn_on_a_new_model(server, small_config, seed=3)
        try:
            learners.wait_for_acks(100, timeout_s=60)
            leader = cluster.leader_of(STREAM)
            in_flight = len(learners.acks) + learners.threads
            struck = time.monotonic()
            if fault == "pause":
                leader.pause()
                time.sleep(PAUSE_S)
                # Held until the others have elected a leader of their own: it comes back
                # believing it leads, as a paused Redis primary does after a failover.
                cluster.leader_of(STREAM, other_than=leader.name)
                leader.resume()
            else:
                leader.kill()
            learners.wait_for_acks(in_flight + 1, timeout_s=60)
            outage_s = time.monotonic() - struck
            if fault == "kill":
                learners.wait_for_acks(len(learners.acks) + 50, timeout_s=60)
                leader.start()  # it catches up from the others, the learning goes on
            learners.wait_for_acks(len(learners.acks) + 100, timeout_s=60)
        finally:
            learners.stop(timeout_s=90)
        assert not learners.failures, (learners.failures, server.log_text()[-3000:])
        assert not learners.abandoned, learners.abandoned
        examples_seen = httpx.get(f"{server.url}/v1/models/m").json()["examples_seen"]
        assert httpx.post(f"{server.url}/v1/models/m/snapshot", timeout=30).status_code == 200
        assert server.terminate() == 0, server.log_text()[-3000:]

    result = check_exactly_once(learners.acks, examples_seen)
    assert (result.lost, result.duplicated, result.unexplained) == (0, 0, 0), result.summary()
    blob, _ = open_store(None, str(tmp_path / "snapshots")).load("m")
    assert GLN.from_bytes(blob).to_bytes() == reference_bytes(small_config, result.order)
    return learners, outage_s


def test_the_leader_paused_under_load_loses_and_repeats_nothing(
    cluster: NatsCluster, tmp_path: Path, small_config: dict[str, Any]
) -> None:
    """SIGSTOP of the stream's leader for 2.5 s, then SIGCONT: what it acknowledged before
    is on a majority, and what is asked of it meanwhile times out (503) and is retried."""
    learners, outage_s = _learn_through(cluster, tmp_path, small_config, "pause")
    assert outage_s < 30
    assert sum(learners.errors.values()) > 0  # the pause was felt, not slept through


def test_the_leader_killed_under_load_loses_and_repeats_nothing(
    cluster: NatsCluster, tmp_path: Path, small_config: dict[str, Any]
) -> None:
    """SIGKILL of the stream's leader: another node takes over, learning goes on, and the
    killed node, started again, catches up."""
    learners, outage_s = _learn_through(cluster, tmp_path, small_config, "kill")
    assert outage_s < 30
