"""benchmarks/paper/capacity.py at a tiny size on generated digits: what it writes."""

import json

import pytest

from benchmarks.paper import capacity
from benchmarks.paper.common import torch_or_none


def test_gln_runs_write_a_curve_a_row_each(tmp_path):
    results = tmp_path / "runs.json"
    figures = capacity.main(["--synthetic", "--examples", "200", "--passes", "2", "--depths",
                             "1", "--context-dims", "1,2", "--no-mlp", "--results",
                             str(results), "--machine", "test"])
    rows = json.loads(results.read_text())
    assert [r["figures"] for r in rows] == figures
    assert [(f["dataset"], f["context_dim"]) for f in figures] == [
        ("shuffled MNIST", 1), ("shuffled MNIST", 2), ("uniform noise", 1), ("uniform noise", 2)]
    for run in figures:
        assert [point[0] for point in run["curve"]] == [200, 400]
        assert run["final_train_accuracy"] == run["curve"][-1][1]
        assert 0.0 <= run["final_train_accuracy"] <= 1.0
        assert run["weights"] == capacity.gln_weights(1, run["context_dim"])


def test_the_mlp_has_as_many_weights_as_the_gln_it_is_set_beside():
    weights = capacity.gln_weights(2, 4)
    width = capacity.mlp_width(weights)
    mlp_weights = 785 * width + (width + 1) * width + (width + 1) * 10
    assert abs(mlp_weights - weights) / weights < 1e-3


def test_the_mlp_runs_and_the_figure_is_drawn(tmp_path):
    if torch_or_none() is None:
        pytest.skip("PyTorch (the paper extra) is not installed")
    pytest.importorskip("matplotlib")
    figure = tmp_path / "capacity.png"
    figures = capacity.main(["--synthetic", "--examples", "100", "--passes", "2", "--depths",
                             "1", "--context-dims", "1", "--figure", str(figure)])
    assert [f["model"] for f in figures if f["dataset"] == "uniform noise"][-1].startswith("MLP")
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
