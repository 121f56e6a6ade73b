"""The emulated device refuses what a GPU would refuse or get silently wrong.

``test_cuda_backend.py`` trusts the emulation to stand in for a GPU; these tests check that its
guards bite: kernel arguments against the kernels' C signatures, shared-memory opt-in, launch
bounds, CuPy's separation of host and device arrays, and what a stream capture may hold.
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Iterator
from types import ModuleType

import numpy as np
import pytest

from tests.gln.emulated_cupy import GXX, emulated_cupy_installed

pytestmark = pytest.mark.skipif(GXX is None, reason="the emulated device needs g++ on PATH")


@pytest.fixture
def cp() -> Iterator[ModuleType]:
    with emulated_cupy_installed() as module:
        yield module


ROWS, BIAS = np.int32(2), np.float32(1.0)


def layer_inputs_launch(cp, values, inputs, n=ROWS, bias=BIAS, block=128):
    """``gln_layer_inputs`` on (2, 1, 3) values, with the arguments a test wants to spoil."""
    from gln.kernels.cuda_modules import function  # noqa: PLC0415 - the cupy of the fixture

    kernel = function("layer_inputs.cu", "gln_layer_inputs")
    kernel((1,), (block,), (values, n, np.int32(1), np.int32(3), np.int32(0), bias, inputs))


def test_a_correct_launch_runs_the_kernel(cp):
    values = cp.asarray(np.arange(6, dtype=np.float32).reshape(2, 1, 3))
    inputs = cp.zeros((2, 1, 4), dtype=cp.float32)
    layer_inputs_launch(cp, values, inputs)
    np.testing.assert_array_equal(inputs.get()[:, 0], [[1, 0, 1, 2], [1, 3, 4, 5]])


@pytest.mark.parametrize("spoil", ["host array", "float64 array", "strided array", "python int",
                                   "int64 scalar", "float64 for a float"])
def test_kernel_arguments_must_match_the_c_signature(cp, spoil):
    values = cp.asarray(np.arange(6, dtype=np.float32).reshape(2, 1, 3))
    inputs = cp.zeros((2, 1, 4), dtype=cp.float32)
    arguments = {
        "host array": dict(values=values.get()),
        "float64 array": dict(values=values.astype(cp.float64)),
        "strided array": dict(values=cp.zeros((2, 1, 6), dtype=cp.float32)[:, :, ::2]),
        "python int": dict(n=2),
        "int64 scalar": dict(n=np.int64(2)),
        "float64 for a float": dict(bias=np.float64(1.0)),
    }[spoil]
    with pytest.raises(TypeError, match="gln_layer_inputs argument"):
        layer_inputs_launch(cp, **{"values": values, "inputs": inputs, **arguments})
    assert not inputs.get().any(), "nothing ran"


def test_launch_bounds_are_enforced(cp):
    values = cp.zeros((2, 1, 3), dtype=cp.float32)
    inputs = cp.zeros((2, 1, 4), dtype=cp.float32)
    with pytest.raises(ValueError, match="__launch_bounds__"):
        layer_inputs_launch(cp, values, inputs, block=256)


def test_shared_memory_beyond_48_kb_needs_an_opt_in(cp):
    from gln.kernels.cuda import RESIDENT, _layer_kernel, layer_kernel_args  # noqa: PLC0415

    kernel = _layer_kernel(1, RESIDENT)
    args = layer_kernel_args(
        cp.zeros((1, 1, 2, 1), dtype=cp.float32), cp.zeros((1, 1, 1), dtype=cp.int32),
        cp.zeros((1, 1, 1), dtype=cp.float32), cp.zeros((1, 1), dtype=cp.float32),
        cp.zeros(1, dtype=cp.float32), cp.zeros((1, 1, 1), dtype=cp.float32), 0.01, 5.0, True, 1)
    with pytest.raises(ValueError, match="opt in"):
        kernel((1,), (32,), args, shared_mem=64 * 1024)
    kernel.max_dynamic_shared_size_bytes = 64 * 1024
    kernel((1,), (32,), args, shared_mem=64 * 1024)
    with pytest.raises(ValueError, match="cannot opt into"):
        kernel.max_dynamic_shared_size_bytes = 300 * 1024


def test_host_and_device_arrays_do_not_mix(cp):
    device, host = cp.ones(3), np.ones(3)
    with pytest.raises(TypeError):
        np.asarray(device)
    with pytest.raises(TypeError):
        device + host
    with pytest.raises(TypeError):
        cp.concatenate([device, host])
    with pytest.raises(TypeError):
        cp.ascontiguousarray(host)
    assert isinstance(cp.asarray(host), cp.ndarray)  # the host -> device copy
    assert isinstance(device.sum(), cp.ndarray)  # reductions stay on the device (0-d)
    np.testing.assert_array_equal((device * 2).get(), [2.0, 2.0, 2.0])


def test_operations_count_launches_and_copies_but_not_views_or_allocations(cp):
    a = cp.asarray(np.ones((4, 4)))
    a.reshape(16), a[1:], a.T, cp.empty(3), cp.ascontiguousarray(a)  # views, pool, no-op
    a + 1, a[np.array([0, 2])], a.astype(cp.float32), a.get()
    assert dict(cp.operations) == {"copy host->device": 1, "op add": 1, "op gather": 1,
                                   "op astype": 1, "copy device->host": 1}


def test_a_barrier_holds_every_warp_of_the_block(cp):
    """Warp 0 reads what warp 3 wrote before ``__syncthreads``; emulated warps that ran one
    after another would read the poisoned shared memory instead."""
    code = r"""
    extern "C" __global__ void __launch_bounds__(128) reversed(const float* in, float* out) {
        float* buffer = dynamic_shared_floats();
        const int t = threadIdx.x;
        buffer[t] = in[t];
        __syncthreads();
        out[t] = buffer[blockDim.x - 1 - t];
    }
    """
    kernel = cp.RawModule(code=code).get_function("reversed")
    values = cp.asarray(np.arange(128, dtype=np.float32))
    out = cp.zeros(128, dtype=cp.float32)
    kernel((1,), (128,), (values, out), shared_mem=128 * 4)
    np.testing.assert_array_equal(out.get(), np.arange(128, dtype=np.float32)[::-1])


def test_warp_votes_see_every_lane_of_their_own_warp(cp):
    """__ballot_sync, __match_any_sync, __popc and __ffs as a GPU gives them, per warp of a
    two-warp block: lane l of each warp votes (value % 3 == 0) and matches value % 3."""
    code = r"""
    extern "C" __global__ void __launch_bounds__(64) votes(const int* in, int* out) {
        const int t = threadIdx.x, lane = t % 32, v = in[t];
        const unsigned yes = __ballot_sync(0xffffffffu, v % 3 == 0);
        const unsigned same = __match_any_sync(0xffffffffu, v % 3);
        out[4 * t] = static_cast<int>(yes);
        out[4 * t + 1] = static_cast<int>(same);
        out[4 * t + 2] = __popc(same & ((1u << lane) - 1u));
        out[4 * t + 3] = __ffs(static_cast<int>(same)) - 1;
    }
    """
    kernel = cp.RawModule(code=code).get_function("votes")
    values = np.random.default_rng(0).integers(0, 100, 64).astype(np.int32)
    out = cp.zeros(4 * 64, dtype=cp.int32)
    kernel((1,), (64,), (cp.asarray(values), out))
    got = out.get().reshape(64, 4).view(np.uint32)
    for t in range(64):
        warp = values[t - t % 32:t - t % 32 + 32]
        lane = t % 32
        same = [int(v % 3 == values[t] % 3) for v in warp]
        assert got[t, 0] == sum(int(v % 3 == 0) << i for i, v in enumerate(warp))
        assert got[t, 1] == sum(bit << i for i, bit in enumerate(same))
        assert got[t, 2] == sum(same[:lane]) and got[t, 3] == same.index(1)


def test_a_captured_graph_replays_its_launches_on_the_memory_it_was_given(cp):
    """Nothing runs during the capture; each replay runs the launch again with the arguments it
    was captured with, reading what the input buffer holds at that time."""
    stream, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
    values = cp.asarray(np.zeros((2, 1, 3), dtype=np.float32))
    with cp.cuda.using_allocator(pool.malloc), stream:
        stream.begin_capture()
        inputs = cp.empty((2, 1, 4), dtype=cp.float32)
        layer_inputs_launch(cp, values, inputs)
        graph = stream.end_capture()
    cp.operations.clear()
    for step in (1, 2):
        values.set(np.full((2, 1, 3), step, dtype=np.float32))
        graph.launch()
        np.testing.assert_array_equal(inputs.get()[:, 0], [[1, step, step, step]] * 2)
    assert dict(cp.operations) == {"copy host->device": 2, "graph launch": 2,
                                   "copy device->host": 2}


@pytest.mark.parametrize("operation", ["copy in", "copy out", "array operation", "GEMM",
                                       "shared pool allocation"])
def test_a_capture_refuses_what_it_would_not_replay_or_would_corrupt(cp, operation):
    """Copies and CuPy's own operations are not recorded by the emulation (refused, where a
    GPU would record or refuse them: CuPy refuses every cuBLAS call, a GEMM's among them); an
    allocation from the shared pool would be handed to another array while the graph still
    writes it."""
    stream, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
    device = cp.asarray(np.ones(3))
    act = {
        "copy in": lambda: cp.asarray(np.ones(3)),
        "copy out": device.get,
        "array operation": lambda: device + 1,
        "GEMM": lambda: device @ device,
        "shared pool allocation": lambda: cp.empty(3),
    }[operation]
    allocator = contextlib.nullcontext() if operation == "shared pool allocation" else (
        cp.cuda.using_allocator(pool.malloc))
    with allocator, stream:
        stream.begin_capture()
        with pytest.raises(RuntimeError, match="during a stream capture"):
            act()
        stream.end_capture()
    act()  # allowed once the capture is over


def test_capture_needs_a_stream_of_its_own(cp):
    with pytest.raises(RuntimeError, match="legacy"):
        cp.cuda.Stream(null=True).begin_capture()


def test_set_copies_only_a_host_array_of_the_same_dtype_and_shape(cp):
    device = cp.empty(4, dtype=cp.uint8)
    with pytest.raises(ValueError, match="set"):
        device.set(np.zeros(4, dtype=np.float32))
    with pytest.raises(ValueError, match="set"):
        device.set(np.zeros(5, dtype=np.uint8))
    with pytest.raises(TypeError, match="NumPy"):
        device.set(cp.zeros(4, dtype=cp.uint8))
    device.set(np.arange(4, dtype=np.uint8))
    np.testing.assert_array_equal(device.get(), np.arange(4))


def test_get_into_a_host_array_refuses_what_cupy_refuses(cp):
    """``get(out=...)`` fills a NumPy array of the same dtype and shape, and refuses others."""
    device = cp.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    with pytest.raises(TypeError, match="float64"):
        device.get(out=np.empty((2, 3)))
    with pytest.raises(ValueError, match="shape"):
        device.get(out=np.empty((3, 2), dtype=np.float32))
    with pytest.raises(RuntimeError, match="contiguous"):
        device.get(out=np.empty((3, 2), dtype=np.float32).T)
    with pytest.raises(TypeError, match="NumPy"):
        device.get(out=cp.empty((2, 3), dtype=cp.float32))
    out = np.zeros((2, 3), dtype=np.float32)
    assert device.get(out=out) is out
    np.testing.assert_array_equal(out, np.arange(6).reshape(2, 3))


def test_a_copy_on_a_side_stream_runs_when_it_is_waited_for(cp):
    """As a DMA would: until an event after it is waited for, the destination keeps its old
    contents, and the host memory is read only then."""
    host = np.ones(4, dtype=np.float32)
    device = cp.zeros(4, dtype=cp.float32)
    side = cp.cuda.Stream(non_blocking=True)
    device.set(host, stream=side)
    copied = side.record()
    host[0] = 7.0  # changed before the copy ran: the device gets the change
    assert device.get().tolist() == [0.0] * 4
    cp.cuda.get_current_stream().wait_event(copied)
    assert device.get().tolist() == [7.0, 1.0, 1.0, 1.0]
    device.set(np.full(4, 2.0, dtype=np.float32))  # on the current stream: at once
    assert device.get().tolist() == [2.0] * 4


def test_host_memory_is_page_locked_as_cuda_allows(cp):
    """``hostRegister`` refuses a range sharing a page with one registered, or lying in pinned
    memory; ``hostUnregister`` refuses a range never registered, and unlocking pages that a
    pending copy reads is an error (a GPU's DMA would read them unlocked)."""
    runtime = cp.cuda.runtime
    host = np.zeros(4 * 4096, dtype=np.uint8)
    start = -(-host.ctypes.data // 4096) * 4096  # three whole pages of it from here
    runtime.hostRegister(start + 4096, 10, 0)
    for address, size in ((start + 4096 + 100, 10), (start, 4097), (start + 8191, 2)):
        with pytest.raises(runtime.CUDARuntimeError) as refused:
            runtime.hostRegister(address, size, 0)
        assert refused.value.status == 712
    runtime.hostUnregister(start + 4096)
    runtime.hostRegister(start, 4097, 0)  # the page free again
    runtime.hostUnregister(start)
    with pytest.raises(runtime.CUDARuntimeError) as refused:
        runtime.hostUnregister(start)
    assert refused.value.status == 713
    pinned = np.frombuffer(cp.cuda.alloc_pinned_memory(64), dtype=np.uint8)
    with pytest.raises(runtime.CUDARuntimeError):
        runtime.hostRegister(pinned.ctypes.data + 8, 8, 0)

    rows = np.ones(16, dtype=np.float32)
    side = cp.cuda.Stream(non_blocking=True)
    runtime.hostRegister(rows.ctypes.data, rows.nbytes, 0)
    cp.zeros(16, dtype=cp.float32).set(rows, stream=side)  # held until waited for
    with pytest.raises(RuntimeError, match="copy from it was pending"):
        runtime.hostUnregister(rows.ctypes.data)
    side.synchronize()


def test_a_copy_from_page_locked_memory_lies_in_one_registered_range(cp):
    """A copy that starts in a registered range and runs past its end, as into the next one, is
    refused (``cudaErrorInvalidValue``), as CUDA refuses it; copies each within one range, or
    from memory never registered, arrive."""
    runtime = cp.cuda.runtime
    memory = mmap.mmap(-1, 3 * mmap.PAGESIZE)
    host = np.frombuffer(memory, np.float32)
    host[:] = np.arange(len(host))
    start, page = host.ctypes.data, mmap.PAGESIZE // 4
    runtime.hostRegister(start, mmap.PAGESIZE, 0)
    runtime.hostRegister(start + mmap.PAGESIZE, 2 * mmap.PAGESIZE, 0)
    try:
        device = cp.zeros(len(host), dtype=cp.float32)
        with pytest.raises(runtime.CUDARuntimeError) as refused:
            device[page - 4:page + 4].set(host[page - 4:page + 4])
        assert refused.value.status == 1
        for part in (slice(0, page), slice(page, None)):
            device[part].set(host[part])
        np.testing.assert_array_equal(device.get(), host)
    finally:
        runtime.hostUnregister(start)
        runtime.hostUnregister(start + mmap.PAGESIZE)
    unlocked = np.ones(8, dtype=np.float32)
    device[:8].set(unlocked)
    np.testing.assert_array_equal(device[:8].get(), unlocked)
