"""The profiling script runs on the emulated device, so that a GPU session does not find it
broken: one profiled range, around a prediction whose outputs are the model's."""

import hashlib
import json

import numpy as np
import pytest

from benchmarks.gpu_profile import main
from gln import GLN
from tests.gln.emulated_cupy import GXX, emulated_cupy_installed

pytestmark = pytest.mark.skipif(GXX is None, reason="the emulated device needs g++ on PATH")


def digest(outputs) -> str:
    return hashlib.sha256(np.asarray(outputs).tobytes()).hexdigest()[:16]


def test_a_prediction_and_two_learning_calls_are_profiled_with_the_models_outputs(
        capsys, monkeypatch, small_network):
    monkeypatch.delenv("GLN_DATA_DIR", raising=False)  # random rows, whoever runs the tests
    with emulated_cupy_installed() as cp:
        main(["--rows", "3", "--learn-rows", "9"])  # not replayed: launches
        assert (cp.operations["profiler start"], cp.operations["profiler stop"]) == (3, 3)
        assert cp.operations["kernel gln_layer_pass_rows"] == 3  # the last call's three layers
        records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        rng = np.random.default_rng(0)  # gpu_learn.load_data's random rows
        X = rng.uniform(0, 1, (27, 784)).astype(np.float32)
        y = rng.integers(0, 10, 27)
        model = GLN(**small_network, device="cuda")  # the script's network
        model.learn(X[:9], y[:9])
        predicted = model.predict_proba(X[:3])
        learned = model.learn(X[9:18], y[9:18])
        by_rows = model.learn(X[18:], y[18:])  # the row kernel's bytes are the library's
    assert [(r["verb"], r["rows"], r["data"]) for r in records] == [
        ("predict", 3, "random"), ("learn", 9, "random"), ("learn_by_rows", 9, "random")]
    assert [r["outputs_digest"] for r in records] == [
        digest(predicted), digest(learned), digest(by_rows)]
