"""The GPU benchmark's latency profile, run on the CPU model (the profiling is device-blind)."""

import numpy as np

from benchmarks.gpu_learn import latency_profile
from gln import GLN


def test_the_profile_ranks_functions_per_learn_call_with_learn_itself_among_them():
    rng = np.random.default_rng(0)
    X, y = rng.uniform(0, 1, (40, 6)), rng.integers(0, 3, 40)
    model = GLN(num_features=6, num_classes=3, layer_sizes=(4, 1), seed=0)
    model.learn(X[:2], y[:2])  # compile outside the profile
    functions = latency_profile(model, X[2:], y[2:], calls=30, top=40)
    assert 0 < len(functions) <= 40
    cumulative = [f["cumulative_us"] for f in functions]
    assert cumulative == sorted(cumulative, reverse=True)
    assert all(f["own_us"] <= f["cumulative_us"] + 1e-9 for f in functions)
    learn = [f for f in functions if f["function"].startswith("model.py:") and
             f["function"].endswith(":learn")]
    assert len(learn) == 1 and learn[0]["calls_per_learn"] == 1.0
    assert model.examples_seen == 32
