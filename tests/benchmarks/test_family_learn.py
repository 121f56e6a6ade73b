"""The family benchmark at a tiny setting: every side's rate, and the family's members equal to
the separate models that learned the same rows."""

import json

from benchmarks import family_learn


def test_the_family_and_the_separate_models_learn_the_same_stream(capsys):
    result = family_learn.main(["--models", "7", "--features", "3", "--layer-sizes", "5,1",
                                "--chunk", "8", "--rounds", "2", "--round-rows", "40",
                                "--check", "7"])
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(result))
    assert result["members_equal"] is True and result["examples"] == 80
    assert min(result[f"{side}_examples_per_second"]
               for side in ("family", "family_one_thread", "models")) > 0
