"""``GLN_WORKERS`` > 1, as real processes: HTTP workers in front of one engine process.

Many clients through several workers leave a model byte-identical to a replay of its log
and of the acknowledged requests; a ``kill -9`` of the engine, or of a worker, under load
loses no acknowledged example and learns none twice; ``/metrics`` counts every worker's
requests wherever it is scraped.
"""

from __future__ import annotations

import os
import re
import signal
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
    DurableLearners,
    ServerProcess,
    check_exactly_once,
    reference_bytes,
)

pytestmark = pytest.mark.slow

WORKERS = 3


def _server(tmp_path: Path) -> ServerProcess:
    return ServerProcess({"GLN_WORKERS": str(WORKERS),
                          "GLN_SNAPSHOT_DIR": str(tmp_path / "snapshots"),
                          "GLN_SNAPSHOT_INTERVAL_S": "3600"}, tmp_path / "server.log")


ENGINE = r"engine \(pid (\d+)\) serving"
WORKER = r"Started server process \[(\d+)\]"


def _pids(server: ServerProcess, pattern: str) -> list[int]:
    return [int(pid) for pid in re.findall(pattern, server.log_text())]


def _kill_and_wait_for_another(server: ServerProcess, pattern: str, which: int) -> None:
    """SIGKILL the ``which``-th process the log names by ``pattern``; return once the log
    names one more (its replacement started)."""
    started = len(_pids(server, pattern))
    os.kill(_pids(server, pattern)[which], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while len(_pids(server, pattern)) <= started:
        assert time.monotonic() < deadline, server.log_text()[-3000:]
        time.sleep(0.05)


def _learn_then_stop(server: ServerProcess, config: dict[str, Any], disrupt: Any) -> tuple[
        DurableLearners, int, list[Any]]:
    """Keyed learns from 6 threads; ``disrupt()`` mid-load; then 100 more acks, a SIGTERM
    (exit status 0: every snapshot written). The learners, the examples seen, and the log's
    entries as they were before the shutdown snapshot trimmed them."""
    learners = DurableLearners(server.url, "m", config["num_features"], config["num_classes"],
                               threads=6, seed=5)
    server.start()
    r = httpx.post(f"{server.url}/v1/models", json={"name": "m", "config": config})
    assert r.status_code == 201, r.text
    learners.start()
    try:
        learners.wait_for_acks(150, timeout_s=60)
        disrupt()
        learners.wait_for_acks(len(learners.acks) + 100, timeout_s=60)
    finally:
        learners.stop(timeout_s=90)
    assert not learners.failures, learners.failures
    assert not learners.abandoned, learners.abandoned
    examples_seen = httpx.get(f"{server.url}/v1/models/m").json()["examples_seen"]
    with open_wal(None, server.env["GLN_SNAPSHOT_DIR"]) as wal:  # no snapshot yet
        entries = list(wal.read_after("m", None))
    assert server.terminate() == 0, server.log_text()[-3000:]
    return learners, examples_seen, entries


def _check(tmp_path: Path, config: dict[str, Any], learners: DurableLearners,
           examples_seen: int, entries: list[Any]) -> None:
    result = check_exactly_once(learners.acks, examples_seen)
    assert result.ok, result.summary()
    with open_store(None, str(tmp_path / "snapshots")) as store:
        model = GLN.from_bytes(store.load("m")[0])
    assert model.examples_seen == examples_seen
    assert model.to_bytes() == reference_bytes(config, result.order)
    birth, *learned = entries  # the log alone gives the same bytes, from the model's birth on
    replayed = GLN(**birth.config)
    for entry in learned:
        replayed.learn(entry.features, entry.labels)
    assert replayed.to_bytes() == model.to_bytes()


def test_many_clients_through_many_workers_learn_exactly_the_log(
    tmp_path: Path, small_config: dict[str, Any]
) -> None:
    with _server(tmp_path) as server:
        learners, examples_seen, entries = _learn_then_stop(server, small_config, lambda: None)
        assert len(set(_pids(server, WORKER))) == WORKERS
    _check(tmp_path, small_config, learners, examples_seen, entries)


@pytest.mark.parametrize(("process", "pattern", "which"), [
    ("engine", ENGINE, -1), ("worker", WORKER, 0)])
def test_kill_9_under_load_loses_nothing_acknowledged(
    tmp_path: Path, small_config: dict[str, Any], process: str, pattern: str, which: int
) -> None:
    """kill -9 of the engine process (it is started again and replays its log; the calls it
    had in flight get 503) or of an HTTP worker (uvicorn replaces it) while keyed clients
    learn: every acknowledged example is learned, none twice."""
    with _server(tmp_path) as server:
        learners, examples_seen, entries = _learn_then_stop(
            server, small_config, lambda: _kill_and_wait_for_another(server, pattern, which))
        if process == "engine":
            assert "the engine process died" in server.log_text()
            assert learners.errors, "no request saw the engine go"
    _check(tmp_path, small_config, learners, examples_seen, entries)


def test_metrics_count_every_workers_requests_and_the_engines_models(
    tmp_path: Path, small_config: dict[str, Any]
) -> None:
    with _server(tmp_path) as server, httpx.Client(base_url=server.url) as client:
        server.start()
        assert client.post("/v1/models", json={"name": "m", "config": small_config}
                           ).status_code == 201
        rows = np.zeros((1, small_config["num_features"])).tolist()
        for _ in range(30):  # each on a new connection: spread over the workers
            r = httpx.post(f"{server.url}/v1/models/m/learn",
                           json={"features": rows, "labels": [1]})
            assert r.status_code == 200, r.text
        page = client.get("/metrics").text
        assert server.terminate() == 0
    learned = re.search(r'^gln_http_requests_total\{method="POST",'
                        r'route="/v1/models/\{name\}/learn",status="200"\} (\S+)$', page, re.M)
    assert learned is not None and float(learned.group(1)) == 30
    assert re.search(r'^gln_examples_learned_total\{model="m"\} 30\.0$', page, re.M)
    assert page.count("# TYPE gln_http_requests_total") == 1
