"""The concurrent models benchmark end to end: every thread count, every round, a rate each."""

import json

from benchmarks import concurrent_models


def test_it_prints_a_rate_for_each_thread_count_and_round(capsys):
    results = concurrent_models.main(["--threads", "1", "3", "--calls", "20", "--rounds", "2",
                                      "--features", "4", "--layer-sizes", "4,1"])
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert printed == results
    assert [(r["round"], r["threads"]) for r in results] == [(0, 1), (0, 3), (1, 1), (1, 3)]
    assert all(r["learns_per_s"] > 0 for r in results)
    assert results[0]["config"] == {"num_features": 4, "num_classes": 2, "layer_sizes": [4, 1]}
