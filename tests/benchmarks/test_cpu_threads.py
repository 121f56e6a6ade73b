"""The CPU threads benchmark end to end on a small model: every mode learns the same bytes."""

import json

import gln.kernels.cpu_gating as cpu_gating
from benchmarks import cpu_threads


def test_every_mode_learns_the_same_bytes_and_the_peers_are_undone(capsys):
    rows_rule = cpu_gating.INT16_MAX_ROWS
    results = cpu_threads.main(["--features", "12", "--classes", "3", "--layer-sizes", "8,1",
                                "--call-sizes", "1,3,5", "--calls", "10",
                                "--predict-rows", "64", "--rounds", "2"])
    printed = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert printed == results
    assert [r["mode"] for r in results] == ["default", "float32_split", "threaded_blas"]
    for result in results:
        assert set(result["ms_per_learn_call"]) == {"1", "3", "5"}
        assert all(ms > 0 for ms in result["ms_per_learn_call"].values())
        assert result["predict_rows_per_second"] > 0
        assert result["same_bytes_as_default"] is True
    assert cpu_gating.INT16_MAX_ROWS == rows_rule
