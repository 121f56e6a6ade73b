"""benchmarks/paper/permuted_mnist.py at a tiny size on generated digits: what it writes."""

import importlib.util
import json

import pytest

from benchmarks.paper import permuted_mnist
from benchmarks.paper.common import torch_or_none


def _run(tmp_path, models, tasks=3, train=200, seeds=2, extra=()):
    results, figure = tmp_path / "runs.json", tmp_path / "permuted.png"
    argv = ["--synthetic", "--tasks", str(tasks), "--train-per-task", str(train),
            "--test-per-task", "100", "--seeds", str(seeds), "--models", models,
            "--results", str(results), "--machine", "test", *extra]
    if importlib.util.find_spec("matplotlib") is not None:
        argv += ["--figure", str(figure)]
    return permuted_mnist.main(argv), results, figure


def test_the_gln_runs_give_an_accuracy_triangle_a_row_each(tmp_path):
    figures, results, _ = _run(tmp_path, "gln", seeds=1)
    rows = json.loads(results.read_text())
    assert [r["figures"] for r in rows] == figures and len(rows) == 1
    assert {r["machine"] for r in rows} == {"test"}
    assert rows[0]["command"] == ("python benchmarks/paper/permuted_mnist.py --synthetic --tasks 3"
                                  " --train-per-task 200 --test-per-task 100 --seeds 1"
                                  " --models gln")
    for run in figures:
        assert run["model"] == "gln (unit_fixed)" and run["train_per_task"] == 200
        assert [len(row) for row in run["accuracy"]] == [1, 2, 3]
        assert run["task1_after_task1"] == run["accuracy"][0][0]
        assert run["task1_after_last"] == run["accuracy"][-1][0]
        # generated digits are easy: each task is learned well above chance (0.1)
        assert min(row[-1] for row in run["accuracy"]) > 0.5


def test_the_tasks_are_permutations_the_first_the_original():
    orders = permuted_mnist.permutations(3, seed=0)
    assert list(orders[0]) == list(range(784))
    assert all(sorted(order) == list(range(784)) for order in orders)
    assert list(orders[1]) != list(orders[2])


def test_the_peers_run_and_the_figure_is_drawn(tmp_path):
    if torch_or_none() is None:
        pytest.skip("PyTorch (the paper extra) is not installed")
    pytest.importorskip("matplotlib")
    figures, _, figure = _run(tmp_path, "mlp,ewc", tasks=2, train=100, seeds=1,
                              extra=["--ewc-samples", "10"])
    assert [f["model"] for f in figures] == ["mlp", "ewc"]
    assert all([len(row) for row in f["accuracy"]] == [1, 2] for f in figures)
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_validation_scores_held_out_training_images_and_names_the_context(tmp_path):
    figures, results, _ = _run(tmp_path, "gln", tasks=2, seeds=1,
                               extra=["--validation", "--context-dim", "4"])
    run = figures[0]
    assert run["model"] == "gln (unit_fixed, context 4)" and run["scored_on"] == "validation"
    assert json.loads(results.read_text())[0]["figures"] == run
    with pytest.raises(SystemExit, match="--validation needs"):
        permuted_mnist.main(["--synthetic", "--tasks", "2", "--train-per-task", "2000",
                             "--test-per-task", "100", "--seeds", "1", "--models", "gln",
                             "--validation"])


def test_a_figure_draws_runs_scored_on_the_same_images_only(tmp_path):
    size = {"tasks": 2, "train_per_task": 200, "test_per_task": 100}
    test_run = {"model": "gln (unit_fixed)", **size}
    validation_run = {**test_run, "scored_on": "validation"}
    results = tmp_path / "runs.json"
    results.write_text(json.dumps([{"figures": test_run}, {"figures": validation_run}]))
    assert permuted_mnist.same_size([validation_run], results) == [validation_run]
    assert permuted_mnist.same_size([test_run], results) == [test_run]
