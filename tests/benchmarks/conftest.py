"""Fixtures of the benchmark scripts' tests."""

import pytest

import gln.kernels.cuda as cuda
from benchmarks import gpu_learn


@pytest.fixture
def small_network(monkeypatch: pytest.MonkeyPatch) -> dict:
    """The GPU benchmarks' network (``gpu_learn.NETWORK``, which every GPU script builds its
    models from) with layers of 8, 8 and 1 neurons instead of 128, 128 and 1, for the runs on
    the emulated device: the same kernels and code paths at a fifteenth of the threads, which the
    emulator runs one after another."""
    monkeypatch.setitem(gpu_learn.NETWORK, "layer_sizes", (8, 8, 1))
    return gpu_learn.NETWORK


@pytest.fixture
def shared_launch_defines(monkeypatch: pytest.MonkeyPatch) -> set[tuple[str, ...]]:
    """The macros of every launch of the shared prediction kernel planned while the test runs
    (``LayerLaunch.defines``), collected as the launches are planned: which of its settings
    reached the kernel."""
    defines: set[tuple[str, ...]] = set()
    plan = cuda.plan_layer_launch

    def planned(*args, **kwargs):
        launch = plan(*args, **kwargs)
        if launch.kernel == cuda.SHARED:
            defines.add(launch.defines)
        return launch

    monkeypatch.setattr(cuda, "plan_layer_launch", planned)
    return defines
