"""The snapshot bytes benchmark end to end on a small model."""

import json

from benchmarks import snapshot_bytes


def test_it_times_both_ways_and_prints_what_it_returns(capsys):
    result = snapshot_bytes.main(["--features", "12", "--classes", "3", "--layer-sizes", "8,1",
                                  "--runs", "3"])
    assert json.loads(capsys.readouterr().out) == result
    assert result["snapshot_bytes"] > 3 * 8 * 16 * 13 * 4  # at least the first layer's weights
    for way in ("to_bytes", "from_bytes"):
        assert 0 < result[way]["min_ms"] <= result[way]["median_ms"]
