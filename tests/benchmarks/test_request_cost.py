"""The request cost benchmark end to end: a few requests of each verb, with and without the log."""

import json

import pytest

from benchmarks import request_cost


@pytest.mark.parametrize("log", [[], ["--no-wal"]])
def test_it_times_both_verbs_and_the_model_alone_and_prints_what_it_returns(capsys, log):
    result = request_cost.main(["--features", "3", "--layer-sizes", "4,1", "--requests", "5",
                                "--warmup", "2", *log])
    assert json.loads(capsys.readouterr().out) == result
    assert result["wal"] == (not log)
    for part in ("service", "model_call"):
        assert set(result[part]) == {"learn", "predict"}
        for timing in result[part].values():
            assert 0 < timing["median_us"] <= timing["p90_us"]
    assert all(timing["cpu_us"] > 0 for timing in result["service"].values())


def test_the_breakdown_times_every_level_and_its_centres_add_up_to_the_request(capsys):
    result = request_cost.main(["--features", "3", "--layer-sizes", "4,1", "--requests", "3",
                                "--warmup", "2", "--verbs", "learn", "--breakdown", "--no-wal",
                                "--skip-model-call"])
    assert json.loads(capsys.readouterr().out) == result
    learn = result["breakdown"]["learn"]
    assert list(learn["levels_us"]) == ["none", *request_cost.LEVELS]
    assert [c["where"] for c in learn["centres"]] == [*request_cost.LEVELS.values(),
                                                       request_cost.HARNESS]
    total = sum(c["us"] for c in learn["centres"])
    assert total == pytest.approx(learn["levels_us"]["none"], abs=0.1 * len(learn["centres"]))
