"""The profiling script runs on the emulated device, so that a GPU session does not find it
broken: a profiled range around each call, whose outputs are the model's."""

import hashlib
import json

import numpy as np
import pytest

import gln.kernels.cuda
import gln.model
from benchmarks.gpu_profile import main
from gln import GLN
from tests.gln.emulated_cupy import GXX, emulated_cupy_installed

pytestmark = pytest.mark.skipif(GXX is None, reason="the emulated device needs g++ on PATH")


def digest(outputs) -> str:
    return hashlib.sha256(np.asarray(outputs).tobytes()).hexdigest()[:16]


def test_predictions_and_two_learning_calls_are_profiled_with_the_models_outputs(
        capsys, monkeypatch, small_network):
    monkeypatch.delenv("GLN_DATA_DIR", raising=False)  # random rows, whoever runs the tests
    monkeypatch.setattr(gln.kernels.cuda, "PREDICT_SHARED_MIN_ROWS", 1)  # 3 rows: shared kernel
    monkeypatch.setattr(gln.model, "REPLAY_MAX_ROWS", 0)  # launched, as long chunks are
    with emulated_cupy_installed() as cp:
        main(["--rows", "3", "--learn-rows", "9"])  # not replayed: launches
        assert (cp.operations["profiler start"], cp.operations["profiler stop"]) == (3, 3)
        assert cp.operations["kernel gln_layer_pass_rows"] == 3  # the third call's three layers
        # Three layers in each of the model's first prediction and the profiled one.
        assert cp.operations["kernel gln_layer_predict_shared"] == 3 * 2
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
