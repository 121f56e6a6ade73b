"""The CUDA sources, checked without a GPU.

1. ``nvcc`` compiles every ``gln/kernels/*.cu`` for Hopper (sm_90) with the options CuPy uses,
   for the row widths the models need, without register spills.
2. The kernels *run* on the CPU: the same source is built with g++ against a small emulation of
   the CUDA features it uses (each lane a fiber; the 32 lanes of a warp switch at every
   warp-collective call, so ``__shfl_sync`` sees the warp in lockstep) and is compared with the
   NumPy reference. This checks the indexing, the 32-example windows, the prefetch and the
   launch plan of ``gln.kernels.cuda``; rounding on the GPU differs (expf), which the GPU tests
   in ``test_gpu.py`` cover.

Skipped, with the reason, where nvcc or g++ is not on PATH.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from gln.gating import (
    context_indices,
    dot_rounding_bound,
    halfspace_contexts,
    layer_contexts,
    rounding_tolerances,
    sample_halfspaces,
)
from gln.kernels.cpu import cpu_exact_dots
from gln.kernels.cuda import (
    COMPILE_OPTIONS,
    GATING_THREADS,
    INPUTS_THREADS,
    RESIDENT,
    SCALING_THREADS,
    SIDE_INFO_THREADS,
    STREAMING,
    layer_kernel_args,
    per_lane,
    plan_layer_launch,
)
from gln.network import reference_layer_pass, with_bias
from gln.scaling import (
    RunningMoments,
    gaussian_blur_matrix,
    moments_before_each_row,
    per_row_side_info,
    standardized,
)
from tests.gln.layer_data import random_layer

KERNELS = Path(__file__).resolve().parents[2] / "gln" / "kernels"
SOURCES = sorted(KERNELS.glob("*.cu"))
NVCC = shutil.which("nvcc")
GXX = shutil.which("g++")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc (the CUDA toolkit) is not on PATH")
needs_gxx = pytest.mark.skipif(GXX is None, reason="g++ is not on PATH")
# Row widths the models use: layer sizes 0 (I = 1), 32, 128 and MNIST's 784 features, and the
# widest layer the kernels take (64 per lane).
PER_LANE_VALUES = (1, 2, 5, 25, 64)
HOPPER_SHARED_BYTES = 227 * 1024


def nvcc(source: Path, out: Path, *defines: str) -> str:
    command = [NVCC, "-arch=sm_90", "-cubin", "-std=c++17", "-O3", *COMPILE_OPTIONS,
               "-Xptxas", "-v", *defines, "-o", str(out), str(source)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stdout}\n{result.stderr}"
    assert out.stat().st_size > 0
    return result.stdout + result.stderr


def test_there_are_kernel_sources():
    assert {p.name for p in SOURCES} >= {
        "layer_pass.cu", "moments.cu", "gating.cu", "scaling.cu", "layer_inputs.cu",
        "side_info.cu"}


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_sources_need_no_headers(source):
    """CuPy compiles them with NVRTC, which has no host headers: the sources include nothing."""
    assert not re.search(r"^\s*#\s*include", source.read_text(), re.MULTILINE)


@needs_nvcc
def test_every_source_compiles_for_hopper(tmp_path):
    jobs = [(source, ()) for source in SOURCES]
    jobs += [(KERNELS / "layer_pass.cu", (f"-DGLN_PER_LANE={p}",)) for p in PER_LANE_VALUES]
    with ThreadPoolExecutor(max_workers=4) as pool:
        reports = list(pool.map(
            lambda job: nvcc(job[1][0], tmp_path / f"{job[0]}.cubin", *job[1][1]),
            enumerate(jobs),
        ))
    for (source, defines), report in zip(jobs, reports, strict=True):
        # Register arrays must stay in registers: local memory would cost a round trip per
        # element per example.
        spills = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores", report)
        assert spills, report
        assert all(s == ("0", "0") for s in spills), f"{source.name} {defines}: {report}"


# --------------------------------------------------------------------- host emulation of CUDA
EMULATION = r"""
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <functional>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)

struct gln_dim3 { unsigned x, y, z; };

namespace emu {
constexpr int kLanes = 32;
constexpr size_t kStack = 128 * 1024;
inline gln_dim3 block_idx{0, 0, 0}, block_dim{1, 1, 1}, grid_dim{1, 1, 1};
inline gln_dim3 thread_idx[kLanes];
inline int lane = 0;
inline ucontext_t scheduler, fibers[kLanes];
inline bool finished[kLanes];
inline unsigned long long slots[2][kLanes];
inline unsigned phase[kLanes];
inline std::vector<float> shared;
inline std::vector<char> stacks(kLanes * kStack);
inline std::function<void()> body;
inline int failed = 0;

inline void yield() { swapcontext(&fibers[lane], &scheduler); }

// A warp-collective exchange: write, wait for the whole warp, read. Two slot sets, since a
// lane may write the next exchange before a slower lane has read this one.
template <class T> T exchange(T value, int source) {
    const unsigned p = phase[lane]++ & 1u;
    memcpy(&slots[p][lane], &value, sizeof(T));
    yield();
    T out;
    memcpy(&out, &slots[p][source & (kLanes - 1)], sizeof(T));
    return out;
}

inline void run_lane() { body(); finished[lane] = true; }

inline void run_warp(unsigned warp) {
    for (int l = 0; l < kLanes; ++l) {
        thread_idx[l] = {warp * kLanes + l, 0, 0};
        finished[l] = false;
        phase[l] = 0;
        getcontext(&fibers[l]);
        fibers[l].uc_stack.ss_sp = stacks.data() + l * kStack;
        fibers[l].uc_stack.ss_size = kStack;
        fibers[l].uc_link = &scheduler;
        makecontext(&fibers[l], run_lane, 0);
    }
    for (bool running = true; running;) {
        running = false;
        int waiting = 0, done = 0;
        for (int l = 0; l < kLanes; ++l) {
            if (finished[l]) continue;
            lane = l;
            swapcontext(&scheduler, &fibers[l]);
            running = true;
            (finished[l] ? done : waiting) += 1;
        }
        if (waiting && done) failed = 1;  // lanes of one warp left the lockstep
    }
}

inline void launch(gln_dim3 grid, gln_dim3 block, size_t shared_bytes,
                   std::function<void()> kernel) {
    grid_dim = grid;
    block_dim = block;
    body = kernel;
    for (unsigned y = 0; y < grid.y; ++y) {
        for (unsigned x = 0; x < grid.x; ++x) {
            block_idx = {x, y, 0};
            shared.assign(shared_bytes / sizeof(float) + 4, NAN);  // poisoned
            for (unsigned w = 0; w < (block.x + kLanes - 1) / kLanes; ++w) run_warp(w);
        }
    }
}
}  // namespace emu

#define threadIdx (emu::thread_idx[emu::lane])
#define blockIdx (emu::block_idx)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)

inline void __syncwarp(unsigned = 0xffffffffu) { emu::yield(); }
template <class T> inline T __shfl_sync(unsigned, T v, int source) {
    return emu::exchange(v, source);
}
template <class T> inline T __shfl_xor_sync(unsigned, T v, int mask) {
    return emu::exchange(v, emu::lane ^ mask);
}
template <class T> inline T __ldg(const T* p) { return *p; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __dsqrt_rn(double a) { return sqrt(a); }
inline float __double2float_rn(double a) { return static_cast<float>(a); }
inline float* dynamic_shared_floats() { return emu::shared.data(); }

#include "layer_pass.cu"
#include "moments.cu"
#include "gating.cu"
#include "scaling.cu"
#include "layer_inputs.cu"
#include "side_info.cu"

extern "C" int emu_layer_pass(int resident, unsigned grid_x, unsigned grid_y, unsigned block_x,
                              unsigned shared_bytes, float* weights, const int* contexts,
                              const float* inputs, const float* targets, const float* rates,
                              float* probs, int n, int glns, int neurons, int num_contexts,
                              int num_inputs, int groups, float lo, float hi, float bound,
                              int learn, int rows_per_warp) {
    emu::failed = 0;
    emu::launch({grid_x, grid_y, 1}, {block_x, 1, 1}, shared_bytes, [=] {
        (resident ? gln_layer_pass_resident : gln_layer_pass_streaming)(
            weights, contexts, inputs, targets, rates, probs, n, glns, neurons, num_contexts,
            num_inputs, groups, lo, hi, bound, learn, rows_per_warp);
    });
    return emu::failed;
}

extern "C" int emu_running_moments(const double* x, const double* total, const double* total_sq,
                                   double* sums, double* sums_sq, double* after_total,
                                   double* after_total_sq, int n, int d, double count,
                                   double* counts) {
    emu::failed = 0;
    const unsigned threads = n > d ? n : d;
    emu::launch({(threads + 127) / 128, 1, 1}, {128, 1, 1}, 0, [=] {
        gln_running_moments(x, total, total_sq, sums, sums_sq, after_total, after_total_sq,
                            n, d, count, counts);
    });
    return emu::failed;
}

extern "C" int emu_halfspace_contexts(unsigned grid_x, unsigned block_x, const float* products,
                                      const float* z, const float* normals,
                                      const float* offsets, const float* tolerance, int n,
                                      int neurons, int context_dim, int num_features,
                                      const int* layer_starts, int layers, int* contexts) {
    emu::failed = 0;
    emu::launch({grid_x, 1, 1}, {block_x, 1, 1}, 0, [=] {
        gln_halfspace_contexts(products, z, normals, offsets, tolerance, n, neurons,
                               context_dim, num_features, layer_starts, layers, contexts);
    });
    return emu::failed;
}

extern "C" int emu_rounding_tolerances(unsigned grid_x, unsigned block_x, const float* z, int n,
                                       int d, double twice_gamma, float* tolerance) {
    emu::failed = 0;
    emu::launch({grid_x, 1, 1}, {block_x, 1, 1}, 0, [=] {
        gln_rounding_tolerances(z, n, d, twice_gamma, tolerance);
    });
    return emu::failed;
}

extern "C" int emu_per_row_side_info(unsigned grid_x, unsigned block_x, const double* x, int n,
                                     int height, int width, int blurred,
                                     const double* blur_rows, const double* blur_cols,
                                     double* scratch, float* z) {
    emu::failed = 0;
    emu::launch({grid_x, 1, 1}, {block_x, 1, 1}, 0, [=] {
        gln_per_row_side_info(x, n, height, width, blurred, blur_rows, blur_cols, scratch, z);
    });
    return emu::failed;
}

extern "C" int emu_standardize(unsigned grid_x, unsigned block_x, const double* x,
                               const double* counts, const double* sums, const double* sums_sq,
                               int n, int d, int stats_rows, double min_std, double logit_cap,
                               float* z, float* base_logits) {
    emu::failed = 0;
    emu::launch({grid_x, 1, 1}, {block_x, 1, 1}, 0, [=] {
        gln_standardize(x, counts, sums, sums_sq, n, d, stats_rows, min_std, logit_cap, z,
                        base_logits);
    });
    return emu::failed;
}

extern "C" int emu_layer_inputs(unsigned grid_x, unsigned block_x, const float* values, int n,
                                int groups, int width, int from_probs, float bias_logit,
                                float* inputs) {
    emu::failed = 0;
    emu::launch({grid_x, 1, 1}, {block_x, 1, 1}, 0, [=] {
        gln_layer_inputs(values, n, groups, width, from_probs, bias_logit, inputs);
    });
    return emu::failed;
}
"""


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    """``{per_lane: ctypes library}``: the kernels built for the CPU, one build per row width."""
    if GXX is None:
        pytest.skip("g++ is not on PATH")
    directory = tmp_path_factory.mktemp("emulation")
    driver = directory / "driver.cpp"
    driver.write_text(EMULATION)

    def build(lanes: int) -> tuple[int, Path]:
        library = directory / f"kernels{lanes}.so"
        # Rows of 2 per lane (I = 33..64) take the path without prefetch, which the kernels use
        # beyond 32 per lane, so that it is checked too.
        prefetch = f"-DGLN_PREFETCH={int(lanes != 2)}"
        command = [GXX, "-std=c++17", "-O1", "-shared", "-fPIC", "-ffp-contract=off",
                   "-DGLN_HOST_EMULATION", f"-DGLN_PER_LANE={lanes}", prefetch,
                   "-I", str(KERNELS), "-o", str(library), str(driver)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        return lanes, library

    with ThreadPoolExecutor(max_workers=4) as pool:
        built = dict(pool.map(build, (1, 2, 5, 25)))
    return {lanes: ctypes.CDLL(str(path)) for lanes, path in built.items()}


def _c_arg(value):
    if isinstance(value, np.ndarray):
        assert value.flags.c_contiguous
        return ctypes.c_void_p(value.ctypes.data)
    if isinstance(value, np.float32):
        return ctypes.c_float(float(value))
    return ctypes.c_int(int(value))


def emulated_layer_pass(libraries, mode="auto"):
    """A ``LayerPass`` that plans like ``cuda_layer_pass`` and runs the emulated kernel."""

    def layer_pass(weights, contexts, inputs, targets, rates, pred_clip, weight_clip, learn,
                   probs):
        n = contexts.shape[0]
        if n == 0:
            return
        launch = plan_layer_launch(weights.shape, n, learn, HOPPER_SHARED_BYTES, mode)
        library = libraries[launch.per_lane]
        args = layer_kernel_args(weights, contexts, inputs, targets, rates, probs, pred_clip,
                                 weight_clip, learn, launch.rows_per_warp)
        status = library.emu_layer_pass(
            ctypes.c_int(launch.kernel == RESIDENT), ctypes.c_uint(launch.grid[0]),
            ctypes.c_uint(launch.grid[1]), ctypes.c_uint(launch.block[0]),
            ctypes.c_uint(launch.shared_bytes), *(_c_arg(a) for a in args),
        )
        assert status == 0, "a warp's lanes diverged at a warp-collective call"

    return layer_pass


def run(layer_pass, w, ctx, x, targets, rates, learn, pred_clip=0.01, weight_clip=1.5):
    weights = w.copy()
    probs = np.full((len(ctx), *w.shape[:2]), np.nan, np.float32)  # poisoned
    layer_pass(weights, ctx, x, targets, rates, pred_clip, weight_clip, learn, probs)
    return weights, probs


LAYERS = [  # (G, K, S, I): a bias-only input, odd widths, one warp exactly, MNIST's first layer
    (2, 3, 2, 1),
    (3, 5, 4, 33),
    (2, 3, 4, 64),
    (2, 5, 16, 129),
    (2, 3, 16, 785),
]


@needs_gxx
@pytest.mark.parametrize("layer", LAYERS, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mode", ["streaming", "resident"])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("learn", [True, False])
def test_emulated_kernel_matches_reference(emulated, layer, mode, shared, learn):
    glns, neurons, contexts, inputs = layer
    rng = np.random.default_rng(sum(layer))
    data = random_layer(rng, glns, neurons, contexts, inputs, 70, shared)  # 3 windows of 32
    w_ref, p_ref = run(reference_layer_pass(np), *data, learn)
    w_emu, p_emu = run(emulated_layer_pass(emulated, mode), *data, learn)
    assert not np.isnan(p_emu).any(), "some outputs were never written"
    np.testing.assert_allclose(p_emu, p_ref, atol=1e-5)
    np.testing.assert_allclose(w_emu, w_ref, atol=1e-5)
    if not learn:
        np.testing.assert_array_equal(w_emu, data[0])


@needs_gxx
@pytest.mark.parametrize("layer", LAYERS[1:], ids=lambda s: "x".join(map(str, s)))
def test_emulated_chunk_equals_rows_and_kernels_agree(emulated, layer):
    """A chunk (resident kernel) equals its rows one call at a time (streaming), byte for byte."""
    glns, neurons, contexts, inputs = layer
    rng = np.random.default_rng(7)
    w, ctx, x, targets, rates = random_layer(rng, glns, neurons, contexts, inputs, 40, False)
    assert plan_layer_launch(w.shape, 40, True, HOPPER_SHARED_BYTES).kernel == RESIDENT
    assert plan_layer_launch(w.shape, 1, True, HOPPER_SHARED_BYTES).kernel == STREAMING
    chunk_w, chunk_p = run(emulated_layer_pass(emulated), w, ctx, x, targets, rates, True)
    rows_w, rows_p = w.copy(), np.empty_like(chunk_p)
    for t in range(40):
        rows_w, rows_p[t:t + 1] = run(emulated_layer_pass(emulated), rows_w, ctx[t:t + 1],
                                      x[t:t + 1], targets[t:t + 1], rates[t:t + 1], True)
    np.testing.assert_array_equal(rows_w, chunk_w)
    np.testing.assert_array_equal(rows_p, chunk_p)
    streaming_w, streaming_p = run(emulated_layer_pass(emulated, "streaming"), w, ctx, x,
                                   targets, rates, True)
    np.testing.assert_array_equal(streaming_w, chunk_w)
    np.testing.assert_array_equal(streaming_p, chunk_p)


def test_launch_plan():
    mnist_first = (10, 128, 16, 785)
    learn = plan_layer_launch(mnist_first, 4096, True, HOPPER_SHARED_BYTES)
    assert (learn.kernel, learn.grid, learn.block) == (RESIDENT, (1280, 1), (32,))
    assert learn.shared_bytes == 16 * 785 * 4 and learn.per_lane == per_lane(785) == 25
    single = plan_layer_launch(mnist_first, 1, True, HOPPER_SHARED_BYTES)
    assert (single.kernel, single.grid, single.rows_per_warp) == (STREAMING, (320, 1), 1)
    predict = plan_layer_launch(mnist_first, 4096, False, HOPPER_SHARED_BYTES)
    assert (predict.kernel, predict.grid, predict.rows_per_warp) == (STREAMING, (320, 128), 32)
    too_big = plan_layer_launch((1, 1, 2**8, 785), 4096, True, HOPPER_SHARED_BYTES)
    assert too_big.kernel == STREAMING  # 800 KB of rows: stays in global memory
    with pytest.raises(ValueError, match="power of two"):
        plan_layer_launch((1, 1, 3, 5), 1, True, HOPPER_SHARED_BYTES)
    with pytest.raises(ValueError, match="inputs"):
        plan_layer_launch((1, 1, 2, 5000), 1, True, HOPPER_SHARED_BYTES)


@needs_gxx
@pytest.mark.parametrize("n", [0, 1, 13, 70, 300])
def test_emulated_moments_equal_numpy_bit_for_bit(emulated, n):
    """Sums, sums of squares and counts before each row; 300 rows outnumber the 130 features,
    so the counts take threads of their own."""
    rng = np.random.default_rng(n)
    d = 130  # two blocks of 128 threads
    x = rng.normal(3, 5, (n, d))
    moments = RunningMoments(17, rng.normal(0, 100, d), rng.uniform(0, 1000, d))
    counts, sums, sums_sq, after = moments_before_each_row(np, moments, x)
    out = [np.full((n, d), np.nan), np.full((n, d), np.nan), np.full(d, np.nan),
           np.full(d, np.nan)]
    got_counts = np.full((n, 1), np.nan)
    library = emulated[1]
    status = library.emu_running_moments(
        *(_c_arg(np.ascontiguousarray(a)) for a in (x, moments.total, moments.total_sq, *out)),
        ctypes.c_int(n), ctypes.c_int(d), ctypes.c_double(moments.count), _c_arg(got_counts))
    assert status == 0
    np.testing.assert_array_equal(out[0], sums)
    np.testing.assert_array_equal(out[1], sums_sq)
    np.testing.assert_array_equal(out[2], after.total)
    np.testing.assert_array_equal(out[3], after.total_sq)
    np.testing.assert_array_equal(got_counts, counts)


@needs_gxx
@pytest.mark.parametrize(("context_dim", "glns", "layer_sizes"),
                         [(1, 1, (36,)), (4, 1, (9,)), (4, 3, (2, 1)), (1, 2, (5, 10, 3))])
def test_emulated_gating_equals_numpy_contexts(emulated, context_dim, glns, layer_sizes):
    """The on-device context kernel decides every bit as ``layer_contexts`` does on NumPy,
    including margins too close to call in float32, which it redoes in float64 itself, and
    writes each layer's (n, G, K_l) block where the layer pass reads it."""
    rng = np.random.default_rng(context_dim + 10 * len(layer_sizes))
    n, d, neurons = 37, 50, glns * sum(layer_sizes)
    z = rng.normal(size=(n, d)).astype(np.float32)
    normals, offsets = sample_halfspaces(rng, neurons * context_dim, d, 0.3)
    # Ties: a plane's offset set to a row's own dot product leaves a margin of a few ulps.
    for t, p in zip(rng.integers(0, n, 30), rng.integers(0, neurons * context_dim, 30),
                    strict=True):
        offsets[p] = np.float32(z[t].astype(np.float64) @ normals[p].astype(np.float64))
    products = z @ normals.T
    tolerance = rounding_tolerances(np, z)
    close = np.abs(products - offsets) <= tolerance[:, None]
    assert close.sum() >= 10, "the test must exercise the float64 re-check"
    expected = layer_contexts(np, z, normals, offsets, context_dim, glns, layer_sizes,
                              dots=cpu_exact_dots)
    contexts = np.full(n * neurons, -1, dtype=np.int32)
    starts = np.cumsum([0, *layer_sizes]).astype(np.int32)
    threads = GATING_THREADS
    status = emulated[1].emu_halfspace_contexts(
        ctypes.c_uint(-(-contexts.size // threads)), ctypes.c_uint(threads),
        *(_c_arg(np.ascontiguousarray(a)) for a in (products, z, normals, offsets, tolerance)),
        ctypes.c_int(n), ctypes.c_int(neurons), ctypes.c_int(context_dim), ctypes.c_int(d),
        _c_arg(starts), ctypes.c_int(len(layer_sizes)), _c_arg(contexts),
    )
    assert status == 0
    blocks = np.split(contexts, np.cumsum([n * glns * k for k in layer_sizes])[:-1])
    for block, layer, k in zip(blocks, expected, layer_sizes, strict=True):
        np.testing.assert_array_equal(block.reshape(n, glns, k), layer)
    # The float32 signs alone disagree with the exact decision somewhere, so the re-check ran.
    flat = halfspace_contexts(np, z, normals, offsets, context_dim, dots=cpu_exact_dots)
    float32_only = context_indices(np, products - offsets >= 0, context_dim)
    assert (float32_only != flat).any()


@needs_gxx
@pytest.mark.parametrize("frozen", [False, True], ids=["learning", "frozen"])
def test_emulated_standardize_equals_numpy_bit_for_bit(emulated, frozen):
    """The fused standardisation equals ``gln.scaling.standardized``: before any data, constant
    features (the std floor), logits beyond the cap, statistics per row or one frozen set."""
    rng = np.random.default_rng(int(frozen))
    n, d = 23, 70
    x = rng.normal(2, 3, (n, d)) * rng.uniform(0.01, 10, d)
    x[:, 5] = 4.0  # constant: variance 0, std floor
    start = RunningMoments(0, np.zeros(d), np.zeros(d))  # row 0 is scaled before any data
    counts, sums, sums_sq, after = moments_before_each_row(np, start, x)
    x[3, 9] = 1e4  # far beyond the logit cap, whichever statistics scale it
    if frozen:
        counts, sums, sums_sq = np.full((1, 1), float(after.count)), after.total[None], \
            after.total_sq[None]
    min_std, logit_cap = 0.3, float(np.log(0.9997 / 3e-4))
    expected_z, expected_logits = standardized(np, x, counts, sums, sums_sq, min_std, logit_cap)
    assert (np.abs(expected_logits) == np.float32(logit_cap)).any()
    z = np.full((n, d), np.nan, np.float32)
    logits = np.full((n, d), np.nan, np.float32)
    status = emulated[1].emu_standardize(
        ctypes.c_uint(-(-z.size // SCALING_THREADS)), ctypes.c_uint(SCALING_THREADS),
        *(_c_arg(np.ascontiguousarray(a)) for a in (x, counts, sums, sums_sq)),
        ctypes.c_int(n), ctypes.c_int(d), ctypes.c_int(counts.shape[0]),
        ctypes.c_double(min_std), ctypes.c_double(logit_cap), _c_arg(z), _c_arg(logits),
    )
    assert status == 0
    np.testing.assert_array_equal(z, expected_z)
    np.testing.assert_array_equal(logits, expected_logits)


@needs_gxx
@pytest.mark.parametrize("from_probs", [False, True], ids=["base", "hidden"])
def test_emulated_layer_inputs_match_with_bias(emulated, from_probs):
    """The fused builder writes the bias logit first, then the values or their logits."""
    rng = np.random.default_rng(int(from_probs))
    n, groups, width = 9, 1 if not from_probs else 4, 37
    values = (rng.uniform(1e-4, 1 - 1e-4, (n, groups, width)) if from_probs
              else rng.normal(0, 3, (n, groups, width))).astype(np.float32)
    expected = with_bias(np, values, np.float32(1.0), from_probs)
    inputs = np.full(expected.shape, np.nan, np.float32)
    status = emulated[1].emu_layer_inputs(
        ctypes.c_uint(-(-inputs.size // INPUTS_THREADS)), ctypes.c_uint(INPUTS_THREADS),
        _c_arg(values), ctypes.c_int(n), ctypes.c_int(groups), ctypes.c_int(width),
        ctypes.c_int(from_probs), ctypes.c_float(1.0), _c_arg(inputs),
    )
    assert status == 0
    np.testing.assert_array_equal(inputs[:, :, 0], 1.0)
    if from_probs:  # logf of the host C library against NumPy's log: a few ulps apart at most
        np.testing.assert_allclose(inputs, expected, rtol=1e-6, atol=1e-7)
    else:
        np.testing.assert_array_equal(inputs, expected)


@needs_gxx
@pytest.mark.parametrize("n, d", [(1, 5), (7, 784), (130, 33)])
def test_emulated_rounding_tolerances_equal_the_array_code(emulated, n, d):
    """One warp per row; the float64 sum runs in another order, so equal up to its rounding."""
    z = np.random.default_rng(d).normal(0, 3, (n, d)).astype(np.float32)
    tolerance = np.full(n, np.nan, np.float32)
    warps_per_block = GATING_THREADS // 32
    status = emulated[1].emu_rounding_tolerances(
        ctypes.c_uint(-(-n // warps_per_block)), ctypes.c_uint(GATING_THREADS), _c_arg(z),
        ctypes.c_int(n), ctypes.c_int(d), ctypes.c_double(2.0 * dot_rounding_bound(d)),
        _c_arg(tolerance),
    )
    assert status == 0
    np.testing.assert_allclose(tolerance, rounding_tolerances(np, z), rtol=1e-6)


def emulated_side_info(library, x, image, sigma):
    n, d = x.shape
    blurred = sigma > 0
    rows = gaussian_blur_matrix(image[0], sigma) if blurred else np.zeros(1)
    cols = gaussian_blur_matrix(image[1], sigma) if blurred else np.zeros(1)
    z = np.full((n, d), np.nan, np.float32)
    scratch = np.full((n, 2 * d), np.nan)
    status = library.emu_per_row_side_info(
        ctypes.c_uint(-(-n * 32 // SIDE_INFO_THREADS)), ctypes.c_uint(SIDE_INFO_THREADS),
        _c_arg(np.ascontiguousarray(x)), ctypes.c_int(n), ctypes.c_int(image[0]),
        ctypes.c_int(image[1]), ctypes.c_int(blurred), _c_arg(rows), _c_arg(cols),
        _c_arg(scratch), _c_arg(z),
    )
    assert status == 0
    return z, ((rows, cols) if blurred else None)


@needs_gxx
@pytest.mark.parametrize("sigma", [0.0, 1.0], ids=["plain", "blurred"])
def test_emulated_per_row_side_info_matches_numpy_and_ignores_the_chunk(emulated, sigma):
    """Equal to ``per_row_side_info`` up to the rounding of its sums; a constant row gives 0;
    and each row's bits are the same whether it is computed alone or with others."""
    image = (5, 7)
    x = np.random.default_rng(3).random((6, 35))  # two blocks of four warps
    x[4] = 0.25
    z, blur = emulated_side_info(emulated[1], x, image, sigma)
    np.testing.assert_allclose(z, per_row_side_info(np, x, blur), rtol=1e-6, atol=1e-6)
    assert (z[4] == 0).all()
    for t in (0, 5):
        alone, _ = emulated_side_info(emulated[1], x[t:t + 1], image, sigma)
        np.testing.assert_array_equal(alone[0], z[t])
