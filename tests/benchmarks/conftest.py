"""Fixtures of the benchmark scripts' tests."""

import pytest

from benchmarks import gpu_learn


@pytest.fixture
def small_network(monkeypatch: pytest.MonkeyPatch) -> dict:
    """The GPU benchmark's network (``gpu_learn.NETWORK``) with layers of 8, 8 and 1 neurons
    instead of 128, 128 and 1, for the runs on the emulated device: the same kernels and code
    paths at a fifteenth of the threads, which the emulator runs one after another."""
    monkeypatch.setitem(gpu_learn.NETWORK, "layer_sizes", (8, 8, 1))
    return gpu_learn.NETWORK
