"""The UCI single-pass benchmark end to end at a tiny size: what it prints and writes."""

import json

import numpy as np
import pytest

from benchmarks.paper import uci

METHODS = ["gln", "gln_default", "river_logistic", "sgd_one_pass", "svm"]


def test_a_tiny_run_writes_a_results_row_per_data_set_and_method(tmp_path, capsys):
    results = tmp_path / "paper_uci.json"
    results.write_text('[\n{"command": "earlier", "machine": "m", "commit": "c", '
                       '"figures": {"dataset": "iris", "method": "svm"}}\n]\n')
    out = uci.main(["--splits", "2", "--datasets", "iris,wine", "--methods", ",".join(METHODS),
                    "--results", str(results)])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == out
    assert out["splits"] == 2 and out["gln_setting"]["layer_sizes"] == [32, 1]
    assert [(r["dataset"], r["method"]) for r in out["rows"]] == [
        (d, m) for d in ("iris", "wine") for m in METHODS]
    for row in out["rows"]:
        assert 0.0 <= row["test_accuracy"] <= 1.0 and row["test_accuracy_stderr"] >= 0.0
        assert row["splits"] == 2 and row["seconds_per_split"] >= 0.0
        online = row["method"] != "svm"
        assert (row["prequential_accuracy"] is not None) == online
    runs = json.loads(results.read_text())
    assert runs[0]["command"] == "earlier" and len(runs) == 1 + len(out["rows"])
    assert [run["figures"] for run in runs[1:]] == out["rows"]
    assert all(set(run) == {"command", "machine", "commit", "figures"} for run in runs)
    assert runs[1]["command"].startswith("python benchmarks/paper/uci.py --splits 2")


def test_the_library_defaults_are_the_benchmarks_setting():
    """``gln`` (the setting chosen on training rows) and ``gln_default`` are the same model."""
    X, y = uci.load("iris")
    train, test = uci.split(len(y), 0)
    chosen = uci.METHODS["gln"](X[train], y[train], X[test], 3, 0)
    default = uci.METHODS["gln_default"](X[train], y[train], X[test], 3, 0)
    assert all(np.array_equal(a, b) for a, b in zip(chosen, default, strict=True))


def test_the_data_sets_ship_with_the_packages():
    shapes = {name: uci.load(name)[0].shape for name in uci.DATASETS}
    assert shapes == {"iris": (150, 4), "wine": (178, 13), "breast_cancer": (569, 30),
                      "digits": (1797, 64), "image_segments": (2310, 18),
                      "phishing": (1250, 9), "bananas": (5300, 2)}


def test_splits_are_disjoint_80_20_and_seeded():
    train, test = uci.split(150, 3)
    assert len(train) == 120 and len(test) == 30
    assert sorted([*train, *test]) == list(range(150))
    assert np.array_equal(uci.split(150, 3)[0], train)
    assert not np.array_equal(uci.split(150, 4)[0], train)


def test_the_figure_is_drawn(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [{"dataset": d, "method": m, "splits": 2, "test_accuracy": 0.9,
             "test_accuracy_stderr": 0.01} for d in ("iris", "wine") for m in ("gln", "svm")]
    uci.draw(rows, tmp_path / "uci.png")
    assert (tmp_path / "uci.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

