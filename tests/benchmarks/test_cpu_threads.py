"""The CPU threads benchmark end to end on a small model: both modes learn the same bytes."""

import json

import gln.kernels.cpu as cpu_kernels
from benchmarks import cpu_threads


def test_both_modes_learn_the_same_bytes_and_the_peer_is_undone(capsys):
    rows_rule = cpu_kernels.PARALLEL_MIN_ROWS
    results = cpu_threads.main(["--features", "12", "--classes", "3", "--layer-sizes", "8,1",
                                "--call-sizes", "1,3,5", "--calls", "10",
                                "--predict-rows", "64", "--rounds", "2"])
    printed = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert printed == results
    assert [r["mode"] for r in results] == ["own_threads", "threaded_blas"]
    for result in results:
        assert set(result["ms_per_learn_call"]) == {"1", "3", "5"}
        assert all(ms > 0 for ms in result["ms_per_learn_call"].values())
        assert result["predict_rows_per_second"] > 0
        assert result["same_bytes_as_own_threads"] is True
    assert cpu_kernels.PARALLEL_MIN_ROWS == rows_rule
