"""The explain benchmark end to end on a small model."""

import json

import pytest

from benchmarks import explain_speed


def test_it_times_every_call_size_and_prints_what_it_returns(capsys):
    result = explain_speed.main(["--features", "12", "--classes", "3", "--layer-sizes", "8,4,1",
                                 "--rows", "1,5", "--runs", "2"])
    assert json.loads(capsys.readouterr().out) == result
    assert set(result["ms_per_call"]) == set(result["ms_per_row"]) == {"1", "5"}
    assert all(ms > 0 for ms in result["ms_per_call"].values())
    assert result["ms_per_row"]["5"] == pytest.approx(result["ms_per_call"]["5"] / 5, abs=1e-3)
