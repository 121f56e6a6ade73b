"""Snapshots and restore: on demand, periodic, at shutdown; readiness; deletion.

The round-trip tests run against both stores: a directory (tmp_path) and a real Redis.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

import service.engine.local
from gln import GLN, SnapshotBuffer
from service.api.app import create_app
from service.engine.registry import PING_REUSE_S
from service.settings import Settings
from service.storage.store import open_store
from tests.service.conftest import snapshots_at_create
from tests.service.staged_crash import model_bytes, skip_shutdown_snapshots
from tests.support.redis_process import RedisProcess


def _store(settings: Settings):
    return open_store(
        settings.redis_url, settings.snapshot_dir, key_prefix=settings.redis_key_prefix
    )


async def test_restore_gives_the_same_model_on_a_new_app(
    store_settings: Settings, serve, create_model, make_data
):
    X, y = make_data(60)
    probe, _ = make_data(5, seed=3)
    async with serve(create_app(store_settings)) as client:
        await create_model(client, "fraud")
        await create_model(client, "other")
        r = await client.post("/v1/models/fraud/learn", json={"features": X, "labels": y})
        assert r.status_code == 200
        snap = (await client.post("/v1/models/fraud/snapshot")).json()
        assert snap["version"] == 1 + snapshots_at_create(store_settings)
        before = (await client.post("/v1/models/fraud/predict", json={"features": probe})).json()

    async with serve(create_app(store_settings)) as client:
        assert (await client.get("/readyz")).status_code == 200
        assert [m["name"] for m in (await client.get("/v1/models")).json()] == ["fraud", "other"]
        info = (await client.get("/v1/models/fraud")).json()
        assert info["examples_seen"] == 60
        # Before its first call a CPU model lacks its 16-bit normals (one model a configuration
        # is warmed up as restored), which the memory budget counts all along.
        assert info["nbytes"] <= GLN.estimate_nbytes(info["config"])
        assert info["snapshot"]["version"] == snap["version"]
        assert info["snapshot"]["sha256"] == snap["sha256"]
        # The restored snapshot's age and size are exported at once (the stale-snapshot alert
        # and the dashboard need them before the model's next snapshot).
        samples = {
            (s.name, s.labels.get("model")): s.value
            for family in text_string_to_metric_families((await client.get("/metrics")).text)
            for s in family.samples
        }
        assert samples[("gln_snapshot_last_success_timestamp_seconds", "fraud")] == (
            pytest.approx(snap["created_at"])
        )
        assert samples[("gln_snapshot_bytes", "fraud")] == snap["nbytes"]
        after = (await client.post("/v1/models/fraud/predict", json={"features": probe})).json()
        assert after == before
        info = (await client.get("/v1/models/fraud")).json()
        assert info["nbytes"] == GLN.estimate_nbytes(info["config"])
        # The stream continues where it stopped.
        r = await client.post("/v1/models/fraud/learn", json={"features": X[:2], "labels": y[:2]})
        assert r.json()["sequence"] == 60


async def test_shutdown_snapshots_changed_models_only(
    store_settings: Settings, serve, small_config, create_model, make_data
):
    X, y = make_data(30)
    app = create_app(store_settings)
    async with serve(app) as client:
        await create_model(client, "learned")
        await create_model(client, "idle")
        await client.post("/v1/models/learned/learn", json={"features": X, "labels": y})
    assert app.state.shutdown_clean is True

    store = _store(store_settings)
    try:
        blob, info = store.load("learned")
        assert info.version == 1 + snapshots_at_create(store_settings)  # (creation,) shutdown
        # Its first, at creation or (born in the log) at shutdown; not written again.
        assert store.load("idle")[1].version == 1
    finally:
        store.close()
    reference = GLN(**small_config)
    reference.learn(np.array(X), np.array(y))
    assert blob == reference.to_bytes()


async def test_a_shutdown_snapshots_the_most_changed_first_and_leaves_the_rest_to_the_log(
    settings: Settings, serve, create_model, make_data, monkeypatch: pytest.MonkeyPatch
):
    """GLN_SHUTDOWN_SNAPSHOT_S bounds the shutdown's snapshots: the model that learned the
    most is written first, no save starts past the bound, and a model left over comes back
    whole at the next start, from its birth and the log."""
    import service.engine.registry as registry_module
    from service.storage.store.directory_store import DirectorySnapshotStore

    app = create_app(settings.model_copy(update={"shutdown_snapshot_s": 0.2}))
    async with serve(app) as client:
        for name, requests in (("little", 1), ("much", 3)):
            await create_model(client, name)
            for seed in range(requests):
                X, y = make_data(2, seed=seed)
                assert (await client.post(f"/v1/models/{name}/learn",
                                          json={"features": X, "labels": y})).status_code == 200
        before = {name: await model_bytes(app, name) for name in ("little", "much")}
        save = DirectorySnapshotStore.save

        def slow_save(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            time.sleep(0.5)
            return save(self, *args, **kwargs)

        monkeypatch.setattr(DirectorySnapshotStore, "save", slow_save)
        monkeypatch.setattr(registry_module, "PARALLEL_MODELS", 1)  # one save at a time
    assert app.state.shutdown_clean is True  # what is left is in the log: nothing failed
    monkeypatch.undo()
    with _store(settings) as store:
        assert store.names() == ["much"]
    restarted = create_app(settings)
    async with serve(restarted) as client:
        infos = {m["name"]: m for m in (await client.get("/v1/models")).json()}
        after = {name: await model_bytes(restarted, name) for name in ("little", "much")}
    assert after == before
    assert infos["little"]["snapshot"] is None and infos["much"]["snapshot"]["version"] == 1


async def test_periodic_snapshots_write_only_changed_models(
    settings: Settings, serve, create_model, make_data
):
    fast = settings.model_copy(update={"snapshot_interval_s": 0.05})
    app = create_app(fast)
    async with serve(app) as client:
        await create_model(client, "a")
        await create_model(client, "b")
        X, y = make_data(5)
        await client.post("/v1/models/a/learn", json={"features": X, "labels": y})
        deadline = time.monotonic() + 10
        # Born in the log, both get their first snapshot from a periodic pass.
        for name in "ab":
            while (await client.get(f"/v1/models/{name}")).json()["snapshot"] is None:
                assert time.monotonic() < deadline, "no periodic snapshot within 10 s"
                await asyncio.sleep(0.02)
        await client.post("/v1/models/b/learn", json={"features": X, "labels": y})
        while (await client.get("/v1/models/b")).json()["snapshot"]["version"] < 2:
            assert time.monotonic() < deadline, "no periodic snapshot within 10 s"
            await asyncio.sleep(0.02)
        # A pass with nothing changed writes nothing.
        assert await app.state.engine.registry.snapshot_changed() is True
        assert (await client.get("/v1/models/a")).json()["snapshot"]["version"] == 1
        assert (await client.get("/v1/models/b")).json()["snapshot"]["version"] == 2


async def test_learning_goes_on_while_a_snapshot_is_checksummed_and_stored(
    store_settings: Settings, serve, small_config, create_model, make_data, monkeypatch
):
    """A snapshot stops the model only to copy its arrays: a learn request is answered while
    the copy is still being checksummed, and the snapshot holds the state of its copy."""
    X, y = make_data(20)
    sealing, release = threading.Event(), threading.Event()
    seal = SnapshotBuffer.seal

    def slow_seal(self):
        sealing.set()
        assert release.wait(10), "the learn request did not go on beside the snapshot"
        return seal(self)

    async with serve(create_app(store_settings)) as client:
        await create_model(client, "m")
        await client.post("/v1/models/m/learn", json={"features": X[:10], "labels": y[:10]})
        monkeypatch.setattr(SnapshotBuffer, "seal", slow_seal)
        snapshot = asyncio.create_task(client.post("/v1/models/m/snapshot"))
        assert await asyncio.to_thread(sealing.wait, 10)
        r = await asyncio.wait_for(
            client.post("/v1/models/m/learn", json={"features": X[10:], "labels": y[10:]}), 10
        )
        assert r.status_code == 200 and not snapshot.done()
        release.set()
        snap = (await snapshot).json()
        monkeypatch.setattr(SnapshotBuffer, "seal", seal)
    reference = GLN(**small_config)
    reference.learn(np.array(X[:10]), np.array(y[:10]))
    assert snap["version"] == 1 + snapshots_at_create(store_settings)
    assert snap["sha256"] == hashlib.sha256(reference.to_bytes()).hexdigest()


async def test_delete_removes_snapshots(store_settings: Settings, serve, create_model):
    async with serve(create_app(store_settings)) as client:
        await create_model(client, "gone")
        await create_model(client, "kept")
        for name in ("gone", "kept"):
            await client.post(f"/v1/models/{name}/snapshot")
        assert (await client.delete("/v1/models/gone")).status_code == 204
        store = _store(store_settings)
        try:
            assert store.names() == ["kept"]
        finally:
            store.close()
    async with serve(create_app(store_settings)) as client:
        assert (await client.get("/v1/models/gone")).status_code == 404
        assert [m["name"] for m in (await client.get("/v1/models")).json()] == ["kept"]


async def test_a_delete_the_snapshot_directory_refuses_is_a_503_and_keeps_the_model(
    settings: Settings, serve, create_model, make_data, monkeypatch: pytest.MonkeyPatch
):
    """Where the file system refuses to remove a model's directory, the client is told, the
    model keeps serving and learning, and a restart still has it."""
    async with serve(create_app(settings)) as client:
        await create_model(client, "kept")
        await client.post("/v1/models/kept/snapshot")  # the store holds its directory
        X, y = make_data(3)
        with monkeypatch.context() as patched:
            def refused(self: Path, target: Path) -> None:
                raise PermissionError(13, "Permission denied", str(self))

            patched.setattr(Path, "rename", refused)
            r = await client.delete("/v1/models/kept")
        assert r.status_code == 503, r.text
        r = await client.post("/v1/models/kept/learn", json={"features": X, "labels": y})
        assert r.status_code == 200
    async with serve(create_app(settings)) as client:
        r = await client.get("/v1/models/kept")
        assert r.status_code == 200 and r.json()["examples_seen"] == 3


async def test_delete_lets_queued_learning_finish(
    client: httpx.AsyncClient, app, settings, create_model, make_data
):
    await create_model(client)
    entry = await app.state.engine.registry.get("m")
    X, y = make_data(4)
    learns = [
        asyncio.ensure_future(client.post("/v1/models/m/learn", json={"features": X, "labels": y}))
        for _ in range(20)
    ]
    while entry.pending_examples == 0:  # yield to the loop until requests are queued
        await asyncio.sleep(0)
    r = await client.delete("/v1/models/m")
    assert r.status_code == 204
    responses = [await f for f in learns]
    learned = [r.json()["sequence"] for r in responses if r.status_code == 200]
    assert {r.status_code for r in responses} <= {200, 404}
    # The queued requests were learned (not dropped) before the model went away.
    assert learned and sorted(learned) == list(range(0, 4 * len(learned), 4))
    assert (await client.get("/v1/models/m")).status_code == 404
    # No snapshot resurrected the model after its deletion.
    assert open_store(None, settings.snapshot_dir).names() == []


class _GatedStore:
    """A real store whose ``names`` waits for a gate, and whose ``load`` takes ``load_s``:
    start-up restore takes as long as we say."""

    def __init__(self, inner, gate: threading.Event, load_s: float = 0.0) -> None:
        self._inner = inner
        self._gate = gate
        self._load_s = load_s

    def names(self):
        self._gate.wait(timeout=30)
        return self._inner.names()

    def load(self, name: str):
        time.sleep(self._load_s)
        return self._inner.load(name)

    def __getattr__(self, attr: str):
        return getattr(self._inner, attr)


def _gate_the_store(monkeypatch: pytest.MonkeyPatch, gate: threading.Event,
                    load_s: float = 0.0) -> None:
    real_open_store = service.engine.local.open_store
    monkeypatch.setattr(
        service.engine.local, "open_store",
        lambda *a, **k: _GatedStore(real_open_store(*a, **k), gate, load_s)
    )


async def test_readyz_is_503_until_the_stored_models_are_listed(
    settings: Settings, serve, create_model, monkeypatch: pytest.MonkeyPatch
):
    async with serve(create_app(settings)) as client:
        await create_model(client, "stored")

    gate = threading.Event()
    _gate_the_store(monkeypatch, gate)
    impatient = settings.model_copy(update={"restore_wait_s": 0.05})
    app = create_app(impatient)
    try:
        async with serve(app, wait_restored=False) as client:
            assert (await client.get("/healthz")).status_code == 200
            r = await client.get("/readyz")
            assert r.status_code == 503 and "restoring" in r.json()["detail"]
            assert r.headers["retry-after"] == "1"
            # A stored model may still be on its way: 503, not a misleading 404 or list.
            assert (await client.get("/v1/models/stored")).status_code == 503
            assert (await client.get("/v1/models")).status_code == 503
            gate.set()
            await app.state.engine.registry.wait_restored()
            assert (await client.get("/readyz")).status_code == 200
            assert (await client.get("/v1/models/stored")).status_code == 200
    finally:
        gate.set()


async def test_a_stored_model_asked_for_is_loaded_ahead_of_the_others(
    settings: Settings, serve, create_model, small_config, make_data,
    monkeypatch: pytest.MonkeyPatch
):
    """Ready once the names are listed, whatever the model count: a request for a model the
    background restore has not reached loads it at once, with everything it learned."""
    names = [f"m{i:02d}" for i in range(40)]
    X, y = make_data(3)
    async with serve(create_app(settings)) as client:
        for name in names:
            await create_model(client, name, small_config)
        r = await client.post(f"/v1/models/{names[-1]}/learn", json={"features": X, "labels": y})
        assert r.status_code == 200

    gate = threading.Event()
    gate.set()
    _gate_the_store(monkeypatch, gate, load_s=0.1)  # 40 loads on 2 store threads: >= 2 s
    app = create_app(settings)
    async with serve(app, wait_restored=False) as client:
        registry = app.state.engine.registry
        while (await client.get("/readyz")).status_code != 200:
            await asyncio.sleep(0.01)
        assert not registry.restored
        last = await client.get(f"/v1/models/{names[-1]}")  # the background loads it last
        assert last.status_code == 200 and last.json()["examples_seen"] == 3
        assert not registry.restored
        assert (await client.get("/v1/models/never-stored")).status_code == 404
        await registry.wait_restored()
        assert [m["name"] for m in (await client.get("/v1/models")).json()] == names


async def test_an_unreadable_snapshot_is_a_degraded_readiness_until_deleted(
    settings: Settings, serve, create_model
):
    """The other models are served, so the process stays ready: degraded, naming the model,
    and counted in gln_models_unrestored."""
    async with serve(create_app(settings)) as client:
        await create_model(client, "good")
        await create_model(client, "broken")
    version_file = Path(settings.snapshot_dir) / "broken" / "v1.snap"
    version_file.write_bytes(b"not a snapshot" + version_file.read_bytes()[14:])

    async with serve(create_app(settings.model_copy(update={"max_models": 2}))) as client:
        r = await client.get("/readyz")
        assert r.status_code == 200 and r.json()["status"] == "degraded"
        assert "broken" in r.json()["problems"][0]
        scrape = (await client.get("/metrics")).text
        assert "gln_models_unrestored 1.0" in scrape and "gln_ready 1.0" in scrape
        # It keeps its room too, and the limit's message says so.
        r = await client.post("/v1/models", json={"name": "third", "config": {"num_features": 2}})
        assert r.status_code == 409
        assert r.json()["detail"].startswith(
            "the server holds 1 model and 1 that could not be restored (broken; GET /v1/")
        assert (await client.get("/v1/models/good")).status_code == 200  # the others serve
        broken = await client.get("/v1/models/broken")
        assert broken.status_code == 404
        assert "could not be restored" in broken.json()["detail"]
        assert "DELETE /v1/models/broken" in broken.json()["detail"]
        # Its name stays taken until the operator deletes the bad snapshot, and a create or an
        # import of it says so.
        r = await client.post("/v1/models", json={"name": "broken", "config": {"num_features": 2}})
        assert r.status_code == 409
        assert r.json()["detail"].startswith("model 'broken' is stored but could not be restored")
        assert r.json()["detail"].endswith(
            "DELETE /v1/models/broken removes it, or a create with replace_unrestored: true "
            "replaces it")
        blob = await client.get("/v1/models/good/export")
        r = await client.post("/v1/models/broken/import", content=blob.content,
                              headers={"content-type": "application/octet-stream"})
        assert r.status_code == 409 and "could not be restored" in r.json()["detail"]
        assert (await client.delete("/v1/models/broken")).status_code == 204
        assert (await client.get("/readyz")).json() == {"status": "ready", "problems": []}
        assert "gln_models_unrestored 0.0" in (await client.get("/metrics")).text
        assert open_store(None, settings.snapshot_dir).names() == ["good"]


async def test_with_reads_behind_the_token_readyz_names_an_unrestored_model_not_why(
    settings: Settings, serve, create_model
):
    """/readyz stays open for probes; why a model failed (its store's words) is for token
    holders, from GET /v1/models/<name>."""
    async with serve(create_app(settings)) as client:
        await create_model(client, "broken")
    version_file = Path(settings.snapshot_dir) / "broken" / "v1.snap"
    version_file.write_bytes(b"not a snapshot" + version_file.read_bytes()[14:])
    locked = settings.model_copy(update={"api_token": SecretStr("t0ken"), "token_for_reads": True})
    app = create_app(locked)
    async with serve(app) as client:
        why = app.state.engine.registry.failed["broken"]
        problems = (await client.get("/readyz")).json()["problems"]
        assert len(problems) == 1 and "broken" in problems[0] and why not in problems[0]
        assert (await client.get("/v1/models/broken")).status_code == 401
        detail = (await client.get("/v1/models/broken", headers={
            "authorization": "Bearer t0ken"})).json()["detail"]
        assert why in detail


async def test_unreachable_redis_keeps_readyz_503(serve, tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = Settings(redis_url=f"redis://127.0.0.1:{port}/0", snapshot_dir=str(tmp_path),
                        restore_wait_s=0.1)
    async with serve(create_app(settings), wait_restored=False) as client:
        assert (await client.get("/healthz")).status_code == 200
        r = await client.get("/readyz")
        assert r.status_code == 503
        assert "snapshot store is unreachable" in r.json()["detail"]
        # The API says why it waits, too.
        r = await client.get("/v1/models")
        assert r.status_code == 503
        assert r.json()["detail"] == (
            "models are still being restored from snapshots (the snapshot store is "
            "unreachable; retrying: GET /readyz says more); retry shortly")


async def test_store_failure_after_start(
    settings: Settings, client: httpx.AsyncClient, create_model, small_config, make_data
):
    """The snapshot directory disappears (replaced by a file): degraded, snapshots of changed
    models refused, gln_store_up 0; predictions go on, and so do creates (a model is born in
    the log, its first snapshot comes later)."""
    await create_model(client, "m")
    X, y = make_data(3)
    assert (await client.post("/v1/models/m/learn",
                              json={"features": X, "labels": y})).status_code == 200
    snapshot_dir = Path(settings.snapshot_dir)
    for path in sorted(snapshot_dir.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    snapshot_dir.rmdir()
    snapshot_dir.write_text("in the way")

    await asyncio.sleep(PING_REUSE_S)  # the ping of the last readiness answer has aged out
    r = await client.get("/readyz")
    assert r.status_code == 200 and r.json()["status"] == "degraded"
    assert "unreachable" in r.json()["problems"][0]
    assert "gln_store_up 0.0" in (await client.get("/metrics")).text
    assert (await client.post("/v1/models/m/predict",
                              json={"features": [[0.0] * small_config["num_features"]]})
            ).status_code == 200
    r = await client.post("/v1/models", json={"name": "new", "config": small_config})
    assert r.status_code == 201 and r.json()["snapshot"] is None
    assert (await client.get("/v1/models/new")).status_code == 200
    r = await client.post("/v1/models/m/snapshot")
    assert r.status_code == 503 and "snapshot store" in r.json()["detail"]
    assert "gln_snapshot_failures_total 1.0" in (await client.get("/metrics")).text
    snapshot_dir.unlink()  # let the shutdown snapshot pass (the dir store recreates paths)


async def test_a_hung_redis_holds_no_thread_that_predictions_need(
    serve, tmp_path, small_config, make_data
):
    """Readiness pings of a Redis that answers nothing (SIGSTOP) run one at a time in a thread
    of their own, with a short timeout: however many probes wait, predict answers at once (the
    pings used to take the model workers, for up to a minute each)."""
    try:
        server = RedisProcess(tmp_path / "redis")
    except FileNotFoundError as exc:
        pytest.skip(f"{exc}")
    settings = Settings(redis_url=server.url, snapshot_dir=str(tmp_path / "snaps"),
                        worker_threads=2, snapshot_interval_s=3600)
    X, y = make_data(4)
    with server:
        async with serve(create_app(settings)) as client:
            r = await client.post("/v1/models", json={"name": "m", "config": small_config})
            assert r.status_code == 201
            assert (await client.post("/v1/models/m/learn",
                                      json={"features": X, "labels": y})).status_code == 200
            await asyncio.sleep(PING_REUSE_S)
            server.pause()
            try:
                probes = [asyncio.create_task(client.get("/readyz")) for _ in range(6)]
                await asyncio.sleep(0.1)  # every probe is waiting on the ping
                predicted = await asyncio.wait_for(
                    client.post("/v1/models/m/predict", json={"features": X}), 10)
                assert predicted.status_code == 200
                assert not any(probe.done() for probe in probes)  # still waiting on Redis
                answers = await asyncio.wait_for(asyncio.gather(*probes), 10)
            finally:
                server.resume()
            assert {a.json()["status"] for a in answers} == {"degraded"}
            await asyncio.sleep(PING_REUSE_S)
            assert (await client.get("/readyz")).json()["status"] == "ready"


async def test_a_damaged_store_is_reported_without_the_hosts_paths(
    settings: Settings, serve, create_model
):
    """Why a model could not be restored names its file within the store, not where the store
    lies on the host (a 404's and /readyz's words reach any client)."""
    async with serve(create_app(settings)) as client:
        await create_model(client, "broken")
    for head in ("HEAD", "v1.head"):  # the pointer and the version's own head
        (Path(settings.snapshot_dir) / "broken" / head).write_bytes(b"{not json")
    app = create_app(settings)
    async with serve(app) as client:
        problems = " ".join((await client.get("/readyz")).json()["problems"])
        detail = (await client.get("/v1/models/broken")).json()["detail"]
    assert "broken/HEAD is not JSON" in problems and "broken/HEAD" in detail
    for words in (problems, detail):
        assert str(Path(settings.snapshot_dir).resolve()) not in words
        assert settings.snapshot_dir not in words


async def test_a_directory_that_lost_its_head_is_damage_not_a_model_that_never_was(
    settings: Settings, serve, create_model, make_data
):
    """HEAD removed under a model that learned: the restart shows it unrestored with the
    reason (/readyz, its info), a create of the name is refused and deletes nothing, and the
    log with its acknowledged examples is still there for whoever repairs the store."""
    app = create_app(settings)
    async with serve(app) as client:
        await create_model(client, "m")
        await client.post("/v1/models/m/snapshot")  # its first: the birth leaves the log
        X, y = make_data(5)
        assert (await client.post("/v1/models/m/learn", json={"features": X, "labels": y})
                ).status_code == 200
        skip_shutdown_snapshots(app)  # the examples are in the log alone
    model_dir = Path(settings.snapshot_dir) / "m"
    for head in (model_dir / "HEAD", *model_dir.glob("v*.head")):  # the pointer and every
        head.unlink()  # version's own head: nothing says what the snapshot files hold
    log_dir = Path(settings.snapshot_dir) / "wal~"  # the file log, of every model

    def log_bytes() -> list[bytes]:
        return [segment.read_bytes() for segment in sorted(log_dir.iterdir())]

    log_before = log_bytes()
    async with serve(create_app(settings)) as client:
        readiness = (await client.get("/readyz")).json()
        info = await client.get("/v1/models/m")
        create = await client.post("/v1/models", json={"name": "m", "config": {
            "num_features": 6}})
        kept_log = log_bytes()
        forced = await client.post("/v1/models", json={"name": "m", "config": {
            "num_features": 6}, "replace_unrestored": True})
        ready = (await client.get("/readyz")).json()
    assert readiness["status"] == "degraded" and "m/HEAD is missing" in readiness["problems"][0]
    assert info.status_code == 404 and "HEAD is missing, though its log entries remain" in info.text
    assert create.status_code == 409 and "replace_unrestored" in create.text
    assert kept_log == log_before  # nothing acknowledged is gone until the replace says so
    assert forced.status_code == 201 and forced.json()["examples_seen"] == 0
    assert ready["status"] == "ready"


async def test_a_hung_redis_bounds_learns_and_never_holds_predictions(
    serve, tmp_path, small_config, make_data, create_model
):
    """Redis stopped (SIGSTOP) under learns of three models and snapshots of all: each learn is
    answered 503 with Retry-After within about GLN_WAL_TIMEOUT_S, a prediction of a model is
    answered meanwhile, and once Redis resumes the models learn again (before, every model
    thread sat in an append for the 60 s socket timeout, and an idle model's prediction took
    9.8 s)."""
    try:
        server = RedisProcess(tmp_path / "redis")
    except FileNotFoundError as exc:
        pytest.skip(f"{exc}")
    settings = Settings(redis_url=server.url, snapshot_dir=str(tmp_path / "snaps"),
                        worker_threads=2, snapshot_interval_s=3600, wal_timeout_s=0.5)
    X, y = make_data(4)
    body = {"features": X, "labels": y}
    with server:
        app = create_app(settings)
        async with serve(app) as client:
            for name in ("a", "b", "c", "idle"):
                await create_model(client, name, small_config)
            server.pause()
            try:
                t0 = time.monotonic()
                learns = [asyncio.create_task(client.post(f"/v1/models/{name}/learn", json=body))
                          for name in ("a", "b", "c") for _ in range(3)]
                snapshots = asyncio.create_task(app.state.engine.registry.snapshot_changed())
                await asyncio.sleep(0.1)
                predicted = await asyncio.wait_for(
                    client.post("/v1/models/idle/predict", json={"features": X}), 5)
                predict_s = time.monotonic() - t0
                answers = await asyncio.wait_for(asyncio.gather(*learns), 20)
                learns_s = time.monotonic() - t0
            finally:
                server.resume()
            await asyncio.wait_for(snapshots, 90)
            again = await client.post("/v1/models/a/learn", json=body)
    assert predicted.status_code == 200 and predict_s < 2.0
    assert {r.status_code for r in answers} == {503}
    assert all(r.headers["retry-after"] == "1" for r in answers)
    assert learns_s < 10  # three models' appends in turn on two threads, each about 0.5 s
    assert again.status_code == 200


async def test_a_damaged_newest_snapshot_restores_from_an_older_kept_one_and_the_log(
    store_settings: Settings, serve, create_model, make_data
):
    """GLN_SNAPSHOT_KEEP=3: the newest snapshot damaged, the restart loads the newest whole
    one kept, replays the log from its entry (the log is trimmed only past the oldest kept),
    and serves the model whole: the same bytes as before, the fallback counted and said."""
    app = create_app(store_settings)
    async with serve(app) as client:
        await create_model(client, "m")
        for seed in range(3):
            X, y = make_data(4, seed=seed)
            assert (await client.post("/v1/models/m/learn", json={"features": X, "labels": y})
                    ).status_code == 200
            assert (await client.post("/v1/models/m/snapshot")).status_code == 200
        before = await model_bytes(app, "m")
        skip_shutdown_snapshots(app)
    store = open_store(store_settings.redis_url, store_settings.snapshot_dir,
                       key_prefix=store_settings.redis_key_prefix, keep=3)
    with store:
        first = 1 + snapshots_at_create(store_settings)
        assert [info.version for info in store.kept("m")] == [first, first + 1, first + 2]
        blob, info = store.load("m")
        damaged = bytearray(blob)
        damaged[-1] ^= 0xFF  # a flipped byte of the newest, written behind the store's back
        if store_settings.redis_url:
            key = f"{store_settings.redis_key_prefix}:model:m:v{first + 2}:chunk:0"
            client = redis.Redis.from_url(store_settings.redis_url)
            chunk = bytearray(client.get(key))
            chunk[0] ^= 0xFF
            client.set(key, bytes(chunk))
            client.close()
        else:
            (Path(store_settings.snapshot_dir) / "m" / f"v{first + 2}.snap").write_bytes(
                bytes(damaged))
    restarted = create_app(store_settings)
    async with serve(restarted) as client:
        info_after = (await client.get("/v1/models/m")).json()
        page = (await client.get("/metrics")).text
        after = await model_bytes(restarted, "m")
    assert after == before and info_after["examples_seen"] == 12
    assert "gln_snapshot_fallbacks_total 1.0" in page
