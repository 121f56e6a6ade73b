"""The CUDA sources and the launch plan, checked without a GPU.

NVRTC, the compiler CuPy itself calls, compiles every ``gln/kernels/*.cu`` for Hopper (sm_90)
with the options CuPy uses, for the row widths the models need, without register spills, where
its library is found (``GLN_NVRTC``, the ``nvidia-cuda-nvrtc-cu12`` wheel, or the system's; CI
fetches the wheel); where it is not, ``nvcc`` does the same (skipped, with the reason, where
nvcc is not on PATH either).
The kernels themselves run in ``test_cuda_backend.py``: on a GPU, and on the CPU under the
emulation of ``emulated_cupy.py``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gln.kernels.cuda import (
    COMPILE_OPTIONS,
    RESIDENT,
    ROWS,
    SHARED,
    STREAMING,
    WIDE,
    per_lane,
    plan_layer_launch,
)
from tests.gln.emulated_cupy import HOPPER_SHARED_BYTES
from tests.support.cuda_tools import compile_source, cuobjdump
from tests.support.cuda_tools import library as nvrtc_library

KERNELS = Path(__file__).resolve().parents[2] / "gln" / "kernels"
SOURCES = sorted(KERNELS.glob("*.cu"))
NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc (the CUDA toolkit) is not on PATH")
# Row widths the models use: layer sizes 0 (I = 1), 32, 128 and MNIST's 784 features, and the
# widest layer the kernels take (64 per lane).
PER_LANE_VALUES = (1, 2, 5, 25, 32, 64)


# Modules compiled at once: one a core, up to 8 (the GPU machines have 16, CI 2).
COMPILERS = min(8, max(2, os.cpu_count() or 2))

needs_nvrtc = pytest.mark.skipif(
    nvrtc_library() is None,
    reason="NVRTC's library was not found (GLN_NVRTC, nvidia-cuda-nvrtc-cu12)")
# (source, defines) of every module the library builds: each source, and the layer pass at each
# row width, at each sum batch of the shared prediction kernel, and with its other settings.
# A family's kernels (gln.family) are in those modules: its layer pass (gln_family_layer_pass,
# gln_family_layer_pass_wide) in the layer pass's at each row width, its moments' fold
# (gln_family_running_moments) in moments.cu's (FAMILY_KERNELS).
MODULES = [(source, ()) for source in SOURCES]
MODULES += [(KERNELS / "layer_pass.cu", (f"-DGLN_PER_LANE={p}",)) for p in PER_LANE_VALUES]
FAMILY_KERNELS = {
    "layer_pass.cu": ("gln_family_layer_pass", "gln_family_layer_pass_wide"),
    "moments.cu": ("gln_family_running_moments", "gln_family_running_moments_f32"),
}
MODULES += [(KERNELS / "layer_pass.cu", ("-DGLN_PER_LANE=5", f"-DGLN_SUM_BATCH={b}"))
            for b in (1, 8, 32)]
# More warps to a block of the shared kernel (gln.kernels.cuda.PREDICT_WARPS), as the host
# compiles them (without loading an input ahead beyond 16), for MNIST's first layer, and a
# warp's examples in groups (PREDICT_EXAMPLE_GROUP) on rows whose sums are batched, by the
# source's batch and by 32.
MORE_WARPS = (("-DGLN_PREDICT_WARPS=20", "-DGLN_PREFETCH=0"),
              ("-DGLN_PREDICT_WARPS=24", "-DGLN_PREFETCH=0"),
              ("-DGLN_PREDICT_WARPS=32", "-DGLN_PREFETCH=0"))
MODULES += [(KERNELS / "layer_pass.cu", ("-DGLN_PER_LANE=25", *warps)) for warps in MORE_WARPS]
MODULES += [(KERNELS / "layer_pass.cu", (f"-DGLN_PER_LANE={p}", *batch,
                                         f"-DGLN_EXAMPLE_GROUP={group}"))
            for p in (1, 5, 12) for batch in ((), ("-DGLN_SUM_BATCH=32",)) for group in (2, 4)]


def nvrtc(source: Path, *defines: str) -> tuple[int, str]:
    """NVRTC's status and its report of each kernel's stack frame and spills for ``source``
    compiled to sm_90 code with CuPy's options: ptxas's lines in NVRTC's log, or, where that
    NVRTC logs nothing on success (CUDA 13's on the GPU machines), the same figures read off
    the machine code by cuobjdump."""
    compiled = compile_source(source.read_text(), source.name, [*COMPILE_OPTIONS, *defines])
    if compiled.status or SPILL_REPORT.search(compiled.log):
        return compiled.status, compiled.log
    return compiled.status, resource_usage(compiled.cubin)


def resource_usage(cubin: bytes) -> str:
    """cuobjdump's resource usage of each kernel of ``cubin``, as ptxas's report words it."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        listing = subprocess.run([cuobjdump(), "--dump-resource-usage", file.name],
                                 capture_output=True, text=True, check=True).stdout
    usage = re.findall(r"STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", listing)
    return "".join(f"{stack} bytes stack frame, {local} bytes spill stores\n"
                   for stack, local in usage)


SPILL_REPORT = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores")


def assert_no_spills(report: str, what: str) -> None:
    """Register arrays must stay in registers: local memory would cost a round trip per
    element per example."""
    spills = SPILL_REPORT.findall(report)
    assert spills, report
    assert all(s == ("0", "0") for s in spills), f"{what}: {report}"


def nvcc(source: Path, out: Path, *defines: str) -> str:
    command = [NVCC, "-arch=sm_90", "-cubin", "-std=c++17", "-O3", *COMPILE_OPTIONS,
               "-Xptxas", "-v", *defines, "-o", str(out), str(source)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stdout}\n{result.stderr}"
    assert out.stat().st_size > 0
    return result.stdout + result.stderr


def test_there_are_kernel_sources():
    assert {p.name for p in SOURCES} >= {
        "layer_pass.cu", "moments.cu", "gating.cu", "scaling.cu", "layer_inputs.cu"}


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_sources_need_no_headers(source):
    """CuPy compiles them with NVRTC, which has no host headers: the sources include nothing."""
    assert not re.search(r"^\s*#\s*include", source.read_text(), re.MULTILINE)


def test_the_family_kernels_are_in_the_compiled_modules():
    """The kernels a GPU family launches (gln.kernels.cuda.FAMILY, FAMILY_WIDE and the moments'
    fold) are compiled, and checked for spills, with the modules they live in, at every row
    width the layer pass is compiled for."""
    import gln.kernels.cuda as cuda  # noqa: PLC0415

    assert {cuda.FAMILY, cuda.FAMILY_WIDE} == set(FAMILY_KERNELS["layer_pass.cu"])
    compiled = {source.name for source, _ in MODULES}
    for name, kernels in FAMILY_KERNELS.items():
        assert name in compiled
        text = (KERNELS / name).read_text()
        for kernel in kernels:
            assert re.search(rf"__global__ void __launch_bounds__\([^)]*\)\s+{kernel}\(",
                             text), kernel
    widths = {d for source, defines in MODULES if source.name == "layer_pass.cu"
              for d in defines if d.startswith("-DGLN_PER_LANE=")}
    assert widths >= {f"-DGLN_PER_LANE={p}" for p in PER_LANE_VALUES}


@needs_nvcc
@pytest.mark.skipif(nvrtc_library() is not None,
                    reason="NVRTC compiles and checks the same modules, as CuPy does (below)")
def test_every_source_compiles_for_hopper(tmp_path):
    with ThreadPoolExecutor(max_workers=COMPILERS) as pool:
        reports = list(pool.map(
            lambda job: nvcc(job[1][0], tmp_path / f"{job[0]}.cubin", *job[1][1]),
            enumerate(MODULES),
        ))
    for (source, defines), report in zip(MODULES, reports, strict=True):
        assert_no_spills(report, f"{source.name} {defines}")


@needs_nvrtc
def test_every_source_compiles_with_nvrtc_as_cupy_compiles_it():
    """What CuPy's RawModule runs on a GPU machine, here without one: every module compiles
    for sm_90, and no kernel keeps a stack frame or spills."""
    with ThreadPoolExecutor(max_workers=COMPILERS) as pool:
        results = list(pool.map(lambda job: nvrtc(job[0], *job[1]), MODULES))
    for (source, defines), (status, log) in zip(MODULES, results, strict=True):
        assert status == 0, f"{source.name} {defines}: {log}"
        assert_no_spills(log, f"{source.name} {defines}")


def test_launch_plan(monkeypatch):
    import gln.kernels.cuda as cuda  # noqa: PLC0415

    mnist_first = (10, 128, 16, 785)
    learn = plan_layer_launch(mnist_first, 4096, True, HOPPER_SHARED_BYTES)
    assert (learn.kernel, learn.grid, learn.block) == (ROWS, (20480, 1), (32,))
    assert learn.per_lane == per_lane(785) == 25
    monkeypatch.setattr(cuda, "ROW_WARPS_MIN_ROWS", None)  # the resident kernel, from 2,048
    learn = plan_layer_launch(mnist_first, 4096, True, HOPPER_SHARED_BYTES)
    assert (learn.kernel, learn.grid, learn.block) == (RESIDENT, (1280, 1), (32,))
    assert learn.shared_bytes == 16 * 785 * 4
    single = plan_layer_launch(mnist_first, 1, True, HOPPER_SHARED_BYTES)
    assert (single.kernel, single.grid, single.rows_per_warp) == (STREAMING, (320, 1), 1)
    predict = plan_layer_launch(mnist_first, 4096, False, HOPPER_SHARED_BYTES)
    assert (predict.kernel, predict.block) == (SHARED, (cuda.PREDICT_WARPS * 32,))
    assert predict.neurons_per_block == 4  # 4 neurons' rows a block
    assert (predict.grid, predict.neurons_per_block) == ((320, 4096 // 512), 4)
    assert predict.shared_bytes == 4 * 16 * 785 * 4 <= HOPPER_SHARED_BYTES
    second = plan_layer_launch((10, 128, 16, 129), 4096, False, HOPPER_SHARED_BYTES)
    assert (second.grid[0], second.neurons_per_block) == (160, 8)  # 26 fit; the cap is 8
    narrow = plan_layer_launch((10, 20, 16, 129), 4096, False, HOPPER_SHARED_BYTES)
    assert (narrow.grid[0], narrow.neurons_per_block) == (30, 7)  # 3 blocks a GLN, balanced
    few = plan_layer_launch(mnist_first, 100, False, HOPPER_SHARED_BYTES, "streaming")
    assert (few.kernel, few.grid, few.rows_per_warp) == (STREAMING, (320, 4), 32)
    assert plan_layer_launch(mnist_first, 100, False, HOPPER_SHARED_BYTES).kernel == SHARED
    assert plan_layer_launch(mnist_first, 63, False, HOPPER_SHARED_BYTES).kernel == STREAMING
    with pytest.raises(ValueError, match="only predicts"):
        plan_layer_launch(mnist_first, 4096, True, HOPPER_SHARED_BYTES, "shared")
    with pytest.raises(ValueError, match="exceed the shared memory"):  # not one neuron fits
        plan_layer_launch((1, 1, 2**8, 785), 4096, False, HOPPER_SHARED_BYTES, "shared")
    too_big = plan_layer_launch((1, 1, 2**8, 785), 4096, True, HOPPER_SHARED_BYTES)
    assert too_big.kernel == STREAMING  # 800 KB of rows: stays in global memory
    with pytest.raises(ValueError, match="power of two"):
        plan_layer_launch((1, 1, 3, 5), 1, True, HOPPER_SHARED_BYTES)
    with pytest.raises(ValueError, match="at least 1 input"):
        plan_layer_launch((1, 1, 2, 0), 1, True, HOPPER_SHARED_BYTES)
    wide = plan_layer_launch((1, 5, 2, 5000), 100, False, HOPPER_SHARED_BYTES)  # > 64 a lane
    assert (wide.kernel, wide.grid, wide.rows_per_warp, wide.per_lane) == (WIDE, (2, 4), 32, 1)


def test_the_row_kernel_is_forced_or_chosen_from_its_length(monkeypatch):
    """A warp (block) per row, 2^m rows a neuron, whatever their size: none in shared memory.
    Chosen for learning from ``ROW_WARPS_MIN_ROWS`` when that is set (the default: 256),
    never for prediction."""
    import gln.kernels.cuda as cuda  # noqa: PLC0415

    mnist_first = (10, 128, 16, 785)
    rows = plan_layer_launch(mnist_first, 4096, True, HOPPER_SHARED_BYTES, "rows")
    assert (rows.kernel, rows.grid, rows.block, rows.shared_bytes) == (ROWS, (20480, 1), (32,), 0)
    huge = plan_layer_launch((1, 1, 2**8, 785), 5, True, HOPPER_SHARED_BYTES, "rows")
    assert (huge.kernel, huge.grid) == (ROWS, (256, 1))
    monkeypatch.setattr(cuda, "ROW_WARPS_MIN_ROWS", None)
    assert plan_layer_launch(mnist_first, 4096, True, HOPPER_SHARED_BYTES).kernel == RESIDENT
    monkeypatch.setattr(cuda, "ROW_WARPS_MIN_ROWS", 256)
    assert plan_layer_launch(mnist_first, 256, True, HOPPER_SHARED_BYTES).kernel == ROWS
    assert plan_layer_launch(mnist_first, 255, True, HOPPER_SHARED_BYTES).kernel == STREAMING
    assert plan_layer_launch(mnist_first, 4096, False, HOPPER_SHARED_BYTES).kernel == SHARED
    many = (1, 1, 2**14, 3)  # the contexts' counts would not fit in 48 KB of shared memory
    assert plan_layer_launch(many, 4096, True, HOPPER_SHARED_BYTES).kernel == RESIDENT
    with pytest.raises(ValueError, match="at most 12288 contexts"):
        plan_layer_launch(many, 4096, True, HOPPER_SHARED_BYTES, "rows")


def source_default(name: str, lanes: int) -> int:
    """The layer pass source's own default of the macro ``name`` for rows of ``lanes`` elements
    a lane (its ``#define NAME (GLN_PER_LANE <= LIMIT ? NARROW : WIDE)``)."""
    match = re.search(rf"#ifndef {name}\n#define {name} \(GLN_PER_LANE <= (\d+) \? (\d+) : "
                      rf"(\d+)\)\n#endif", (KERNELS / "layer_pass.cu").read_text())
    assert match, f"{name}'s default is no longer of the form this test reads"
    limit, narrow, wide = map(int, match.groups())
    return narrow if lanes <= limit else wide


def test_the_hosts_shared_kernel_defaults_are_the_sources(monkeypatch):
    """Where the host leaves them to the source (``PREDICT_SUM_BATCH`` and ``PREDICT_WARPS``
    None), it sizes the shared kernel's blocks and batches as the source's defaults do: the
    two are written in both places (the host needs the block's warps to launch it), and this
    keeps them equal."""
    import gln.kernels.cuda as cuda  # noqa: PLC0415

    monkeypatch.setattr(cuda, "PREDICT_SUM_BATCH", None)
    monkeypatch.setattr(cuda, "PREDICT_WARPS", None)
    for lanes in range(1, 65):
        assert cuda.predict_sum_batch(lanes) == source_default("GLN_SUM_BATCH", lanes), lanes
        assert cuda.predict_warps(lanes) == source_default("GLN_PREDICT_WARPS", lanes), lanes


def test_the_shared_kernels_settings_compile_into_its_module_and_size_its_block(monkeypatch):
    """``PREDICT_SUM_BATCH``, ``PREDICT_WARPS`` and ``PREDICT_EXAMPLE_GROUP`` reach the
    shared kernel's module as macros (more than 16 warps without an input loaded ahead), and
    the warps its block; ``PREDICT_WARPS`` is for rows wider than ``GROUPED_MAX_LANES``, up to
    ``PREDICT_NARROW_LANES`` a lane (wider ones keep 8 warps), ``PREDICT_EXAMPLE_GROUP`` for
    rows of at most ``GROUPED_MAX_LANES`` whose sums are batched, and no other kernel takes
    any of them."""
    import gln.kernels.cuda as cuda  # noqa: PLC0415

    mnist_first = (10, 128, 16, 785)
    monkeypatch.setattr(cuda, "PREDICT_WARPS", 32)
    monkeypatch.setattr(cuda, "PREDICT_SUM_BATCH", 4)
    monkeypatch.setattr(cuda, "PREDICT_EXAMPLE_GROUP", None)
    first = plan_layer_launch(mnist_first, 4096, False, HOPPER_SHARED_BYTES)
    assert first.block == (32 * 32,)
    assert first.defines == ("-DGLN_SUM_BATCH=4", "-DGLN_PREDICT_WARPS=32",
                             "-DGLN_PREFETCH=0")
    monkeypatch.setattr(cuda, "PREDICT_WARPS", 20)
    first = plan_layer_launch(mnist_first, 4096, False, HOPPER_SHARED_BYTES)
    assert first.block == (20 * 32,)
    assert first.defines == ("-DGLN_SUM_BATCH=4", "-DGLN_PREDICT_WARPS=20", "-DGLN_PREFETCH=0")
    wide = plan_layer_launch((1, 2, 2, 32 * 40), 4096, False, HOPPER_SHARED_BYTES)
    assert (wide.block, wide.defines) == ((8 * 32,), ("-DGLN_SUM_BATCH=4",))
    monkeypatch.setattr(cuda, "PREDICT_EXAMPLE_GROUP", 4)  # for rows whose sums are batched
    second = plan_layer_launch((10, 128, 16, 129), 4096, False, HOPPER_SHARED_BYTES)
    assert second.block == (16 * 32,)  # PREDICT_WARPS is for wider rows
    assert second.defines == ("-DGLN_SUM_BATCH=4", "-DGLN_EXAMPLE_GROUP=4")
    assert "-DGLN_EXAMPLE_GROUP=4" not in plan_layer_launch(mnist_first, 4096, False,
                                                            HOPPER_SHARED_BYTES).defines
    monkeypatch.setattr(cuda, "PREDICT_SUM_BATCH", None)  # the source's 16
    second = plan_layer_launch((10, 128, 16, 129), 4096, False, HOPPER_SHARED_BYTES)
    assert second.defines == ("-DGLN_EXAMPLE_GROUP=4",)
    monkeypatch.setattr(cuda, "PREDICT_EXAMPLE_GROUP", 32)  # more than the source's batch
    with pytest.raises(ValueError, match=r"must divide the sums batched at once \(16\)"):
        plan_layer_launch((10, 128, 16, 129), 4096, False, HOPPER_SHARED_BYTES)
    monkeypatch.setattr(cuda, "PREDICT_EXAMPLE_GROUP", 4)
    monkeypatch.setattr(cuda, "PREDICT_SUM_BATCH", 1)  # no batches: no groups
    second = plan_layer_launch((10, 128, 16, 129), 4096, False, HOPPER_SHARED_BYTES)
    assert second.defines == ("-DGLN_SUM_BATCH=1",)
    monkeypatch.setattr(cuda, "PREDICT_SUM_BATCH", 2)
    with pytest.raises(ValueError, match=r"must divide the sums batched at once \(2\)"):
        plan_layer_launch((10, 128, 16, 129), 4096, False, HOPPER_SHARED_BYTES)
    for mode, learn in (("streaming", False), ("resident", True), ("rows", True)):
        assert plan_layer_launch(mnist_first, 4096, learn, HOPPER_SHARED_BYTES,
                                 mode).defines == ()


def test_the_shared_kernels_blocks_hold_at_most_the_cap(monkeypatch):
    """Two neurons of MNIST's first layer a block (100 KB, two blocks an SM) under a cap of 2;
    the second layer's 26 that fit become 13 per block under a cap of 13, balanced."""
    import gln.kernels.cuda as cuda  # noqa: PLC0415

    monkeypatch.setattr(cuda, "PREDICT_MAX_NEURONS_PER_BLOCK", 2)
    first = plan_layer_launch((10, 128, 16, 785), 4096, False, HOPPER_SHARED_BYTES)
    assert (first.grid[0], first.neurons_per_block) == (640, 2)
    assert first.shared_bytes == 2 * 16 * 785 * 4 <= HOPPER_SHARED_BYTES // 2
    monkeypatch.setattr(cuda, "PREDICT_MAX_NEURONS_PER_BLOCK", 13)
    second = plan_layer_launch((10, 128, 16, 129), 4096, False, HOPPER_SHARED_BYTES)
    assert (second.grid[0], second.neurons_per_block) == (100, 13)  # 10 blocks a GLN
