"""The profiling script runs on the emulated device, so that a GPU session does not find it
broken: one profiled range, around a prediction whose outputs are the model's."""

import hashlib
import json

import numpy as np
import pytest

from benchmarks.gpu_learn import NETWORK
from benchmarks.gpu_profile import main
from gln import GLN
from tests.gln.emulated_cupy import GXX, emulated_cupy_installed

pytestmark = pytest.mark.skipif(GXX is None, reason="the emulated device needs g++ on PATH")


def test_one_prediction_is_profiled_and_its_outputs_are_the_models(capsys, monkeypatch):
    monkeypatch.delenv("GLN_DATA_DIR", raising=False)  # random rows, whoever runs the tests
    with emulated_cupy_installed() as cp:
        main(["--rows", "3", "--learn-rows", "5"])
        assert (cp.operations["profiler start"], cp.operations["profiler stop"]) == (1, 1)
        (record,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        rng = np.random.default_rng(0)  # gpu_learn.load_data's random rows
        X = rng.uniform(0, 1, (5, 784)).astype(np.float32)
        y = rng.integers(0, 10, 5)
        model = GLN(**NETWORK, device="cuda")
        model.learn(X, y)
        expected = np.asarray(model.predict_proba(X[:3]))
    assert record["rows"] == 3 and record["data"] == "random"
    assert record["outputs_digest"] == hashlib.sha256(expected.tobytes()).hexdigest()[:16]
