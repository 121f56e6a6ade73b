"""Delayed labels: predict rows with ids now, learn them when their labels arrive later."""

from __future__ import annotations

import asyncio
import math
import re
import time

import numpy as np
import pytest

from gln import GLN
from service.api.app import create_app
from service.engine.waiting_rows import WaitingRows
from service.settings import Settings
from tests.service.staged_crash import model_bytes, skip_shutdown_snapshots


def _metric(text: str, name: str, model: str = "m") -> float:
    found = re.search(rf'^{name}{{model="{model}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


async def test_labels_learn_the_predicted_rows_and_score_the_prediction_made_then(
    app, client, small_config, create_model, make_data
):
    await create_model(client, "m", small_config)
    X, y = make_data(4, seed=1)
    ids = [f"txn-{i}" for i in range(4)]
    made = (await client.post("/v1/models/m/predict", json={"features": X, "ids": ids})).json()
    # The model moves on before the labels come.
    other_X, other_y = make_data(30, seed=2)
    await client.post("/v1/models/m/learn", json={"features": other_X, "labels": other_y})
    before = (await client.get("/v1/models/m")).json()["metrics"]["total"]

    r = await client.post("/v1/models/m/labels", json={"ids": ids[::-1], "labels": y[::-1]})
    assert r.status_code == 200, r.text
    body = r.json()
    after = (await client.get("/v1/models/m")).json()
    metrics = (await client.get("/metrics")).text

    assert body["learned"] == 4 and body["sequence"] == 30 and body["log_id"] is not None
    assert [res["status"] for res in body["results"]] == [200] * 4
    assert after["examples_seen"] == 34
    # Scored by the prediction made at predict time, not by the moved-on model.
    expected = sum(-math.log(made["probabilities"][i][y[i]]) for i in range(4))
    total = after["metrics"]["total"]
    gained = total["log_loss"] * total["examples"] - before["log_loss"] * before["examples"]
    assert gained == pytest.approx(expected, rel=1e-9)
    assert _metric(metrics, "gln_delayed_labels_learned_total") == 4
    assert _metric(metrics, "gln_delayed_labels_pending") == 0
    # Learned in the order the labels came, after the other rows.
    reference = GLN(**small_config)
    reference.learn(np.asarray(other_X, np.float32), np.asarray(other_y))
    reference.learn(np.asarray(X[::-1], np.float32), np.asarray(y[::-1]))
    entry = await app.state.engine.registry.get("m")
    assert entry.model.to_bytes() == reference.to_bytes()


async def test_unknown_and_already_learned_ids_get_404_entries(client, create_model, make_data):
    await create_model(client, "m")
    X, y = make_data(2)
    await client.post("/v1/models/m/predict", json={"features": X, "ids": ["a", "b"]})
    r = await client.post("/v1/models/m/labels", json={"ids": ["a", "zz"], "labels": [y[0], 0]})
    again = await client.post("/v1/models/m/labels", json={"ids": ["a"], "labels": [y[0]]})
    assert r.status_code == again.status_code == 200
    assert [(x["id"], x["status"]) for x in r.json()["results"]] == [("a", 200), ("zz", 404)]
    assert "unknown id" in r.json()["results"][1]["detail"]
    assert again.json() == {"learned": 0, "sequence": None, "log_id": None, "results": [
        {"id": "a", "status": 404, "detail": r.json()["results"][1]["detail"]}]}
    assert (await client.get("/v1/models/m")).json()["examples_seen"] == 1


@pytest.mark.parametrize("body, message", [
    ({"features": [[0.0] * 6] * 2, "ids": ["a"]}, "1 ids for 2 feature rows"),
    ({"features": [[0.0] * 6] * 2, "ids": ["a", "a"]}, "appears twice"),
    ({"features": [[0.0] * 6], "ids": ["has space"]}, "ids"),
])
async def test_bad_ids_on_predict_are_refused_and_nothing_waits(app, client, create_model,
                                                                body, message):
    await create_model(client, "m")
    r = await client.post("/v1/models/m/predict", json=body)
    assert r.status_code == 422 and message in r.json()["detail"]
    entry = await app.state.engine.registry.get("m")
    assert len(entry.waiting_rows) == 0


async def test_bad_labels_leave_the_rows_waiting(client, create_model, make_data):
    await create_model(client, "m")
    X, y = make_data(2)
    await client.post("/v1/models/m/predict", json={"features": X, "ids": ["a", "b"]})
    out_of_range = await client.post("/v1/models/m/labels",
                                     json={"ids": ["a", "b"], "labels": [0, 3]})
    too_few = await client.post("/v1/models/m/labels", json={"ids": ["a", "b"], "labels": [0]})
    assert out_of_range.status_code == too_few.status_code == 422
    assert "labels" in out_of_range.json()["detail"]
    fixed = await client.post("/v1/models/m/labels", json={"ids": ["a", "b"], "labels": y})
    assert fixed.json()["learned"] == 2


async def test_every_label_is_checked_and_named_by_its_place_in_the_request(
    client, create_model, make_data
):
    """A bad label is refused even where its id no longer waits (else a client's bug would
    pass unseen), and the error names its index in the request, not among the waiting rows."""
    await create_model(client, "m")
    X, y = make_data(1)
    await client.post("/v1/models/m/predict", json={"features": X, "ids": ["a"]})
    for labels, index in (([9, y[0]], 0), ([y[0], 9], 1)):
        r = await client.post("/v1/models/m/labels", json={"ids": ["zz", "a"], "labels": labels})
        assert r.status_code == 422
        assert f"labels[{index}] is 9" in r.json()["detail"]
    assert (await client.get("/v1/models/m")).json()["examples_seen"] == 0
    r = await client.post("/v1/models/m/labels", json={"ids": ["zz", "a"], "labels": [0, y[0]]})
    assert r.json()["learned"] == 1


async def test_rows_whose_label_does_not_come_in_time_expire(
    tmp_path, serve, create_model, make_data
):
    settings = Settings(snapshot_dir=str(tmp_path), snapshot_interval_s=3600, label_ttl_s=0.2)
    X, y = make_data(3)
    async with serve(create_app(settings)) as client:
        await create_model(client, "m")
        await client.post("/v1/models/m/predict", json={"features": X, "ids": ["a", "b", "c"]})
        await asyncio.sleep(0.5)  # the expiry task runs every ttl / 2
        metrics = (await client.get("/metrics")).text
        r = await client.post("/v1/models/m/labels", json={"ids": ["a"], "labels": [y[0]]})
        info = (await client.get("/v1/models/m")).json()
    assert _metric(metrics, "gln_delayed_labels_expired_total") == 3
    assert _metric(metrics, "gln_delayed_labels_pending") == 0
    assert r.json()["results"][0]["status"] == 404
    assert info["examples_seen"] == 0


async def test_expired_rows_learn_the_default_label_when_one_is_set(
    tmp_path, serve, small_config, create_model, make_data
):
    settings = Settings(snapshot_dir=str(tmp_path), snapshot_interval_s=3600, label_ttl_s=0.2,
                        label_default=2)
    X, _ = make_data(3)
    app = create_app(settings)
    async with serve(app) as client:
        await create_model(client, "m", small_config)
        await client.post("/v1/models/m/predict", json={"features": X, "ids": ["a", "b", "c"]})
        for _ in range(50):
            await asyncio.sleep(0.05)
            info = (await client.get("/v1/models/m")).json()
            if info["examples_seen"] == 3:
                break
        learned = (await app.state.engine.registry.get("m")).model.to_bytes()
    reference = GLN(**small_config)
    reference.learn(np.asarray(X, np.float32), np.array([2, 2, 2]))
    assert info["examples_seen"] == 3
    assert learned == reference.to_bytes()


async def test_a_default_label_that_is_no_class_of_the_model_drops_its_rows(
    tmp_path, serve, small_config, create_model, make_data
):
    """GLN_LABEL_DEFAULT is server-wide; a model with fewer classes drops its rows instead of
    failing to learn them again and again."""
    settings = Settings(snapshot_dir=str(tmp_path), snapshot_interval_s=3600, label_ttl_s=0.2,
                        label_default=small_config["num_classes"])
    X, _ = make_data(2)
    async with serve(create_app(settings)) as client:
        await create_model(client, "m", small_config)
        await client.post("/v1/models/m/predict", json={"features": X, "ids": ["a", "b"]})
        for _ in range(50):
            await asyncio.sleep(0.05)
            info = (await client.get("/v1/models/m")).json()
            if info["waiting_for_labels"] == 0:
                break
        metrics = (await client.get("/metrics")).text
    assert info["waiting_for_labels"] == 0 and info["examples_seen"] == 0
    assert _metric(metrics, "gln_delayed_labels_expired_total") == 2


async def test_the_oldest_rows_make_room_when_too_many_wait(
    tmp_path, serve, create_model, make_data
):
    settings = Settings(snapshot_dir=str(tmp_path), snapshot_interval_s=3600,
                        max_pending_label_rows=2)
    X, y = make_data(3)
    async with serve(create_app(settings)) as client:
        await create_model(client, "m")
        for i in range(3):
            await client.post("/v1/models/m/predict", json={"features": [X[i]], "ids": [str(i)]})
        r = await client.post("/v1/models/m/labels", json={"ids": ["0", "1", "2"], "labels": y})
        metrics = (await client.get("/metrics")).text
    assert [x["status"] for x in r.json()["results"]] == [404, 200, 200]
    assert _metric(metrics, "gln_delayed_labels_expired_total") == 1


# -- waiting rows count in the server's memory budget ----------------------------------------------


def _budget_for_two_models_and_one_waiting(small_config: dict, max_rows: int) -> int:
    one = GLN.estimate_nbytes(small_config)
    waiting = WaitingRows(1.0, max_rows).capacity_nbytes(
        small_config["num_features"], small_config["num_classes"])
    return 2 * one + waiting + waiting // 2


async def test_rows_wait_for_labels_only_where_the_memory_budget_has_room_for_them(
    tmp_path, serve, small_config, create_model, make_data
):
    settings = Settings(
        snapshot_dir=str(tmp_path), snapshot_interval_s=3600, max_pending_label_rows=100,
        max_total_model_bytes=_budget_for_two_models_and_one_waiting(small_config, 100))
    X, _ = make_data(1)
    async with serve(create_app(settings)) as client:
        await create_model(client, "a", small_config)
        await create_model(client, "b", small_config)
        first = await client.post("/v1/models/a/predict", json={"features": X, "ids": ["1"]})
        refused = await client.post("/v1/models/b/predict", json={"features": X, "ids": ["1"]})
        b_waiting = (await client.get("/v1/models/b")).json()["waiting_for_labels"]
        plain = await client.post("/v1/models/b/predict", json={"features": X})
        again = await client.post("/v1/models/a/predict", json={"features": X, "ids": ["2"]})
        assert (await client.delete("/v1/models/a")).status_code == 204
        after_delete = await client.post("/v1/models/b/predict",
                                         json={"features": X, "ids": ["1"]})
    assert first.status_code == 200 and again.status_code == 200
    assert refused.status_code == 409
    assert "GLN_MAX_PENDING_LABEL_ROWS=100" in refused.json()["detail"]
    assert "GLN_MAX_TOTAL_MODEL_BYTES" in refused.json()["detail"]
    assert b_waiting == 0 and plain.status_code == 200
    assert after_delete.status_code == 200


async def test_restored_waiting_rows_keep_their_room_in_the_memory_budget(
    tmp_path, serve, small_config, create_model, make_data
):
    settings = Settings(
        snapshot_dir=str(tmp_path), snapshot_interval_s=3600, max_pending_label_rows=100,
        max_total_model_bytes=_budget_for_two_models_and_one_waiting(small_config, 100))
    X, _ = make_data(1)
    async with serve(create_app(settings)) as client:
        await create_model(client, "a", small_config)
        await create_model(client, "b", small_config)
        await client.post("/v1/models/a/predict", json={"features": X, "ids": ["1"]})
    async with serve(create_app(settings)) as client:
        refused = await client.post("/v1/models/b/predict", json={"features": X, "ids": ["1"]})
        waited = await client.post("/v1/models/a/predict", json={"features": X, "ids": ["2"]})
    assert refused.status_code == 409 and waited.status_code == 200


# -- waiting rows survive restarts and crashes --------------------------------------------------


def _loss_total(info: dict) -> float:
    total = info["metrics"]["total"]
    return 0.0 if total["examples"] == 0 else total["log_loss"] * total["examples"]


async def test_waiting_rows_survive_a_crash_whether_snapshotted_or_only_logged(
    store_settings, serve, small_config, create_model, make_data
):
    """Rows put to wait before the snapshot come back from it, later ones from the log; a row
    learned before the crash (its learn entry names it) stays learned, once."""
    other_X, other_y = make_data(10, seed=1)
    X, y = make_data(5, seed=2)
    ids = ["a", "b", "c", "d", "e"]
    app = create_app(store_settings)
    async with serve(app) as client:
        await create_model(client, "m", small_config)
        await client.post("/v1/models/m/learn", json={"features": other_X, "labels": other_y})
        first = await client.post("/v1/models/m/predict", json={"features": X[:3], "ids": ids[:3]})
        assert (await client.post("/v1/models/m/snapshot")).status_code == 200
        second = await client.post("/v1/models/m/predict", json={"features": X[3:], "ids": ids[3:]})
        learned_b = await client.post("/v1/models/m/labels", json={"ids": ["b"], "labels": [y[1]]})
        assert learned_b.json()["learned"] == 1
        skip_shutdown_snapshots(app)
    made = first.json()["probabilities"] + second.json()["probabilities"]

    restarted = create_app(store_settings)
    async with serve(restarted) as client:
        metrics = (await client.get("/metrics")).text
        before = (await client.get("/v1/models/m")).json()
        order = [4, 0, 1, 2, 3]  # e, a, b (learned already), c, d
        r = await client.post("/v1/models/m/labels", json={
            "ids": [ids[i] for i in order], "labels": [y[i] for i in order]})
        after = (await client.get("/v1/models/m")).json()
        restored = await model_bytes(restarted, "m")

    assert _metric(metrics, "gln_delayed_labels_pending") == 4
    assert before["examples_seen"] == 11 and before["waiting_for_labels"] == 4
    assert [(res["id"], res["status"]) for res in r.json()["results"]] == [
        ("e", 200), ("a", 200), ("b", 404), ("c", 200), ("d", 200)]
    assert r.json()["learned"] == 4 and after["examples_seen"] == 15
    assert after["waiting_for_labels"] == 0
    # Scored by the predictions made before the crash.
    expected = sum(-math.log(made[i][y[i]]) for i in [4, 0, 2, 3])
    assert _loss_total(after) - _loss_total(before) == pytest.approx(expected, rel=1e-9)
    reference = GLN(**small_config)
    reference.learn(np.asarray(other_X, np.float32), np.asarray(other_y))
    for i in [1, 4, 0, 2, 3]:
        reference.learn(np.asarray(X[i:i + 1], np.float32), np.asarray(y[i:i + 1]))
    assert restored == reference.to_bytes()


async def test_waiting_rows_survive_a_restart_without_the_log(
    tmp_path, serve, small_config, create_model, make_data
):
    """Without a log the shutdown snapshot carries them (a prediction with ids changes the
    model's state, so the shutdown saves it)."""
    settings = Settings(snapshot_dir=str(tmp_path), snapshot_interval_s=3600, wal_enabled=False)
    X, y = make_data(2)
    async with serve(create_app(settings)) as client:
        await create_model(client, "m", small_config)
        await client.post("/v1/models/m/snapshot")
        await client.post("/v1/models/m/predict", json={"features": X, "ids": ["a", "b"]})
    async with serve(create_app(settings)) as client:
        r = await client.post("/v1/models/m/labels", json={"ids": ["b", "a"], "labels": y[::-1]})
    assert r.json()["learned"] == 2


async def test_rows_learned_with_the_default_label_are_not_learned_again_after_a_crash(
    store_settings, serve, small_config, create_model, make_data
):
    settings = store_settings.model_copy(update={"label_ttl_s": 0.2, "label_default": 1})
    X, _ = make_data(2)
    app = create_app(settings)
    async with serve(app) as client:
        await create_model(client, "m", small_config)
        await client.post("/v1/models/m/predict", json={"features": X, "ids": ["a", "b"]})
        for _ in range(50):
            await asyncio.sleep(0.05)
            if (await client.get("/v1/models/m")).json()["examples_seen"] == 2:
                break
        skip_shutdown_snapshots(app)
    async with serve(create_app(settings)) as client:
        await asyncio.sleep(0.3)  # an expiry round after the restart
        info = (await client.get("/v1/models/m")).json()
        metrics = (await client.get("/metrics")).text
    assert info["examples_seen"] == 2
    assert _metric(metrics, "gln_delayed_labels_pending") == 0
    assert _metric(metrics, "gln_delayed_labels_expired_total") == 0


async def test_rows_pushed_out_by_newer_ones_stay_out_after_a_crash(
    store_settings, serve, create_model, make_data
):
    """The wait entry that pushed a row out names it, so a replay does not bring it back."""
    settings = store_settings.model_copy(update={"max_pending_label_rows": 2})
    X, y = make_data(3)
    app = create_app(settings)
    async with serve(app) as client:
        await create_model(client, "m")
        for i in range(3):
            await client.post("/v1/models/m/predict", json={"features": [X[i]], "ids": [str(i)]})
        skip_shutdown_snapshots(app)
    async with serve(create_app(settings)) as client:
        waiting = (await client.get("/v1/models/m")).json()["waiting_for_labels"]
        r = await client.post("/v1/models/m/labels", json={"ids": ["0", "1", "2"], "labels": y})
    assert waiting == 2
    assert [x["status"] for x in r.json()["results"]] == [404, 200, 200]


async def test_rows_whose_wait_ended_stay_dropped_and_counted_once_after_a_crash(
    store_settings, serve, create_model, make_data
):
    settings = store_settings.model_copy(update={"label_ttl_s": 0.2})
    X, _ = make_data(2)
    app = create_app(settings)
    async with serve(app) as client:
        await create_model(client, "m")
        await client.post("/v1/models/m/predict", json={"features": X, "ids": ["a", "b"]})
        for _ in range(50):
            await asyncio.sleep(0.05)
            if (await client.get("/v1/models/m")).json()["waiting_for_labels"] == 0:
                break
        expired_before = _metric((await client.get("/metrics")).text,
                                 "gln_delayed_labels_expired_total")
        skip_shutdown_snapshots(app)
    async with serve(create_app(settings)) as client:
        waiting = (await client.get("/v1/models/m")).json()["waiting_for_labels"]
        await asyncio.sleep(0.3)  # an expiry round after the restart
        metrics = (await client.get("/metrics")).text
    assert expired_before == 2
    assert waiting == 0
    assert _metric(metrics, "gln_delayed_labels_expired_total") == 0


async def test_rows_that_cannot_be_dropped_stay_due_and_go_once_the_log_is_back(
    tmp_path, serve, create_model, make_data, monkeypatch
):
    settings = Settings(snapshot_dir=str(tmp_path), snapshot_interval_s=3600, label_ttl_s=0.2)
    X, _ = make_data(1)
    app = create_app(settings)
    async with serve(app) as client:
        await create_model(client, "m")
        await client.post("/v1/models/m/predict", json={"features": X, "ids": ["a"]})
        entry = await app.state.engine.registry.get("m")
        working = entry.wal.append_waiting

        def log_down(*args, **kwargs):
            raise ConnectionError("log down")

        monkeypatch.setattr(entry.wal, "append_waiting", log_down)
        await asyncio.sleep(0.5)
        while_down = (await client.get("/v1/models/m")).json()["waiting_for_labels"]
        predicted = await client.post("/v1/models/m/predict", json={"features": X})
        monkeypatch.setattr(entry.wal, "append_waiting", working)
        for _ in range(50):
            await asyncio.sleep(0.05)
            if (await client.get("/v1/models/m")).json()["waiting_for_labels"] == 0:
                break
        metrics = (await client.get("/metrics")).text
    assert while_down == 1 and predicted.status_code == 200
    assert _metric(metrics, "gln_delayed_labels_expired_total") == 1
    assert _metric(metrics, "gln_delayed_labels_pending") == 0


async def test_two_label_requests_for_one_row_at_once_learn_it_once(
    client, create_model, make_data
):
    await create_model(client, "m")
    X, y = make_data(1)
    await client.post("/v1/models/m/predict", json={"features": X, "ids": ["a"]})
    body = {"ids": ["a"], "labels": y}
    answers = await asyncio.gather(*(client.post("/v1/models/m/labels", json=body)
                                     for _ in range(3)))
    statuses = sorted(a.json()["results"][0]["status"] for a in answers)
    assert statuses == [200, 404, 404]
    assert (await client.get("/v1/models/m")).json()["examples_seen"] == 1


async def test_a_prediction_whose_rows_cannot_be_logged_is_refused_and_nothing_waits(
    app, client, create_model, make_data, monkeypatch
):
    await create_model(client, "m")
    entry = await app.state.engine.registry.get("m")
    X, _ = make_data(2)

    def log_down(*args, **kwargs):
        raise ConnectionError("log down")

    monkeypatch.setattr(entry.wal, "append_waiting", log_down)
    refused = await client.post("/v1/models/m/predict", json={"features": X, "ids": ["a", "b"]})
    plain = await client.post("/v1/models/m/predict", json={"features": X})
    assert refused.status_code == 503 and "with the same ids" in refused.json()["detail"]
    assert plain.status_code == 200
    assert len(entry.waiting_rows) == 0


async def test_a_wait_entry_logged_behind_a_failed_append_is_applied_before_new_learning(
    app, client, create_model, make_data
):
    """Its append raised but it landed: the model catches up and the rows wait after all."""
    await create_model(client, "m")
    entry = await app.state.engine.registry.get("m")
    X, y = make_data(3)
    entry.wal.append_waiting("m", ["a"], np.asarray(X[:1], np.float32), np.full((1, 3), 1 / 3),
                             time.time() + 60)
    entry.log.in_doubt = True
    learned = await client.post("/v1/models/m/learn", json={"features": X[1:], "labels": y[1:]})
    labelled = await client.post("/v1/models/m/labels", json={"ids": ["a"], "labels": y[:1]})
    assert learned.json()["sequence"] == 0
    assert labelled.json()["learned"] == 1 and labelled.json()["sequence"] == 2
