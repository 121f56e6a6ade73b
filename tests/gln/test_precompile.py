"""``python -m gln.precompile`` fills Numba's cache with every CPU kernel a model
calls, so that a process started on that cache compiles nothing (what a container image built
with it relies on)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A model of another shape, scaling and side information than the precompiled one, through
# calls of every length class, a forced re-check of close margins and saliency, each kernel on
# its one-thread twin where the work is small and then on its parallel twin whatever the work;
# a family of such models; then each cached kernel's cache hits and misses in this process.
WORKLOAD = """
import json
import numpy as np
import gln.kernels.cpu
from gln import GLN
from gln.precompile import cached_kernels
rng = np.random.default_rng(1)
for options, all_parallel in (
    ({}, False),
    ({"input_scaling": "unit", "side_info": "per_row"}, False),
    ({}, True),
):
    if all_parallel:
        gln.kernels.cpu.PARALLEL_MIN_WORK = 0
    model = GLN(num_features=30, num_classes=4, layer_sizes=(6, 3, 1), context_dim=3, **options)
    model.offsets[:] = 0.0  # a first row of zeros then sits on every hyperplane: re-checked
    X = rng.uniform(0, 1, (300, 30)).astype(np.float32)
    X[0] = 0.0
    y = rng.integers(0, 4, len(X))
    for start, stop in ((0, 1), (1, 6), (6, 38), (38, 71), (71, 300)):
        model.learn(X[start:stop], y[start:stop])
        model.predict_proba(X[start:stop])
    model.saliency(X[:3])
# Many tenants' models as one family (a server's): rows of three members in one call.
from gln import GLNFamily
family = GLNFamily(3, num_features=30, num_classes=4, layer_sizes=(6, 3, 1), context_dim=3)
family.learn(X[:40], y[:40], rng.integers(0, 3, 40))
family.predict_proba(X[:5], rng.integers(0, 3, 5))
# A short call of rows too large for the 16-bit products (a value near float32's range, scaled
# to Z_LIMIT, in a row of 4,000 features), decided from the float32 normals; the first row,
# all zeros, sits on every hyperplane: re-checked.
wide = GLN(num_features=4000, num_classes=2, layer_sizes=(2, 1), context_dim=1)
wide.offsets[:] = 0.0
X = np.zeros((2, 4000), dtype=np.float32)
X[1, 0] = 3e38
wide.learn(X, [0, 1])
print(json.dumps({
    kernel.py_func.__qualname__: [sum(kernel.stats.cache_hits.values()),
                                  sum(kernel.stats.cache_misses.values())]
    for kernel in cached_kernels()
}))
"""


def _run(args: list[str], cache: Path) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_process_on_a_precompiled_cache_compiles_no_kernel(tmp_path: Path) -> None:
    compiled = _run(["-m", "gln.precompile"], tmp_path)["kernels"]
    called = {name.rsplit(".", 1)[-1] for name, count in compiled.items() if count}
    threaded = {"_layer_pass", "_quantize", "_int16_contexts"}
    assert threaded | {f"{name}_one_thread" for name in threaded} <= called
    assert {"_decide", "_exact_dots"} <= called
    assert any(tmp_path.rglob("*.nbi")), "nothing was written to the cache"

    stats = _run(["-c", WORKLOAD], tmp_path)
    assert {name for name, (hits, _) in stats.items() if hits} == called
    assert {name: misses for name, (_, misses) in stats.items() if misses} == {}
