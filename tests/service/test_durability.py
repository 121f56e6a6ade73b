"""The write-ahead log inside the service: replay after a crash, trims, idempotency, limits.

A crash is staged in process: the app's models are marked as snapshotted before shutdown, so
the shutdown writes no snapshot, exactly as if the process had died after its last answer.
(The real ``kill -9`` of a server process is in test_crash_recovery.py.) Every test runs
against the file log and a real Redis log where the store kind matters.
"""

from __future__ import annotations

import asyncio
import shutil
from typing import Any

import numpy as np
import pytest
import redis

from gln import GLN
from service.api.app import create_app
from service.engine.snapshot_blob import WAL_ID
from service.settings import Settings
from service.storage.store import open_store
from service.storage.wal import open_wal
from tests.service.staged_crash import learned_bytes, model_bytes, skip_shutdown_snapshots


def _store(settings: Settings):
    return open_store(
        settings.redis_url, settings.snapshot_dir, key_prefix=settings.redis_key_prefix
    )


def _wal(settings: Settings):
    return open_wal(settings.redis_url, settings.snapshot_dir, key_prefix=settings.redis_key_prefix)


def _learned_in_order(config: dict[str, Any], answers: list[tuple[dict, list, list]]) -> bytes:
    """Bytes of a fresh model that learns each answered request's rows in sequence order."""
    model = GLN(**config)
    for _, X, y in sorted(answers, key=lambda a: a[0]["sequence"]):
        model.learn(np.asarray(X, dtype=np.float32), np.asarray(y))
    return model.to_bytes()


async def test_restart_replays_the_log_after_the_latest_snapshot(
    store_settings: Settings, serve, small_config, create_model, make_data
):
    requests = [make_data(n, seed=s) for s, n in enumerate([3, 1, 7, 2, 5, 4, 1, 6])]
    answers = []
    app = create_app(store_settings)
    async with serve(app) as client:
        await create_model(client, "m", small_config)

        async def learn(X, y):
            r = await client.post("/v1/models/m/learn", json={"features": X, "labels": y})
            assert r.status_code == 200, r.text
            answers.append((r.json(), X, y))

        await asyncio.gather(*(learn(X, y) for X, y in requests[:4]))  # coalesced chunks
        assert (await client.post("/v1/models/m/snapshot")).status_code == 200
        for X, y in requests[4:]:
            await learn(X, y)
        crashed_bytes = await model_bytes(app, "m")
        skip_shutdown_snapshots(app)

    with _store(store_settings) as store:
        _, info = store.load("m")
    with _wal(store_settings) as wal:
        tail = list(wal.read_after("m", info.metadata[WAL_ID]))
    assert sum(len(e.labels) for e in tail) == sum(len(y) for _, y in requests[4:])

    restarted = create_app(store_settings)
    async with serve(restarted) as client:
        assert (await client.get("/readyz")).status_code == 200
        assert (await client.get("/v1/models/m")).json()["examples_seen"] == 29
        assert await model_bytes(restarted, "m") == crashed_bytes
    assert crashed_bytes == _learned_in_order(small_config, answers)


@pytest.mark.parametrize("keep", [1, 3])
async def test_a_snapshot_records_its_log_entry_and_trims_the_log(
    store_settings: Settings, serve, small_config, create_model, make_data, keep
):
    """A snapshot records the newest entry its weights include; the log is trimmed through
    the entry of the oldest snapshot kept (GLN_SNAPSHOT_KEEP), so that a restore may fall back
    to any kept one and replay from there."""
    X, y = make_data(10)
    settings = store_settings.model_copy(update={"snapshot_keep": keep})
    async with serve(create_app(settings)) as client:
        await create_model(client, "m", small_config)
        await client.post("/v1/models/m/learn", json={"features": X, "labels": y})
        await client.post("/v1/models/m/snapshot")
        later = (await client.post(
            "/v1/models/m/learn", json={"features": X[:2], "labels": y[:2]}
        )).json()
        await client.post("/v1/models/m/snapshot")
        last = (await client.post(
            "/v1/models/m/learn", json={"features": X[2:3], "labels": y[2:3]}
        )).json()
        with _store(store_settings) as store, _wal(store_settings) as wal:
            assert store.load("m")[1].metadata == {WAL_ID: later["log_id"]}
            logged = [e.id for e in wal.read_after("m", None)]
    # keep=1: trimmed through the newest snapshot's entry; keep=3: through the first
    # snapshot's (the oldest kept), so the entry after it stays. The model's birth, before
    # both, is gone either way.
    assert logged == ([last["log_id"]] if keep == 1 else [later["log_id"], last["log_id"]])


async def test_a_retried_idempotency_key_is_learned_once(
    settings: Settings, serve, small_config, create_model, make_data
):
    X, y = make_data(3)
    body = {"features": X, "labels": y}
    async with serve(create_app(settings)) as client:
        await create_model(client, "m", small_config)
        first = await client.post("/v1/models/m/learn", json=body,
                                  headers={"Idempotency-Key": "order-17"})
        again = await client.post("/v1/models/m/learn", json=body,
                                  headers={"Idempotency-Key": "order-17"})
        other = await client.post("/v1/models/m/learn", json=body,
                                  headers={"Idempotency-Key": "order-18"})
        info = (await client.get("/v1/models/m")).json()
        metrics = (await client.get("/metrics")).text
    assert first.status_code == again.status_code == other.status_code == 200
    assert first.json()["duplicate"] is False and again.json()["duplicate"] is True
    assert {k: v for k, v in again.json().items() if k != "duplicate"} == {
        k: v for k, v in first.json().items() if k != "duplicate"
    }
    assert other.json()["sequence"] == 3
    assert info["examples_seen"] == 6
    assert "gln_learn_duplicates_total 1.0" in metrics


async def test_two_idempotency_keys_on_one_request_are_refused_and_nothing_is_learned(
    settings: Settings, serve, small_config, create_model, make_data
):
    """Which of two keys a client meant, no server can tell: keying the request under either
    would make a later retry under the other learn it twice."""
    X, y = make_data(3)
    async with serve(create_app(settings)) as client:
        await create_model(client, "m", small_config)
        r = await client.post("/v1/models/m/learn", json={"features": X, "labels": y},
                              headers=[("Idempotency-Key", "a"), ("Idempotency-Key", "b")])
        assert r.status_code == 422
        assert "one Idempotency-Key header, got 2" in r.text
        assert (await client.get("/v1/models/m")).json()["examples_seen"] == 0
        for key in ("a", "b"):  # neither key was used
            r = await client.post("/v1/models/m/learn", json={"features": X, "labels": y},
                                  headers={"Idempotency-Key": key})
            assert r.status_code == 200 and r.json()["duplicate"] is False


async def test_the_same_key_twice_in_one_chunk_is_learned_once(
    settings: Settings, serve, small_config, create_model, make_data
):
    X, y = make_data(2)
    async with serve(create_app(settings)) as client:
        await create_model(client, "m", small_config)
        answers = await asyncio.gather(*(
            client.post("/v1/models/m/learn", json={"features": X, "labels": y},
                        headers={"Idempotency-Key": "same"})
            for _ in range(6)
        ))
        info = (await client.get("/v1/models/m")).json()
    assert info["examples_seen"] == 2
    bodies = [a.json() for a in answers]
    assert sorted(b["duplicate"] for b in bodies) == [False] + [True] * 5
    assert {b["sequence"] for b in bodies} == {0}


async def test_a_duplicate_after_a_restart_gets_the_original_answer_from_the_log(
    store_settings: Settings, serve, small_config, create_model, make_data
):
    X, y = make_data(4)
    body, key = {"features": X, "labels": y}, {"Idempotency-Key": "k1"}
    app = create_app(store_settings)
    async with serve(app) as client:
        await create_model(client, "m", small_config)
        original = (await client.post("/v1/models/m/learn", json=body, headers=key)).json()
        skip_shutdown_snapshots(app)
    async with serve(create_app(store_settings)) as client:
        retried = (await client.post("/v1/models/m/learn", json=body, headers=key)).json()
        # Once a snapshot has trimmed the entry away, the key is still known but the answer
        # is not: the duplicate is reported without it.
        await client.post("/v1/models/m/snapshot")
    async with serve(create_app(store_settings)) as client:
        late = (await client.post("/v1/models/m/learn", json=body, headers=key)).json()
        info = (await client.get("/v1/models/m")).json()
    assert retried == {**original, "duplicate": True}
    assert late == {"examples": 4, "sequence": None, "probabilities": None, "log_loss": None,
                    "duplicate": True, "log_id": original["log_id"]}
    assert info["examples_seen"] == 4


@pytest.mark.parametrize("logged", [True, False])
async def test_a_used_key_with_other_data_is_refused_and_nothing_is_learned(
    tmp_path, serve, small_config, create_model, make_data, logged
):
    settings = Settings(snapshot_dir=str(tmp_path), snapshot_interval_s=3600, wal_enabled=logged)
    X, y = make_data(3)
    key = {"Idempotency-Key": "order-17"}
    other_rows = [[*X[0][:-1], X[0][-1] + 1.0], *X[1:]]
    other_labels = [1 - y[0], *y[1:]]
    async with serve(create_app(settings)) as client:
        await create_model(client, "m", small_config)
        first = await client.post("/v1/models/m/learn", json={"features": X, "labels": y},
                                  headers=key)
        refused = [
            await client.post("/v1/models/m/learn", json=body, headers=key)
            for body in ({"features": other_rows, "labels": y},
                         {"features": X, "labels": other_labels},
                         {"features": X[:2], "labels": y[:2]})
        ]
        retry = await client.post("/v1/models/m/learn", json={"features": X, "labels": y},
                                  headers=key)
        info = (await client.get("/v1/models/m")).json()
        metrics = (await client.get("/metrics")).text
    assert first.status_code == 200
    assert [r.status_code for r in refused] == [422, 422, 422]
    assert all("other rows or labels" in r.json()["detail"] for r in refused)
    assert retry.status_code == 200 and retry.json() == {**first.json(), "duplicate": True}
    assert info["examples_seen"] == 3
    assert "gln_learn_duplicates_total 1.0" in metrics


async def test_a_used_key_with_other_data_is_refused_after_a_restart(
    store_settings: Settings, serve, small_config, create_model, make_data
):
    """The digest is kept with the key in the log (also across a trim), not only in memory."""
    X, y = make_data(4)
    key = {"Idempotency-Key": "k1"}
    app = create_app(store_settings)
    async with serve(app) as client:
        await create_model(client, "m", small_config)
        await client.post("/v1/models/m/learn", json={"features": X, "labels": y}, headers=key)
        await client.post("/v1/models/m/snapshot")  # trims the entry; the key stays
        skip_shutdown_snapshots(app)
    async with serve(create_app(store_settings)) as client:
        other = await client.post("/v1/models/m/learn",
                                  json={"features": X[::-1], "labels": y[::-1]}, headers=key)
        retry = await client.post("/v1/models/m/learn", json={"features": X, "labels": y},
                                  headers=key)
        info = (await client.get("/v1/models/m")).json()
    assert other.status_code == 422, other.text
    assert retry.status_code == 200 and retry.json()["duplicate"] is True
    assert info["examples_seen"] == 4


async def test_the_same_key_with_other_data_in_one_chunk_is_refused(
    settings: Settings, serve, small_config, create_model, make_data
):
    (X, y), (X2, y2) = make_data(2, seed=1), make_data(2, seed=2)
    async with serve(create_app(settings)) as client:
        await create_model(client, "m", small_config)
        answers = await asyncio.gather(*(
            client.post("/v1/models/m/learn", json={"features": rows, "labels": labels},
                        headers={"Idempotency-Key": "same"})
            for rows, labels in [(X, y), (X2, y2), (X, y), (X2, y2)]
        ))
        info = (await client.get("/v1/models/m")).json()
    codes = [a.status_code for a in answers]
    assert info["examples_seen"] == 2
    learned = [a.json() for a in answers if a.status_code == 200]
    assert sorted(b["duplicate"] for b in learned) == [False, True]
    assert sorted(codes) == [200, 200, 422, 422]
    assert codes[0] == codes[2] and codes[1] == codes[3]  # the two bodies, each in one piece


@pytest.mark.parametrize("key", ["", "has space", "x" * 201, "é".encode()])
async def test_a_malformed_idempotency_key_is_refused_before_learning(
    client, create_model, make_data, key
):
    await create_model(client, "m")
    X, y = make_data(1)
    r = await client.post("/v1/models/m/learn", json={"features": X, "labels": y},
                          headers={"Idempotency-Key": key})
    assert r.status_code == 422
    assert r.json()["detail"].startswith("the Idempotency-Key header: ")
    assert (await client.get("/v1/models/m")).json()["examples_seen"] == 0


async def test_an_entry_logged_behind_a_failed_append_is_applied_before_new_learning(
    settings: Settings, serve, small_config, create_model, make_data
):
    """An append can land although it raised (its answer lost): the model must not skip it.

    Staged by writing the entry to the log directly and marking the model in doubt, as the
    worker does after a failed append.
    """
    landed_X, landed_y = make_data(3, seed=1)
    X, y = make_data(2, seed=2)
    app = create_app(settings)
    async with serve(app) as client:
        await create_model(client, "m", small_config)
        entry = await app.state.engine.registry.get("m")
        entry.wal.append("m", np.asarray(landed_X, np.float32), np.asarray(landed_y),
                         ["lost-answer"], [3])
        entry.log.in_doubt = True
        r = await client.post("/v1/models/m/learn", json={"features": X, "labels": y})
        retry = await client.post(
            "/v1/models/m/learn", json={"features": landed_X, "labels": landed_y},
            headers={"Idempotency-Key": "lost-answer"},
        )
        crashed = await model_bytes(app, "m")
    assert r.json()["sequence"] == 3
    assert retry.json()["duplicate"] is True and retry.json()["sequence"] == 0
    assert crashed == learned_bytes(small_config, [(landed_X, landed_y), (X, y)])


async def test_delete_removes_the_log_and_a_new_model_of_the_name_starts_empty(
    store_settings: Settings, serve, small_config, create_model, make_data
):
    X, y = make_data(5)
    app = create_app(store_settings)
    async with serve(app) as client:
        await create_model(client, "m", small_config)
        await client.post("/v1/models/m/learn", json={"features": X, "labels": y})
        assert (await client.delete("/v1/models/m")).status_code == 204
        with _wal(store_settings) as wal:
            assert list(wal.read_after("m", None)) == []
        await create_model(client, "m", small_config)
        skip_shutdown_snapshots(app)
    async with serve(create_app(store_settings)) as client:
        assert (await client.get("/v1/models/m")).json()["examples_seen"] == 0


async def test_without_the_log_a_retried_key_is_still_recognised_while_in_memory(
    tmp_path, serve, small_config, create_model, make_data
):
    settings = Settings(snapshot_dir=str(tmp_path), snapshot_interval_s=3600, wal_enabled=False)
    X, y = make_data(2)
    body, key = {"features": X, "labels": y}, {"Idempotency-Key": "once"}
    async with serve(create_app(settings)) as client:
        await create_model(client, "m", small_config)
        first = (await client.post("/v1/models/m/learn", json=body, headers=key)).json()
        again = (await client.post("/v1/models/m/learn", json=body, headers=key)).json()
        info = (await client.get("/v1/models/m")).json()
    assert again == {**first, "duplicate": True}
    assert info["examples_seen"] == 2


async def test_without_the_log_learning_still_works_and_answers_no_log_id(
    tmp_path, serve, small_config, create_model, make_data
):
    settings = Settings(snapshot_dir=str(tmp_path), snapshot_interval_s=3600, wal_enabled=False)
    X, y = make_data(2)
    async with serve(create_app(settings)) as client:
        await create_model(client, "m", small_config)
        r = await client.post("/v1/models/m/learn", json={"features": X, "labels": y})
    assert r.status_code == 200 and r.json()["log_id"] is None
    assert not (tmp_path / "wal~").exists()  # no log was written


# -- limits ---------------------------------------------------------------------------------------
async def test_with_the_log_disabled_a_model_with_unapplied_entries_is_not_served(
    tmp_path, serve, small_config, create_model, make_data
):
    """GLN_WAL_ENABLED=false after a crash that left acknowledged learning in the log alone:
    serving the snapshot would lose it now, and replay it out of order once the log is on
    again. The model is not restored (readiness says why) until it is deleted, which drops
    its log too; a model whose log is applied is served as usual."""
    settings = Settings(snapshot_dir=str(tmp_path / "snaps"), snapshot_interval_s=3600)
    app = create_app(settings)
    async with serve(app) as client:
        await create_model(client, "m", small_config)
        await create_model(client, "applied", small_config)
        X, y = make_data(3)
        for name in ("m", "applied"):
            r = await client.post(f"/v1/models/{name}/learn", json={"features": X, "labels": y})
            assert r.status_code == 200
        assert (await client.post("/v1/models/applied/snapshot")).status_code == 200
        skip_shutdown_snapshots(app)  # a crash: m's learning is in its log alone

    without_log = settings.model_copy(update={"wal_enabled": False})
    async with serve(create_app(without_log)) as client:
        ready = await client.get("/readyz")
        refused = await client.get("/v1/models/m")
        applied = (await client.get("/v1/models/applied")).json()["examples_seen"]
        assert (await client.delete("/v1/models/m")).status_code == 204
        await create_model(client, "m", small_config)  # a new life, without the old log
    async with serve(create_app(settings)) as client:
        restored = (await client.get("/v1/models/m")).json()["examples_seen"]

    assert ready.status_code == 200 and ready.json()["status"] == "degraded"
    assert "'m'" in ready.json()["problems"][0]
    assert refused.status_code == 404
    assert "GLN_WAL_ENABLED=false ignores the log" in refused.json()["detail"]
    assert applied == 3
    assert restored == 0


async def test_a_model_born_in_the_log_comes_back_after_a_crash_and_a_deleted_one_does_not(
    tmp_path, serve, small_config, create_model, make_data
):
    """A create writes no snapshot with the file log, only the model's birth: a crash before
    any snapshot brings the model back from its birth and the learning logged after it, byte
    for byte; a model deleted before the crash stays deleted."""
    settings = Settings(snapshot_dir=str(tmp_path), snapshot_interval_s=3600)
    X, y = make_data(6)
    app = create_app(settings)
    async with serve(app) as client:
        for name in ("kept", "gone", "idle"):
            assert (await create_model(client, name, small_config))["snapshot"] is None
        for name in ("kept", "gone"):
            assert (await client.post(f"/v1/models/{name}/learn",
                                      json={"features": X, "labels": y})).status_code == 200
        assert (await client.delete("/v1/models/gone")).status_code == 204
        before = await model_bytes(app, "kept")
        skip_shutdown_snapshots(app)  # a crash: no snapshot was ever written
    assert not [p for p in tmp_path.iterdir() if p.name not in ("wal~", ".gln-service.lock")]
    restarted = create_app(settings)
    async with serve(restarted) as client:
        listed = [(m["name"], m["examples_seen"], m["snapshot"])
                  for m in (await client.get("/v1/models")).json()]
        after = await model_bytes(restarted, "kept")
    assert listed == [("idle", 0, None), ("kept", 6, None)]
    assert after == before


async def test_a_create_with_the_log_disabled_clears_a_log_left_by_an_earlier_life(
    tmp_path, serve, small_config, create_model, make_data
):
    """A crash between a delete's removal of the snapshots and of the log leaves the log alone;
    a create of the name with GLN_WAL_ENABLED=false clears it, so turning the log back on
    does not replay the earlier life's learning into the new model."""
    import shutil

    settings = Settings(snapshot_dir=str(tmp_path / "snaps"), wal_dir=str(tmp_path / "wal"),
                        snapshot_interval_s=3600)
    app = create_app(settings)
    async with serve(app) as client:
        await create_model(client, "m", small_config)
        X, y = make_data(5)
        # A snapshot trims the model's birth from the log; the learning after it stays there.
        for _ in range(2):
            r = await client.post("/v1/models/m/learn", json={"features": X, "labels": y})
            assert r.status_code == 200
            await client.post("/v1/models/m/snapshot")
        skip_shutdown_snapshots(app)
    shutil.rmtree(tmp_path / "snaps" / "m")  # the delete's first half, then the crash

    async with serve(create_app(settings.model_copy(update={"wal_enabled": False}))) as client:
        await create_model(client, "m", small_config)
    async with serve(create_app(settings)) as client:
        restored = (await client.get("/v1/models/m")).json()["examples_seen"]
    assert restored == 0


async def test_models_per_server_are_limited(tmp_path, serve, small_config, create_model):
    settings = Settings(snapshot_dir=str(tmp_path), snapshot_interval_s=3600, max_models=2)
    async with serve(create_app(settings)) as client:
        await create_model(client, "a", small_config)
        await create_model(client, "b", small_config)
        r = await client.post("/v1/models", json={"name": "c", "config": small_config})
        names = [m["name"] for m in (await client.get("/v1/models")).json()]
        # A config the server would refuse anyway says so first: no delete would help it.
        bad = await client.post("/v1/models",
                                json={"name": "c", "config": {**small_config, "pred_clip": 7}})
    assert r.status_code == 409 and "GLN_MAX_MODELS=2" in r.json()["detail"]
    assert bad.status_code == 422 and "pred_clip must be in" in bad.json()["detail"]
    assert names == ["a", "b"]
    assert not (tmp_path / "c").exists()


async def test_total_model_memory_is_limited(tmp_path, serve, small_config, create_model):
    one = GLN.estimate_nbytes(small_config)
    settings = Settings(snapshot_dir=str(tmp_path), snapshot_interval_s=3600,
                        max_total_model_bytes=2 * one + one // 2)
    async with serve(create_app(settings)) as client:
        await create_model(client, "a", small_config)
        await create_model(client, "b", small_config)
        r = await client.post("/v1/models", json={"name": "c", "config": small_config})
        assert r.status_code == 409 and "GLN_MAX_TOTAL_MODEL_BYTES" in r.json()["detail"]
        assert (await client.delete("/v1/models/a")).status_code == 204
        await create_model(client, "c", small_config)  # room again


# -- the log's Redis goes away ---------------------------------------------------------------------
async def test_learn_answers_503_while_the_log_is_down_and_loses_nothing_acknowledged(
    tmp_path, serve, small_config, create_model, make_data
):
    """A private Redis (AOF on) is shut down mid-stream: learn gets 503 and changes nothing;
    once Redis is back, retries with their keys are learned once, and a restart restores
    exactly the acknowledged examples."""
    from tests.support.redis_process import RedisProcess

    batches = [make_data(3, seed=s) for s in range(6)]
    answers = []
    with RedisProcess(tmp_path / "redis") as server:
        settings = Settings(redis_url=server.url, redis_key_prefix="t",
                            snapshot_interval_s=3600, snapshot_dir=str(tmp_path / "unused"))
        app = create_app(settings)
        async with serve(app) as client:
            await create_model(client, "m", small_config)

            async def learn(i):
                X, y = batches[i]
                return await client.post("/v1/models/m/learn", json={"features": X, "labels": y},
                                         headers={"Idempotency-Key": f"batch-{i}"})

            for i in range(3):
                answers.append((await learn(i)).json())
            server.stop()
            X, y = batches[3]
            unkeyed = await client.post("/v1/models/m/learn", json={"features": X, "labels": y})
            down = await learn(3)  # the model is in doubt now: it must catch up first, and can't
            seen_while_down = (await client.get("/v1/models/m")).json()["examples_seen"]
            server.start()
            for i in range(3, 6):
                answers.append((await learn(i)).json())
            again = await learn(4)
            metrics = (await client.get("/metrics")).text
            skip_shutdown_snapshots(app)
        restarted = create_app(settings)
        async with serve(restarted) as client:
            restored = (await client.get("/v1/models/m")).json()["examples_seen"]
            restored_bytes = await model_bytes(restarted, "m")

    assert down.status_code == 503 and "retry it with the same Idempotency-Key" in down.json()[
        "detail"]
    assert down.headers["retry-after"] == "1"  # when to try again, for clients that back off
    assert unkeyed.status_code == 503 and "did not confirm" in unkeyed.json()["detail"]
    assert seen_while_down == 9
    assert again.json()["duplicate"] is True and again.json()["sequence"] == 12
    assert [a["sequence"] for a in answers] == [0, 3, 6, 9, 12, 15]
    assert "gln_wal_append_errors_total 2.0" in metrics
    assert restored == 18
    assert restored_bytes == _learned_in_order(
        small_config, [(a, *batches[i]) for i, a in enumerate(answers)]
    )


# -- a replica: the primary's machine may be lost --------------------------------------------------
async def test_with_a_replica_required_an_acknowledged_learn_survives_the_primary(
    replicated, serve, small_config, create_model, make_data, tmp_path
):
    """GLN_WAL_REPLICAS=1: a learn is acknowledged once the replica holds its entry, so the
    primary's machine may be lost right after the answer: a server on the promoted replica
    restores every acknowledged example. While the replica is down, learn answers 503 (its
    entry is in the primary's log, and is learned only once the replica has it: the first
    learn after it comes back applies it first, as after any append in doubt). Without a
    replica, a server refuses to start."""
    from service.storage.wal import WalDurabilityError
    from tests.support.redis_process import wait_for_replica

    primary, replica = replicated
    batches = [make_data(4, seed=s) for s in range(4)]
    settings = Settings(redis_url=primary.url, redis_key_prefix="t", wal_replicas=1,
                        snapshot_interval_s=3600, snapshot_dir=str(tmp_path / "unused"))
    app = create_app(settings)
    statuses = []
    async with serve(app) as client:
        await create_model(client, "m", small_config)

        async def learn(i):
            X, y = batches[i]
            r = await client.post("/v1/models/m/learn", json={"features": X, "labels": y},
                                  headers={"Idempotency-Key": f"batch-{i}"})
            statuses.append(r.status_code)
            return r

        await learn(0)
        await learn(1)
        replica.kill()
        refused = await learn(2)
        short = (await client.get("/readyz")).json()
        # Its entry is in the primary's log alone: not learned until a replica holds it.
        await learn(2)
        assert (await client.get("/v1/models/m")).json()["examples_seen"] == 8
        replica.start()
        wait_for_replica(primary)
        await learn(3)  # applies batch 2 from the log first
        recovered = (await client.get("/readyz")).json()
        primary.kill()  # right after the answer: nothing more reaches the replica
        skip_shutdown_snapshots(app)
    promote = redis.Redis.from_url(replica.url)
    promote.replicaof("NO", "ONE")
    promote.close()
    promoted = create_app(settings.model_copy(update={"redis_url": replica.url,
                                                      "wal_replicas": 0}))
    async with serve(promoted) as client:
        restored = (await client.get("/v1/models/m")).json()["examples_seen"]
        restored_bytes = await model_bytes(promoted, "m")
        skip_shutdown_snapshots(promoted)
    with pytest.raises(WalDurabilityError, match="needs 1 replica"):
        async with serve(create_app(settings.model_copy(update={"redis_url": replica.url}))):
            pass

    assert statuses == [200, 200, 503, 503, 200]
    assert "reached 0 of the 1 replica" in refused.json()["detail"]
    assert short["status"] == "degraded"
    assert [p for p in short["problems"] if p.startswith("learn requests of 'm' are refused: ")
            and "reached 0 of the 1 replica" in p] != []
    assert recovered == {"status": "ready", "problems": []}
    assert restored == 16
    assert restored_bytes == learned_bytes(small_config, batches)


async def test_a_restore_waits_until_a_replica_holds_the_log_tail(
    replicated, serve, small_config, create_model, make_data, tmp_path, monkeypatch
):
    """GLN_WAL_REPLICAS=1: a restarted server replays the log after the snapshot only once a
    replica confirms it holds it (a failover could otherwise lose entries the restored model
    has learned, and its snapshots would keep them). Until then the restore retries and the
    server is not ready; once the replica answers, the model holds every example."""
    import service.engine.local

    primary, replica = replicated
    batches = [make_data(4, seed=s) for s in range(3)]
    settings = Settings(redis_url=primary.url, redis_key_prefix="t", wal_replicas=1,
                        snapshot_interval_s=3600, snapshot_dir=str(tmp_path / "unused"))
    app = create_app(settings)
    async with serve(app) as client:
        await create_model(client, "m", small_config)
        for X, y in batches:
            r = await client.post("/v1/models/m/learn", json={"features": X, "labels": y})
            assert r.status_code == 200, r.text
        skip_shutdown_snapshots(app)  # the restart replays all three entries from the log

    open_log = service.engine.local.open_log

    def open_log_then_pause_the_replica(settings: Settings, *args):
        wal = open_log(settings, *args)  # its start-up check passes: the replica answers
        replica.pause()
        return wal

    monkeypatch.setattr(service.engine.local, "open_log", open_log_then_pause_the_replica)
    restarted = create_app(settings)
    try:
        async with serve(restarted, wait_restored=False) as client:
            await asyncio.sleep(3.0)  # longer than a WAIT for the replica (2 s)
            unready = await client.get("/readyz")
            replica.resume()
            await asyncio.wait_for(restarted.state.engine.registry.wait_restored(), timeout=30)
            ready = await client.get("/readyz")
            examples_seen = (await client.get("/v1/models/m")).json()["examples_seen"]
            restored_bytes = await model_bytes(restarted, "m")
    finally:
        replica.resume()

    assert unready.status_code == 503, unready.text
    assert ready.status_code == 200, ready.text
    assert examples_seen == 12
    assert restored_bytes == learned_bytes(small_config, batches)


def _lose_log_tail(redis_url: str, prefix: str, name: str, lost: list[str], keys: list[str]):
    """What a failover to a replica that lacked the last entries leaves: the stream without
    the ``lost`` entries and their idempotency keys, ending where the replica's copy ended."""
    stream = f"{prefix}:wal:{name}"
    client = redis.Redis.from_url(redis_url)
    try:
        client.xdel(stream, *lost)
        client.delete(*(f"{stream}:key:{key}" for key in keys))
        (last_id, _), = client.xrevrange(stream, count=1)
        client.set(f"{stream}:last", last_id)
    finally:
        client.close()


@pytest.mark.parametrize("detected_by", ["append", "catch-up"])
async def test_a_model_ahead_of_its_log_is_rebuilt_and_a_lost_request_learned_once(
    detected_by, redis_url, redis_key_prefix, serve, small_config, create_model, make_data,
    tmp_path,
):
    """A failover can promote a replica that lacks the last entries the model learned (with
    ``GLN_WAL_REPLICAS=0``, or entries applied after a failed append). The next append sees
    the log end elsewhere (or the next catch-up sees it no longer reach the model's last
    entry): the request gets 503, and the model is rebuilt from its snapshot and the log.
    The lost request, retried with its key, is then learned once, not twice."""
    settings = Settings(redis_url=redis_url, redis_key_prefix=redis_key_prefix,
                        snapshot_interval_s=3600, snapshot_dir=str(tmp_path / "unused"))
    batches = {key: make_data(3, seed=s) for s, key in enumerate("abcd")}
    app = create_app(settings)
    async with serve(app) as client:
        await create_model(client, "m", small_config)

        async def learn(key):
            X, y = batches[key]
            return await client.post("/v1/models/m/learn", json={"features": X, "labels": y},
                                     headers={"Idempotency-Key": key})

        assert (await learn("a")).status_code == 200
        assert (await client.post("/v1/models/m/snapshot")).status_code == 200
        assert (await learn("b")).status_code == 200
        lost = (await learn("c")).json()["log_id"]
        _lose_log_tail(redis_url, redis_key_prefix, "m", [lost], ["c"])
        if detected_by == "catch-up":  # as after an append whose outcome is unknown
            (await app.state.engine.registry.get("m")).log.in_doubt = True
        refused = await learn("d")
        after_rebuild = (await client.get("/v1/models/m")).json()["examples_seen"]
        retried = await learn("c")
        assert (await learn("d")).status_code == 200
        rebuilt_bytes = await model_bytes(app, "m")
        metrics = (await client.get("/metrics")).text
        skip_shutdown_snapshots(app)

    if detected_by == "append":
        assert refused.status_code == 503 and "rebuilt from its snapshot" in refused.text
    else:  # caught up (rebuilt) first, then learned
        assert refused.status_code == 200
    assert after_rebuild == 6 + (3 if detected_by == "catch-up" else 0)
    assert retried.status_code == 200 and not retried.json().get("duplicate")
    order = "abcd" if detected_by == "append" else "abdc"
    assert rebuilt_bytes == learned_bytes(small_config, [batches[key] for key in order])
    assert "gln_wal_rebuilds_total 1.0" in metrics


@pytest.mark.parametrize("how", ["moved", "emptied"])
async def test_learning_acknowledged_on_a_log_behind_the_snapshot_survives_a_crash(
    serve, small_config, create_model, make_data, tmp_path, how: str
):
    """A clean stop snapshots and trims the log; the next start finds no log behind it (a new
    GLN_WAL_DIR, or the file removed). What that server acknowledges is logged after the
    snapshot's entry, so a crash and a restart replay it rather than skip it as learned."""
    first = Settings(snapshot_dir=str(tmp_path / "snapshots"), wal_dir=str(tmp_path / "wal-1"),
                     snapshot_interval_s=3600)
    batches = [make_data(6, seed=1), make_data(4, seed=2)]

    async def learn(client, batch):
        X, y = batch
        r = await client.post("/v1/models/m/learn", json={"features": X, "labels": y})
        assert r.status_code == 200, r.text

    async with serve(create_app(first)) as client:
        await create_model(client, "m", small_config)
        await learn(client, batches[0])
    if how == "moved":
        later = first.model_copy(update={"wal_dir": str(tmp_path / "wal-2")})
    else:
        later = first
        shutil.rmtree(tmp_path / "wal-1" / "wal~")  # the log of every model
    app = create_app(later)
    async with serve(app) as client:
        await learn(client, batches[1])
        skip_shutdown_snapshots(app)  # a crash: only the log holds the second batch
    restarted = create_app(later)
    async with serve(restarted) as client:
        examples_seen = (await client.get("/v1/models/m")).json()["examples_seen"]
        restored_bytes = await model_bytes(restarted, "m")

    assert examples_seen == 10
    assert restored_bytes == learned_bytes(small_config, batches)


async def test_a_unit_model_refuses_new_rows_outside_0_1_but_replays_logged_ones(
    settings: Settings, serve, create_model
):
    """Its clients' rows outside [0, 1] (which learning would clip) are refused with a 422,
    on learn, predict and explain alike; rows the log already holds (accepted by an earlier
    version, which clipped them) replay as they are after a crash, not fail the restore."""
    config = {"num_features": 3, "num_classes": 2, "layer_sizes": [8, 1],
              "input_scaling": "unit", "seed": 1}
    logged = np.array([[0.2, 255.0, 0.5], [0.9, 0.1, -3.0]], np.float32)
    app = create_app(settings)
    async with serve(app) as client:
        await create_model(client, "m", config)
        refused = [await client.post(f"/v1/models/m/{verb}", json=body) for verb, body in [
            ("learn", {"features": logged.tolist(), "labels": [0, 1]}),
            ("predict", {"features": logged.tolist()}),
            ("explain", {"features": logged.tolist()})]]
        entry = await app.state.engine.registry.get("m")
        entry.wal.append("m", logged, np.array([0, 1]))  # as an earlier version logged them
        skip_shutdown_snapshots(app)
    restarted = create_app(settings)
    async with serve(restarted) as client:
        examples_seen = (await client.get("/v1/models/m")).json()["examples_seen"]
        restored_bytes = await model_bytes(restarted, "m")

    assert [r.status_code for r in refused] == [422, 422, 422]
    assert all(r.json()["detail"] == "input_scaling='unit' takes features in [0, 1]: row 0, "
               "column 1 is 255.0 (scale them to [0, 1], or use input_scaling='standardize')"
               for r in refused)
    assert examples_seen == 2
    assert restored_bytes == learned_bytes(config, [(logged, [0, 1])])


async def test_a_durability_shortfall_is_reported_until_the_log_confirms_any_models_entry(
    settings: Settings, serve, small_config, create_model, make_data
):
    """Durability is the log's: once it confirms an entry of another model, the shortfall met
    by a model that has not learned since is no longer reported (staged on the file log)."""
    import time

    app = create_app(settings)
    async with serve(app) as client:
        for name in ("a", "b"):
            await create_model(client, name, small_config)
        entry = await app.state.engine.registry.get("a")
        entry.log.durability_shortfall = ("the replica did not answer", time.monotonic())
        short = (await client.get("/readyz")).json()
        X, y = make_data(2)
        r = await client.post("/v1/models/b/learn", json={"features": X, "labels": y})
        assert r.status_code == 200
        recovered = (await client.get("/readyz")).json()
    assert short == {"status": "degraded", "problems": [
        "learn requests of 'a' are refused: the replica did not answer"]}
    assert recovered == {"status": "ready", "problems": []}


async def test_a_redis_that_stops_fsyncing_gets_learns_refused_and_readyz_says_why(
    tmp_path, serve, small_config, create_model, make_data
):
    """GLN_WAL_DURABILITY=always on a Redis that runs 'appendfsync always', then 'CONFIG SET
    appendfsync everysec' under the running service: the next learn is refused (503, not
    acknowledged), /readyz names why, and once Redis fsyncs again learns are acknowledged."""
    from tests.support.redis_process import RedisProcess

    with RedisProcess(tmp_path / "redis", appendfsync="always") as server:
        settings = Settings(redis_url=server.url, redis_key_prefix="t", wal_durability="always",
                            snapshot_dir=str(tmp_path / "unused"), snapshot_interval_s=3600)
        admin = redis.Redis.from_url(server.url)
        async with serve(create_app(settings)) as client:
            await create_model(client, "m", small_config)
            X, y = make_data(2)
            body = {"features": X, "labels": y}
            assert (await client.post("/v1/models/m/learn", json=body)).status_code == 200
            admin.config_set("appendfsync", "everysec")
            refused = await client.post("/v1/models/m/learn", json=body)
            degraded = (await client.get("/readyz")).json()
            admin.config_set("appendfsync", "always")
            again = await client.post("/v1/models/m/learn", json=body)
            ready = (await client.get("/readyz")).json()
        admin.close()
    assert refused.status_code == 503 and "not fsynced" in refused.json()["detail"]
    assert degraded["status"] == "degraded" and "not fsynced" in degraded["problems"][0]
    assert again.status_code == 200 and ready == {"status": "ready", "problems": []}


@pytest.mark.parametrize("damage", ["middle entry", "last entry", "whole stream"])
async def test_a_log_that_lost_acknowledged_entries_is_not_restored_smaller(
    redis_url, redis_key_prefix, tmp_path, serve, small_config, create_model, make_data, damage
):
    """Entries removed from a model's Redis stream behind its back (XDEL, DEL): the restart
    shows the model unrestored with the reason (/readyz, its 404) instead of serving it with
    fewer examples and handing out their sequence numbers again; nothing else is served."""
    settings = Settings(redis_url=redis_url, redis_key_prefix=redis_key_prefix,
                        snapshot_dir=str(tmp_path / "unused"), snapshot_interval_s=3600)
    app = create_app(settings)
    async with serve(app) as client:
        await create_model(client, "m", small_config)
        await create_model(client, "other", small_config)
        # Snapshots first: the models' births leave the log, and what follows is learning.
        for name in ("m", "other"):
            await client.post(f"/v1/models/{name}/snapshot")
        for seed in range(3):
            X, y = make_data(4, seed=seed)
            for name in ("m", "other"):
                r = await client.post(f"/v1/models/{name}/learn",
                                      json={"features": X, "labels": y})
                assert r.status_code == 200
        skip_shutdown_snapshots(app)  # the examples are in the log alone
    admin = redis.Redis.from_url(redis_url)
    stream = f"{redis_key_prefix}:wal:m"
    ids = [entry_id for entry_id, _ in admin.xrange(stream)]
    if damage == "whole stream":
        admin.delete(stream)
    else:
        admin.xdel(stream, ids[1] if damage == "middle entry" else ids[-1])
    admin.close()
    restarted = create_app(settings)
    async with serve(restarted) as client:
        readiness = (await client.get("/readyz")).json()
        info = await client.get("/v1/models/m")
        other = (await client.get("/v1/models/other")).json()
    assert readiness["status"] == "degraded" and "'m'" in readiness["problems"][0]
    assert info.status_code == 404
    assert "lost entries" in info.text or "entries were removed" in info.text
    assert other["examples_seen"] == 12  # the undamaged model is served whole
