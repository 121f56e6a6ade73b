"""The shared prediction kernel's grid of settings: only combinations the kernel accepts, and
the whole script on the emulated device, so that a GPU session does not find it broken."""

import json

import pytest

import gln.kernels.cuda as cuda
from benchmarks import gpu_learn
from benchmarks.gpu_shared_grid import main, settings
from tests.gln.emulated_cupy import GXX, emulated_cupy_installed


def test_a_batch_holds_whole_groups_and_one_sum_at_a_time_takes_none():
    grid = settings([1, 2, 8], [16, 32], [1, 2, 4])
    assert sorted(grid) == sorted([
        (1, 16, 1), (1, 32, 1),  # a batch of 1: no groups
        (2, 16, 1), (2, 16, 2), (2, 32, 1), (2, 32, 2),  # 2 holds no group of 4
        (8, 16, 1), (8, 16, 2), (8, 16, 4), (8, 32, 1), (8, 32, 2), (8, 32, 4)])
    assert len(set(grid)) == len(grid)
    assert settings([4], [16], [8]) == []  # no whole group of 8 in a batch of 4


@pytest.mark.skipif(GXX is None, reason="the emulated device needs g++ on PATH")
def test_every_layer_setting_and_turn_is_timed_once_on_the_emulated_device(
        capsys, monkeypatch, shared_launch_defines):
    """A small network (every layer 2 elements a lane: the example groups are its kernels'),
    at the smallest sizes (timings meaningless)."""
    monkeypatch.setitem(gpu_learn.NETWORK, "num_features", 40)
    monkeypatch.setitem(gpu_learn.NETWORK, "layer_sizes", (8, 8, 1))
    monkeypatch.setattr(cuda, "PREDICT_SHARED_MIN_ROWS", 1)
    defines = shared_launch_defines
    before = (cuda.PREDICT_SUM_BATCH, cuda.PREDICT_WARPS, cuda.PREDICT_EXAMPLE_GROUP)
    with emulated_cupy_installed():
        main(["--rows", "24", "--turns", "2", "--repeats", "1", "--sum-batches", "1,8",
              "--warps", "16,32", "--groups", "1,4"])
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    grid = settings([1, 8], [16, 32], [1, 4])
    layers = [name for name, *_ in gpu_learn.layer_shapes(gpu_learn.NETWORK)]
    timed = [(r["layer"], (r["sum_batch"], r["warps"], r["example_group"]), r["turn"])
             for r in records]
    assert sorted(timed) == sorted((layer, setting, turn) for layer in layers
                                   for setting in grid for turn in range(2))
    assert all(r["measure"] == "shared_grid" and r["rows"] == 24 and r["microseconds"] > 0
               and r["device"] == "emulated (CPU)" for r in records)
    inputs = {name: width for name, _, _, width, _ in gpu_learn.layer_shapes(gpu_learn.NETWORK)}
    assert all(r["inputs"] == inputs[r["layer"]] for r in records)  # with the bias
    # Each setting reached the kernel (2 a lane: the warps leave these layers' kernels alone),
    # and the library's values came back afterwards.
    assert defines == {(f"-DGLN_SUM_BATCH={batch}",
                        *((f"-DGLN_EXAMPLE_GROUP={group}",) if batch > 1 else ()))
                       for batch, _, group in grid}
    assert (cuda.PREDICT_SUM_BATCH, cuda.PREDICT_WARPS, cuda.PREDICT_EXAMPLE_GROUP) == before
