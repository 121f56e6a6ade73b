"""The service load benchmark at a tiny size against a server it starts with two HTTP workers:
every binary scenario (.npz learn and predict, the stream) runs and is answered without error."""

import json

import pytest

from benchmarks import service_load

pytestmark = pytest.mark.slow


def test_the_binary_scenarios_run_against_workers(capsys, monkeypatch):
    monkeypatch.setattr(service_load, "BINARY", (("learn", 50), ("predict", 64), ("stream", 50)))
    service_load.main(["--only", "small-learn-50-npz", "small-predict-64-npz",
                       "small-stream-50-npz", "--workers", "2", "--duration", "0.5",
                       "--warmup", "0.2", "--connections", "2"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["scenario"] for row in rows] == [
        "small-learn-50-npz", "small-predict-64-npz", "small-stream-50-npz"]
    for row in rows:
        assert row["workers"] == 2 and row["errors"] == 0 and row["requests"] > 0
        assert row["examples_per_s"] == pytest.approx(row["requests_per_s"] * row["batch"])
