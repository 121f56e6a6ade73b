"""/metrics: the names of docs/interfaces.md, with values that match what the API answered."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gln import GLN
from service.api.app import create_app
from service.metrics import package_version
from service.settings import Settings


async def scrape(client: httpx.AsyncClient) -> dict[tuple[str, frozenset], float]:
    """Every sample of /metrics as {(sample name, labels): value}."""
    r = await client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def series_with(samples: dict, **labels: str) -> list[str]:
    wanted = set(labels.items())
    return sorted(name for name, lbls in samples if wanted <= set(lbls))


async def test_model_metrics_match_the_learn_answers(
    client: httpx.AsyncClient, create_model, make_data
):
    await create_model(client, "m")
    bytes_at_start = value(await scrape(client), "gln_model_bytes", model="m")
    X, y = make_data(50)
    loss_sum, correct = 0.0, 0
    for start in range(0, 50, 10):
        body = (
            await client.post(
                "/v1/models/m/learn",
                json={"features": X[start : start + 10], "labels": y[start : start + 10]},
            )
        ).json()
        p = np.array(body["probabilities"])
        loss_sum += body["log_loss"] * body["examples"]
        correct += int((p.argmax(axis=1) == np.array(y[start : start + 10])).sum())
    await client.post("/v1/models/m/predict", json={"features": X[:7]})
    snap = (await client.post("/v1/models/m/snapshot")).json()
    info = (await client.get("/v1/models/m")).json()

    s = await scrape(client)
    assert value(s, "gln_examples_learned_total", model="m") == 50
    assert value(s, "gln_prequential_log_loss_nats_total", model="m") == pytest.approx(loss_sum)
    assert value(s, "gln_prequential_correct_total", model="m") == correct
    assert value(s, "gln_examples_predicted_total", model="m") == 7
    assert value(s, "gln_models_loaded") == 1
    # The model was warmed up when it was created: it held its 16-bit copy of the normals
    # from the start, and holds what its config's estimate says.
    assert value(s, "gln_model_bytes", model="m") == info["nbytes"] == bytes_at_start
    assert info["nbytes"] == GLN.estimate_nbytes(info["config"])
    assert value(s, "gln_snapshot_bytes", model="m") == snap["nbytes"]
    assert value(s, "gln_snapshot_last_success_timestamp_seconds", model="m") == pytest.approx(
        snap["created_at"]
    )
    assert value(s, "gln_snapshot_duration_seconds_count") == 1  # on demand (born in the log)
    assert value(s, "gln_build_info", version=package_version(), device="cpu") == 1


async def test_http_metrics_use_route_templates(settings, serve, create_model, make_data):
    app = create_app(settings.model_copy(update={"max_body_bytes": 2000}))
    async with serve(app) as client:
        await create_model(client, "m")
        X, y = make_data(3)
        for path in ("/v1/models/m/learn", "/v1/models/m/learn", "/v1/models/m/learn/"):
            await client.post(path, json={"features": X, "labels": y})
        await client.post("/v1/models/m/learn", json={"features": X, "labels": [9, 9, 9]})
        await client.post("/v1/models/zzz/learn", json={"features": X, "labels": y})
        big, big_y = make_data(60)
        await client.post("/v1/models/m/learn", json={"features": big, "labels": big_y})
        await client.get("/no/such/path")
        for made_up in ("BREW", "X-1", "X-2"):
            await client.request(made_up, "/v1/models")

        s = await scrape(client)
    learn = "/v1/models/{name}/learn"
    total = "gln_http_requests_total"
    assert value(s, total, route=learn, method="POST", status="200") == 3
    assert value(s, total, route=learn, method="POST", status="422") == 1
    assert value(s, total, route=learn, method="POST", status="404") == 1
    assert value(s, total, route=learn, method="POST", status="413") == 1
    assert value(s, total, route="/v1/models", method="POST", status="201") == 1
    assert value(s, total, route="unmatched", method="GET", status="404") == 1
    # Timed by status class: a quick refusal does not pass for fast service.
    duration = "gln_http_request_duration_seconds_count"
    assert value(s, duration, route=learn, method="POST", status_class="2xx") == 3
    assert value(s, duration, route=learn, method="POST", status_class="4xx") == 3
    assert value(s, duration, route="unmatched", method="GET", status_class="4xx") == 1
    # Made-up methods share one label value (an HTTP parser may pass any token through).
    assert value(s, total, route="/v1/models", method="other", status="405") == 3
    # No concrete path ever becomes a label value.
    assert not [lbls for _, lbls in s if ("route", "/v1/models/m/learn") in lbls]
    assert not [lbls for _, lbls in s if ("route", "/v1/models/m/learn/") in lbls]
    buckets = sorted(
        float(dict(lbls)["le"])
        for name, lbls in s
        if name == "gln_http_request_duration_seconds_bucket"
        and {("route", learn), ("status_class", "2xx")} <= lbls
    )
    assert buckets[0] == 0.0001 and buckets[-2] == 30.0
    if Path("/proc/self/stat").exists():  # the process collector reads /proc
        assert b"process_resident_memory_bytes" in app.state.metrics.render()


async def test_delete_removes_the_model_series(client: httpx.AsyncClient, create_model, make_data):
    await create_model(client, "gone")
    await create_model(client, "kept")
    X, y = make_data(2)
    for name in ("gone", "kept"):
        await client.post(f"/v1/models/{name}/learn", json={"features": X, "labels": y})
        await client.post(f"/v1/models/{name}/predict", json={"features": X})
    s = await scrape(client)
    assert len(series_with(s, model="gone")) == len(series_with(s, model="kept")) > 0
    await client.delete("/v1/models/gone")
    s = await scrape(client)
    assert series_with(s, model="gone") == []
    assert value(s, "gln_examples_learned_total", model="kept") == 2
    assert value(s, "gln_models_loaded") == 1


async def test_each_app_has_its_own_registry(settings, tmp_path, serve, create_model):
    other = settings.model_copy(update={"snapshot_dir": str(tmp_path / "other")})
    async with serve(create_app(settings)) as a, serve(create_app(other)) as b:
        await create_model(a, "only-in-a")
        sa, sb = await scrape(a), await scrape(b)
    assert value(sa, "gln_models_loaded") == 1
    assert value(sb, "gln_models_loaded") == 0
    assert series_with(sb, model="only-in-a") == []



async def test_a_deleted_model_is_freed_without_waiting_for_the_garbage_collector(
    settings, serve, create_model, make_data
):
    """The service freezes and rarely runs full collections, so a deleted model's memory must
    not wait for one: nothing (the metrics' bytes callback included) may keep it in a cycle."""
    app = create_app(settings)
    async with serve(app) as client:
        await create_model(client, "gone")
        X, y = make_data(3)
        await client.post("/v1/models/gone/learn", json={"features": X, "labels": y})
        assert value(await scrape(client), "gln_model_bytes", model="gone") > 0
        model = weakref.ref((await app.state.engine.registry.get("gone")).model)
        gc.collect()
        gc.disable()
        try:
            assert (await client.delete("/v1/models/gone")).status_code == 204
            # A worker thread lets go of the last call it ran a moment after the loop has
            # its result (concurrent.futures drops its work item only then): wait for that,
            # with the collector still off, so that only a cycle can keep the model alive.
            deadline = time.monotonic() + 5
            while model() is not None and time.monotonic() < deadline:
                await asyncio.sleep(0.001)
            assert model() is None
        finally:
            gc.enable()


async def test_gln_device_auto_is_reported_as_the_device_it_resolved_to(tmp_path, serve,
                                                                          create_model):
    """GLN_DEVICE=auto on a machine without a GPU: the model's info, gln_build_info and the
    start-up line say "cpu", where the models run, not "auto"."""
    settings = Settings(snapshot_dir=str(tmp_path / "s"), device="auto")
    async with serve(create_app(settings)) as client:
        info = await create_model(client, "m")
        page = (await client.get("/metrics")).text
    assert info["config"]["device"] == "cpu"
    assert 'device="cpu"' in page and 'device="auto"' not in page
    assert "device auto (cpu);" in settings.summary("cpu")


async def test_models_past_the_limit_are_summed_under_others_and_no_created_series(
    settings, serve, create_model, make_data
):
    """GLN_METRICS_MODELS bounds the per-model series: the first models created have their
    own, the rest are summed under model="(others)", whose counters keep what a deleted one
    counted; their snapshot time is the oldest of theirs (the stale-snapshot alert's)."""
    app = create_app(settings.model_copy(update={"metrics_models": 2}))
    X, y = make_data(4)
    async with serve(app) as client:
        for name in ("a", "b", "c", "d"):
            await create_model(client, name)
        for rows, name in ((1, "a"), (2, "b"), (3, "c"), (4, "d")):
            await client.post(f"/v1/models/{name}/learn",
                              json={"features": X[:rows], "labels": y[:rows]})
        for name in ("c", "d"):
            await client.post(f"/v1/models/{name}/snapshot")
        infos = {m["name"]: m for m in (await client.get("/v1/models")).json()}
        s = await scrape(client)
        assert (await client.delete("/v1/models/c")).status_code == 204
        after_delete = await scrape(client)
        assert (await client.delete("/v1/models/a")).status_code == 204
        await create_model(client, "e")  # takes the series a freed
        after_a = await scrape(client)
    learned = "gln_examples_learned_total"
    assert [value(s, learned, model=m) for m in ("a", "b", "(others)")] == [1, 2, 7]
    assert series_with(s, model="c") == series_with(s, model="d") == []
    assert value(s, "gln_model_bytes", model="(others)") == infos["c"]["nbytes"] + infos[
        "d"]["nbytes"]
    assert value(s, "gln_snapshot_last_success_timestamp_seconds", model="(others)") == min(
        infos[m]["snapshot"]["created_at"] for m in ("c", "d"))
    assert value(after_delete, learned, model="(others)") == 7  # a counter never goes down
    assert value(after_a, learned, model="e") == 0
    assert not [name for name, _ in s if name.endswith("_created")]
