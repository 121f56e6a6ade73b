"""The GPU stage benchmark runs end to end on the emulated device, so that a GPU session does
not find it broken, and its stage wrappers leave the model's results as they were."""

import json

import numpy as np
import pytest

import gln.staging
from benchmarks.gpu_stages import STAGES, main, staged, with_device_idle
from gln import GLN
from tests.gln.emulated_cupy import GXX, emulated_cupy_installed

pytestmark = pytest.mark.skipif(GXX is None, reason="the emulated device needs g++ on PATH")


def test_every_stage_of_learn_and_predict_is_timed_and_results_are_unchanged(monkeypatch):
    rng = np.random.default_rng(0)
    X, y = rng.uniform(0, 1, (30, 5)), rng.integers(0, 3, 30)
    config = dict(num_features=5, num_classes=3, layer_sizes=(4, 1), seed=0)
    with emulated_cupy_installed() as cp:
        plain, wrapped = GLN(**config, device="cuda"), GLN(**config, device="cuda")
        totals = dict.fromkeys(STAGES, 0.0)
        staged(wrapped, cp, totals)
        np.testing.assert_array_equal(wrapped.learn(X, y), plain.learn(X, y))
        np.testing.assert_array_equal(wrapped.predict_proba(X), plain.predict_proba(X))
        monkeypatch.setattr(gln.staging, "PREDICT_CHUNK_ROWS_GPU", 8)  # the copy stream's way
        monkeypatch.setattr(gln.staging, "HOST_WIDENED_ROWS", 4)
        X32 = X.astype(np.float32)
        np.testing.assert_array_equal(wrapped.predict_proba(X32), plain.predict_proba(X32))
    assert all(seconds > 0 for seconds in totals.values()), totals


def test_the_script_runs_end_to_end_on_the_emulated_device(capsys, small_network):
    with emulated_cupy_installed():
        main(["--calls", "2", "--rows", "1,3", "--profile-calls", "2"])
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    stages = {(r["verb"], r["rows"]): r for r in records if r["measure"] == "stages"}
    assert set(stages) == {(verb, rows) for verb in ("learn", "predict") for rows in (1, 3)}
    assert all(set(r["stage_us"]) == set(STAGES) for r in stages.values())
    costs = {r["operation"] for r in records if r["measure"] == "host_cost"}
    assert {"launch", "copy_in_6kb", "copy_out_40b", "gating_product_1_row"} <= costs
    timelines = {r["verb"]: r for r in records if r["measure"] == "call_timeline"}
    assert set(timelines) == {"learn", "predict", "predict_staged_ahead"}
    for timeline in timelines.values():
        stages = timeline["stages"]
        names = [s["stage"] for s in stages]  # a one-chunk call copies its outputs directly
        assert names in (["_sent", "_scale", "_contexts", "_network_pass"],
                         ["_sent", "_scale", "_contexts", "_network_pass", "_fetched"])
        entered = [s["host_entered_us"] for s in stages]
        assert entered == sorted(entered) and entered[0] >= 0
        assert all(s["host_entered_us"] <= s["host_left_us"] <= timeline["call_us"]
                   for s in stages)
        assert all(s["device_done_us"] >= 0 for s in stages)
        idle = [s["device_idle_before_us"] for s in stages]
        assert min(idle) >= 0 and timeline["device_idle_us"] == pytest.approx(sum(idle))
    profiles = {r["verb"]: r for r in records if r["measure"] == "host_profile"}
    assert set(profiles) == {"predict", "learn"}
    for profile in profiles.values():
        assert (profile["rows"], profile["calls"]) == (3, 2)
        own = [f["own_us"] for f in profile["functions"]]
        assert own and own == sorted(own, reverse=True)  # the most time of their own first
        assert all(f["cumulative_us"] >= f["own_us"] >= 0 for f in profile["functions"])
    parts = next(r for r in records if r["measure"] == "long_call_parts")
    assert parts["rows"] == 3 and 0 <= parts["margins_rechecked"] <= 1
    assert parts["learned_before"] == 3 and parts["nonzero_inputs"] > 0.5  # not a new model's
    assert set(parts["device_us"]) == {
        "gemm", "rounding_bounds", "contexts_rechecking_in_place", "contexts_listing",
        "rechecks_of_the_list", "layer_contexts"}
    assert all(us > 0 for us in [*parts["device_us"].values(), *parts["host_us"].values()])
    assert {"check_input_uint8", "to_pinned_uint8", "copy_in_from_pinned_uint8"} <= set(
        parts["host_us"])
    staging = next(r for r in records if r["measure"] == "staging_bandwidth")
    assert (staging["rows"], staging["features"]) == (3, 784)  # the longest call's rows
    assert set(staging["gb_per_s"]) == {
        "same_chunk_to_pinned", "to_pinned", "to_pageable", "to_pinned_in_4_threads",
        "to_pinned_beside_launches", "pageable_to_device"}
    assert all(rate > 0 for rate in staging["gb_per_s"].values())


def test_the_device_is_idle_before_a_stage_only_where_it_finished_before_the_host_came():
    stages = [  # microseconds from the call's start
        {"stage": "_sent", "host_entered_us": 5.0, "host_left_us": 700.0, "device_done_us": 750},
        {"stage": "_scale", "host_entered_us": 700.0, "host_left_us": 720.0,
         "device_done_us": 800.0},  # the device still copying when the host came: not idle
        {"stage": "_contexts", "host_entered_us": 900.0, "host_left_us": 990.0,
         "device_done_us": 2000.0},  # done at 800, the host came at 900: 100 idle
    ]
    idle = [s["device_idle_before_us"] for s in with_device_idle(stages)]
    assert idle == [5.0, 0.0, 100.0]
