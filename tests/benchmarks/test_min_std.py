"""The min_std benchmark end to end, and the floor's effect it exists to show."""

import json

from benchmarks import min_std


def test_a_floor_above_a_features_spread_hides_it_and_the_default_does_not(capsys):
    result = min_std.main(["--floors", "1e-3,1e-9", "--seeds", "1"])
    assert json.loads(capsys.readouterr().out) == result
    losses = result["log_loss"]
    assert set(losses) == {"breast_cancer", "wine", "digits_800", "classification_50",
                           "spread_1e-4"}
    hidden, seen = losses["spread_1e-4"]["0.001"], losses["spread_1e-4"]["1e-09"]
    assert hidden > 0.6 > 0.4 > seen  # 1e-3 leaves only noise; 1e-9 learns the feature
    for name in ("breast_cancer", "wine", "digits_800", "classification_50"):
        assert abs(losses[name]["0.001"] - losses[name]["1e-09"]) < 0.01
