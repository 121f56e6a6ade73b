"""The family benchmark at a tiny setting: every side's rate, and the family's members equal to
the separate models that learned the same rows."""

import json

import pytest

from benchmarks import family_learn
from tests.gln.emulated_cupy import GXX, emulated_cupy_installed


def test_the_family_and_the_separate_models_learn_the_same_stream(capsys):
    result = family_learn.main(["--models", "7", "--features", "3", "--layer-sizes", "5,1",
                                "--chunk", "8", "--rounds", "2", "--round-rows", "40",
                                "--check", "7"])
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(result))
    assert result["members_equal"] is True and result["examples"] == 80
    assert min(result[f"{side}_examples_per_second"]
               for side in ("family", "family_one_thread", "models")) > 0


@pytest.mark.skipif(GXX is None, reason="the emulated device needs g++ on PATH")
def test_the_gpu_run_learns_the_same_stream_on_the_emulated_device(capsys):
    """What a GPU session runs (``--device cuda``), end to end on the emulated device, so
    that it does not find the script broken: the family's members equal the separate GPU
    models, and the CPU's one-thread run is left out."""
    with emulated_cupy_installed():
        result = family_learn.main(["--models", "5", "--features", "3", "--layer-sizes", "4,1",
                                    "--chunk", "8", "--rounds", "1", "--round-rows", "24",
                                    "--check", "5", "--device", "cuda"])
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(result))
    assert result["members_equal"] is True and result["device"] == "cuda"
    assert "family_one_thread_examples_per_second" not in result
    assert result["family_examples_per_second"] > 0
