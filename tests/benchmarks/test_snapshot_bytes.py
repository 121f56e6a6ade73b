"""The snapshot bytes benchmark end to end on a small model, on the CPU and on the emulated
device (so that a GPU session does not find it broken)."""

import json

import pytest

from benchmarks import snapshot_bytes
from tests.gln.emulated_cupy import GXX, emulated_cupy_installed

SMALL = ["--features", "12", "--classes", "3", "--layer-sizes", "8,1", "--runs", "3"]


def check(result: dict, printed: str) -> None:
    assert json.loads(printed) == result
    assert result["snapshot_bytes"] > 3 * 8 * 16 * 13 * 4  # at least the first layer's weights
    for way in ("to_bytes", "from_bytes", "buffer", "capture", "seal"):
        assert 0 < result[way]["min_ms"] <= result[way]["median_ms"]


def test_it_times_both_ways_and_prints_what_it_returns(capsys):
    result = snapshot_bytes.main(SMALL)
    check(result, capsys.readouterr().out)
    assert result["device"] == "cpu"


@pytest.mark.skipif(GXX is None, reason="the emulated device needs g++ on PATH")
def test_it_runs_on_the_emulated_device(capsys):
    with emulated_cupy_installed():
        result = snapshot_bytes.main([*SMALL, "--device", "cuda"])
    check(result, capsys.readouterr().out)
    assert result["device"] == "cuda"
