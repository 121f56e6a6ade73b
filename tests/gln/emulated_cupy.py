"""CuPy on the CPU, for tests: the real kernel sources under a warp emulator, NumPy memory
that behaves like device memory.

Why: the GPU path (``gln.kernels.cuda`` and the model's array code on CuPy) must be checked
on machines without a GPU, and a GPU is rarely at hand. ``EmulatedCupy`` is installed as the
``cupy`` module (``emulated_cupy_installed``); ``GLN(device="cuda")`` then runs its CUDA
path end to end, every kernel compiled from its ``.cu`` source with g++ against a small
emulation of the CUDA features the sources use (each thread of a block a fiber; threads switch
at every warp-collective call and ``__syncthreads``, so ``__shfl_sync`` sees the warp in
lockstep and a block's barrier holds every warp).

It fails where a real GPU run would fail or go silently wrong:

* a kernel argument that is not what the kernel's C parameter takes: a host array where a
  device pointer is expected (CuPy would pass a size-one NumPy array *by value*), a
  non-contiguous array, the wrong element type, a Python number or the wrong NumPy scalar
  type for an ``int`` / ``float`` / ``double``, the wrong number of arguments;
* a launch beyond the kernel's ``__launch_bounds__``, more than 48 KB of dynamic shared memory
  without opting in, an opt-in beyond the device's 227 KB;
* lanes of a warp that leave the lockstep at a warp-collective call;
* a block that writes where another block's outputs go, or relies on blocks running in grid
  order: a launch runs its blocks one at a time in an order shuffled by the launch's count
  (the same every run);
* host and device arrays mixed in one operation, and implicit conversion of a device array
  to NumPy (``np.asarray``), which CuPy refuses;
* during a stream capture, anything but kernel launches (recorded with their arguments and run
  again at each ``Graph.launch``), views and allocations from a private memory pool: copies
  and CuPy's own array operations, which CUDA would record or refuse, and allocations from the
  shared pool, whose memory CuPy would hand to other arrays while the graph still writes it.

* copies on a stream of their own (``set(..., stream=s)`` with ``s`` a non-blocking stream
  other than the current one) are held back until an event recorded after them is waited for or
  synchronised, or ``s`` is: then they read the host memory, as a DMA would. Reading the
  destination before waiting for the copy sees its old contents, and host memory changed
  before the copy finished reaches the device changed.
* host memory page-locked where it lies (``runtime.hostRegister``) is refused, as CUDA refuses
  it, where it shares a page with memory already registered or lies in pinned memory; so is a
  copy that starts in one registered range and runs past its end; and unlocking it
  (``hostUnregister``) while a copy from it is still pending is an error: a GPU's copy would
  read pages no longer locked.

It does not model timing, races between warps, asynchronous launches or the GPU's rounding of
``expf`` (the host's libm stands in). The same tests on a GPU
(``test_cuda_backend.py -m gpu``) cover those.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import functools
import hashlib
import mmap
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import types
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

GXX = shutil.which("g++")
HOPPER_SHARED_BYTES = 227 * 1024  # dynamic shared memory one block may opt into
DEFAULT_SHARED_BYTES = 48 * 1024  # without opting in
MAX_SHARED_OPTIN_ATTRIBUTE = 97  # cudaDevAttrMaxSharedMemoryPerBlockOptin

# The CUDA features the kernel sources use, for g++. Launches are serial: one block at a time,
# in a shuffled order, every thread of the block a fiber; threads switch at warp-collective
# calls and barriers.
HEADER = r"""
#include <math.h>
#include <sched.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)

struct gln_dim3 { unsigned x, y, z; };

namespace emu {
constexpr int kLanes = 32;
constexpr int kMaxThreads = 1024;
constexpr size_t kStack = 128 * 1024;
inline gln_dim3 block_idx{0, 0, 0}, block_dim{1, 1, 1}, grid_dim{1, 1, 1};
inline gln_dim3 thread_idx[kMaxThreads];
inline int current = 0;  // the running thread of the block
inline ucontext_t scheduler, fibers[kMaxThreads];
inline bool finished[kMaxThreads], started[kMaxThreads];
inline unsigned long long slots[2][kMaxThreads];
inline unsigned phase[kMaxThreads];
inline std::vector<float> shared;
inline char* stacks = nullptr;  // calloc: pages are only touched by the threads that run
inline int stack_threads = 0;
inline std::function<void()> body;
inline int failed = 0;
// __syncthreads: threads that have arrived, threads of the block still running, and a count of
// completed barriers that waiting threads watch.
inline int arrived = 0, running_threads = 0;
inline unsigned barriers = 0;

// Switches between threads are _setjmp/_longjmp (no system call); ucontext only starts a
// thread on its own stack.
inline jmp_buf scheduler_point, thread_points[kMaxThreads];

inline void yield() {
    if (!_setjmp(thread_points[current])) _longjmp(scheduler_point, 1);
}

// A warp-collective exchange: write, wait for the whole warp, read (from lane `source` of the
// same warp). Two slot sets, since a lane may write the next exchange before a slower lane has
// read this one.
template <class T> T exchange(T value, int source) {
    const unsigned p = phase[current]++ & 1u;
    memcpy(&slots[p][current], &value, sizeof(T));
    yield();
    T out;
    memcpy(&out, &slots[p][current - current % kLanes + (source & (kLanes - 1))], sizeof(T));
    return out;
}

// Every lane's predicate, a bit each, on every lane of the warp (__ballot_sync).
inline unsigned ballot(bool predicate) {
    const unsigned p = phase[current]++ & 1u;
    slots[p][current] = predicate;
    yield();
    unsigned bits = 0;
    const int first = current - current % kLanes;
    for (int lane = 0; lane < kLanes; ++lane) bits |= (slots[p][first + lane] ? 1u : 0u) << lane;
    return bits;
}

// The lanes of the warp whose value equals this lane's, a bit each (__match_any_sync).
inline unsigned match_any(int value) {
    const unsigned p = phase[current]++ & 1u;
    slots[p][current] = static_cast<unsigned>(value);
    yield();
    unsigned bits = 0;
    const int first = current - current % kLanes;
    for (int lane = 0; lane < kLanes; ++lane) {
        bits |= (slots[p][first + lane] == slots[p][current] ? 1u : 0u) << lane;
    }
    return bits;
}

inline void release_barrier_if_complete() {
    if (arrived > 0 && arrived == running_threads) {
        arrived = 0;
        ++barriers;
    }
}

// Every thread yields at least once, and all stay until the pass after the last arrival, so
// the lanes of a warp leave together, still in lockstep.
inline void syncthreads() {
    const unsigned barrier = barriers;
    ++arrived;
    release_barrier_if_complete();
    do yield(); while (barriers == barrier);
}

// A thread's fiber runs the kernel once for every block it serves: after each run it waits
// where the next block resumes it, so a fiber starts (two system calls of ucontext's) once
// for all the blocks and launches of a module, not once a block.
inline void run_thread() {
    for (;;) {
        body();
        finished[current] = true;
        --running_threads;
        release_barrier_if_complete();  // an exited thread no longer holds a barrier back
        yield();  // the scheduler resumes this fiber for its next block
    }
}

// The block's threads round robin, each up to its next warp-collective call or barrier.
inline void run_block(int threads) {
    if (threads > stack_threads) {  // new stacks: every fiber starts again
        free(stacks);
        stacks = static_cast<char*>(calloc(threads, kStack));
        stack_threads = threads;
        for (int t = 0; t < kMaxThreads; ++t) started[t] = false;
    }
    for (int t = 0; t < threads; ++t) {
        thread_idx[t] = {static_cast<unsigned>(t), 0, 0};
        finished[t] = false;
        phase[t] = 0;
        if (started[t]) continue;  // waiting in run_thread for its next block
        getcontext(&fibers[t]);
        fibers[t].uc_stack.ss_sp = stacks + t * kStack;
        fibers[t].uc_stack.ss_size = kStack;
        fibers[t].uc_link = &scheduler;
        makecontext(&fibers[t], run_thread, 0);
    }
    arrived = 0;
    running_threads = threads;
    for (bool running = true; running;) {
        running = false;
        for (int warp = 0; warp * kLanes < threads; ++warp) {
            int waiting = 0, done = 0;
            for (int t = warp * kLanes; t < threads && t < (warp + 1) * kLanes; ++t) {
                if (finished[t]) continue;
                current = t;
                if (!_setjmp(scheduler_point)) {
                    if (started[t]) _longjmp(thread_points[t], 1);
                    started[t] = true;
                    swapcontext(&scheduler, &fibers[t]);
                }
                running = true;
                (finished[t] ? done : waiting) += 1;
            }
            if (waiting && done) failed = 1;  // lanes of one warp left the lockstep
        }
    }
}

// Launches so far: each shuffles its blocks by a seed of its own.
inline unsigned long long launches = 0;

// The blocks of a launch one at a time, in an order shuffled by the launch's count (the same
// order every run): a GPU runs them in any order and at once, so a block that writes into
// another's outputs, before or after it in the grid, leaves its value there in some order
// (in grid order, the rightful block's later write would hide one beyond a block's end).
inline int launch(gln_dim3 grid, gln_dim3 block, size_t shared_bytes,
                  std::function<void()> kernel) {
    failed = 0;
    grid_dim = grid;
    block_dim = block;
    body = kernel;
    std::vector<gln_dim3> order;
    order.reserve(static_cast<size_t>(grid.x) * grid.y);
    for (unsigned y = 0; y < grid.y; ++y) {
        for (unsigned x = 0; x < grid.x; ++x) order.push_back({x, y, 0});
    }
    unsigned long long state = 0x9e3779b97f4a7c15ull * ++launches;
    for (size_t i = order.size(); i > 1; --i) {  // Fisher-Yates, by a 64-bit LCG
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        std::swap(order[i - 1], order[(state >> 33) % i]);
    }
    for (const gln_dim3& index : order) {
        block_idx = index;
        shared.assign(shared_bytes / sizeof(float) + 4, NAN);  // poisoned
        run_block(static_cast<int>(block.x));
    }
    return failed;
}

// A kernel parameter's kind: pointer to float / double / int / long long / signed char (F, D,
// I, L, C), or float, double, int by value (f, d, i); '?' for anything else.
template <class T> constexpr char code() {
    using U = std::remove_cv_t<T>;
    if constexpr (std::is_pointer_v<U>) {
        using E = std::remove_cv_t<std::remove_pointer_t<U>>;
        return std::is_same_v<E, float> ? 'F' : std::is_same_v<E, double> ? 'D'
             : std::is_same_v<E, int> ? 'I' : std::is_same_v<E, long long> ? 'L'
             : std::is_same_v<E, signed char> ? 'C' : '?';
    } else {
        return std::is_same_v<U, float> ? 'f' : std::is_same_v<U, double> ? 'd'
             : std::is_same_v<U, int> ? 'i' : '?';
    }
}

template <class... A> const char* signature(void (*)(A...)) {
    static const char codes[] = {code<A>()..., '\0'};
    return codes;
}

// Call a kernel with CUDA's convention for arguments: args[i] points at argument i.
template <class... A, size_t... I>
void call(void (*kernel)(A...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_cv_t<A>*>(args[I])...);
}

template <class... A>
int launch_kernel(void (*kernel)(A...), unsigned grid_x, unsigned grid_y, unsigned block_x,
                  size_t shared_bytes, void** args) {
    return launch({grid_x, grid_y, 1}, {block_x, 1, 1}, shared_bytes,
                  [=] { call(kernel, args, std::index_sequence_for<A...>{}); });
}
}  // namespace emu

#define threadIdx (emu::thread_idx[emu::current])
#define blockIdx (emu::block_idx)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)

inline void __syncwarp(unsigned = 0xffffffffu) { emu::yield(); }
inline void __syncthreads() { emu::syncthreads(); }
template <class T> inline T __shfl_sync(unsigned, T v, int source) {
    return emu::exchange(v, source);
}
template <class T> inline T __shfl_xor_sync(unsigned, T v, int mask) {
    return emu::exchange(v, (emu::current % emu::kLanes) ^ mask);
}
template <class T> inline T __ldg(const T* p) { return *p; }
inline unsigned __ballot_sync(unsigned, int predicate) { return emu::ballot(predicate != 0); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline unsigned __match_any_sync(unsigned, int value) { return emu::match_any(value); }
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
inline void __nanosleep(unsigned) { sched_yield(); }  // a thread of the host waits
// Threads switch only at warp-collective calls and barriers, so plain updates are atomic.
inline int atomicAdd(int* p, int v) { const int old = *p; *p = old + v; return old; }
inline int atomicOr(int* p, int v) { const int old = *p; *p = old | v; return old; }
inline int atomicAnd(int* p, int v) { const int old = *p; *p = old & v; return old; }
"""

# Every kernel in a source: extern "C" __global__ void [__launch_bounds__(threads)] name(
_KERNEL = re.compile(
    r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\(([^)]*)\)\s+)?(\w+)\s*\('
)
_LAUNCHERS = r"""
extern "C" const char* emu_signature_{name}() {{ return emu::signature({name}); }}
extern "C" int emu_max_threads_{name}() {{ return {threads}; }}
extern "C" int emu_launch_{name}(unsigned grid_x, unsigned grid_y, unsigned block_x,
                                 size_t shared_bytes, void** args) {{
    return emu::launch_kernel({name}, grid_x, grid_y, block_x, shared_bytes, args);
}}
"""
_SCALAR_TYPES = {"i": (np.int32, ctypes.c_int32), "f": (np.float32, ctypes.c_float),
                 "d": (np.float64, ctypes.c_double)}
_POINTER_DTYPES = {"I": np.int32, "L": np.int64, "F": np.float32, "D": np.float64,
                   "C": np.int8}
_LAUNCH_LOCK = threading.Lock()  # the emulator's state is global: one launch at a time
_BUILD_DIRECTORY = tempfile.TemporaryDirectory(prefix="gln-emulated-cuda-")


@functools.cache
def compile_module(code: str, defines: tuple[str, ...]) -> tuple[ctypes.CDLL, dict[str, str]]:
    """``code`` built for the CPU with the ``-D`` options in ``defines``: the library and the
    bounds expression of each kernel (cached per source and options)."""
    if GXX is None:
        raise RuntimeError("the CUDA emulation needs g++ on PATH")
    # __launch_bounds__(threads[, min blocks]): the first argument bounds a launch
    kernels = {name: (bounds.split(",")[0] or "1024") for bounds, name in _KERNEL.findall(code)}
    driver = "\n".join([
        HEADER, '#line 1 "module.cu"', code,
        *(_LAUNCHERS.format(name=name, threads=bounds) for name, bounds in kernels.items()),
    ])
    digest = hashlib.sha256((driver + repr(defines)).encode()).hexdigest()[:16]
    directory = Path(_BUILD_DIRECTORY.name)
    source, library = directory / f"{digest}.cpp", directory / f"{digest}.so"
    source.write_text(driver)
    # -U_FORTIFY_SOURCE: the fortified longjmp refuses to jump between the threads' stacks.
    command = [GXX, "-std=c++17", "-O1", "-shared", "-fPIC", "-ffp-contract=off",
               "-U_FORTIFY_SOURCE", "-DGLN_HOST_EMULATION", *defines, "-o", str(library),
               str(source)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}\n{result.stderr}")
    return ctypes.CDLL(str(library)), kernels


# --------------------------------------------------------------------------- device arrays
# What a real device would have done, one count per launch or copy: kernels by name, CuPy
# operations that write a new buffer or into one (views and empty allocations are free), and
# copies each way. Reset by ``emulated_cupy_installed``; read through ``EmulatedCupy.operations``.
OPERATIONS: collections.Counter[str] = collections.Counter()


def _operation(name: str) -> None:
    """Count a device operation other than a kernel launch; refused while the current stream
    is capturing (stricter than CUDA: only launches are recorded here, so only they may be
    captured; CuPy itself refuses cuBLAS's GEMMs, its matmul's among them, during a capture)."""
    if _capturing_stream() is not None:
        raise RuntimeError(f"{name} during a stream capture: only kernel launches, views and "
                           "allocations from a private pool are captured")
    OPERATIONS[name] += 1


# --------------------------------------------------------------------------- streams, graphs
_THREAD = threading.local()  # CuPy's current stream and allocator are per thread


def _streams() -> list[Any]:
    if not hasattr(_THREAD, "streams"):
        _THREAD.streams = []
    return _THREAD.streams


def _current_stream() -> _Stream:
    """``cupy.cuda.get_current_stream``: the innermost ``with stream``, else the null stream."""
    streams = _streams()
    return streams[-1] if streams else _NULL_STREAM


def _capturing_stream() -> Any:
    """The current stream if it is capturing, else None."""
    streams = _streams()
    return streams[-1] if streams and streams[-1].launches is not None else None


class _PinnedMemory(mmap.mmap):
    """``cupy.cuda.alloc_pinned_memory``'s memory: page-locked host memory in whole pages of
    its own, as ``cudaHostAlloc`` gives them, which no other array shares (and which
    ``hostRegister`` refuses)."""

    def address(self) -> int:
        return ctypes.addressof((ctypes.c_char * len(self)).from_buffer(self))


_PINNED: weakref.WeakValueDictionary[int, _PinnedMemory] = weakref.WeakValueDictionary()


def _alloc_pinned_memory(size: int) -> _PinnedMemory:
    memory = _PinnedMemory(-1, max(size, 1))  # anonymous, page-aligned; at least a byte
    _PINNED[id(memory)] = memory  # while it lives
    return memory


class CUDARuntimeError(RuntimeError):
    """``cupy.cuda.runtime.CUDARuntimeError``: a runtime call refused, with its status."""

    def __init__(self, status: int) -> None:
        super().__init__(f"CUDA runtime error {status}")
        self.status = status


_INVALID_VALUE, _HOST_MEMORY_ALREADY_REGISTERED, _HOST_MEMORY_NOT_REGISTERED = 1, 712, 713
_PAGE_BYTES = 4096
_REGISTERED: dict[int, int] = {}  # page-locked host ranges (cudaHostRegister): start -> end
_REGISTERED_LOCK = threading.Lock()


def _host_register(address: int, size: int, flags: int) -> None:
    """``cudaHostRegister``: refused, as CUDA refuses it, for a range sharing a page with one
    already registered or lying in pinned memory."""
    _operation("host register")
    first, last = address // _PAGE_BYTES, (address + size - 1) // _PAGE_BYTES
    with _REGISTERED_LOCK:
        shared = any(first <= (end - 1) // _PAGE_BYTES and start // _PAGE_BYTES <= last
                     for start, end in _REGISTERED.items())
        pinned = any(memory.address() < address + size and address < memory.address() + len(memory)
                     for memory in list(_PINNED.values()))
        if shared or pinned:
            raise CUDARuntimeError(_HOST_MEMORY_ALREADY_REGISTERED)
        _REGISTERED[address] = address + size


def _host_unregister(address: int) -> None:
    """``cudaHostUnregister``: refused for a range never registered; an error where a copy from
    the range is still pending, which a GPU would run from pages no longer locked."""
    _operation("host unregister")
    with _REGISTERED_LOCK:
        end = _REGISTERED.pop(address, None)
    if end is None:
        raise CUDARuntimeError(_HOST_MEMORY_NOT_REGISTERED)
    for stream in list(_STREAMS):
        for copy in stream.held:
            start, size = copy.source
            if start < end and address < start + size:
                raise RuntimeError("host memory unregistered while a copy from it was pending: "
                                   "a GPU's DMA would read pages no longer locked")


def _check_within_one_registration(array: np.ndarray) -> None:
    """A copy from page-locked memory must lie in one registration: CUDA takes a source that
    starts in a registered range for that range's, and refuses one running past its end
    (``cudaErrorInvalidValue``), as where it runs into the next registration."""
    start = array.__array_interface__["data"][0]
    with _REGISTERED_LOCK:
        ends = [end for first, end in _REGISTERED.items() if first <= start < end]
    if ends and start + array.nbytes > ends[0]:
        raise CUDARuntimeError(_INVALID_VALUE)


class _Stream:
    """``cupy.cuda.Stream``: ``with stream`` makes it current; capture records its launches."""

    def __init__(self, null: bool = False, non_blocking: bool = False) -> None:
        self.null = null
        self.non_blocking = non_blocking
        self.launches: list[tuple] | None = None
        self.held: list[Callable[[], None]] = []  # copies not yet run, in stream order
        self.issued = 0  # copies ever put on the stream; the first issued - len(held) have run
        _STREAMS.add(self)

    def run_later(self, copy: Callable[[], None]) -> None:
        """Run ``copy`` now if this is the current stream (whose work is done when issued) or
        one that synchronises with it, else hold it until something waits for it."""
        if not self.non_blocking or self is _current_stream():
            copy()
            return
        self.held.append(copy)
        self.issued += 1

    def run_until(self, position: int) -> None:
        """Run the held copies among the first ``position`` issued."""
        while self.held and self.issued - len(self.held) < position:
            self.held.pop(0)()

    def record(self, event: _Event | None = None) -> _Event:
        event = event or _Event()
        event.record(self)
        return event

    def wait_event(self, event: _Event) -> None:
        """Later work on this stream follows the event's: here, that work runs now."""
        event.synchronize()

    def __enter__(self) -> _Stream:
        _streams().append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _streams().pop()

    def begin_capture(self) -> None:
        if self.null:
            raise RuntimeError("cannot capture on the default (legacy) stream")
        if self.launches is not None:
            raise RuntimeError("the stream is already capturing")
        self.launches = []

    def end_capture(self) -> _Graph:
        if self.launches is None:
            raise RuntimeError("the stream is not capturing")
        launches, self.launches = self.launches, None
        return _Graph(launches)

    def is_capturing(self) -> bool:
        return self.launches is not None

    def synchronize(self) -> None:
        self.run_until(self.issued)


_STREAMS: weakref.WeakSet[_Stream] = weakref.WeakSet()  # every stream made, for synchronize
_NULL_STREAM = _Stream(null=True)


class _Graph:
    """``cupy.cuda.Graph``: the captured launches, with the arguments they were given."""

    def __init__(self, launches: list[tuple]) -> None:
        self.launches = launches

    def launch(self, stream: Any = None) -> None:
        if _capturing_stream() is not None:
            raise NotImplementedError("the emulator does not capture graph launches")
        OPERATIONS["graph launch"] += 1
        for kernel, launch in self.launches:
            kernel.run(*launch)


class _MemoryPool:
    """``cupy.cuda.MemoryPool``: only its ``malloc`` matters, to ``using_allocator``."""

    def malloc(self, size: int) -> None:
        raise NotImplementedError("the emulator allocates with NumPy")


@contextlib.contextmanager
def _using_allocator(allocator: Any = None) -> Iterator[None]:
    """``cupy.cuda.using_allocator``: allocations in the block come from ``allocator``."""
    previous = getattr(_THREAD, "allocator", None)
    _THREAD.allocator = allocator
    try:
        yield
    finally:
        _THREAD.allocator = previous


def _check_capture_allocation(name: str) -> None:
    """Memory allocated during a capture from the shared pool goes back to it when its array
    is dropped and is handed out again while the graph still writes it: refuse that."""
    if _capturing_stream() is not None and getattr(_THREAD, "allocator", None) is None:
        raise RuntimeError(f"{name} during a stream capture from the shared memory pool: "
                           "capture with a private pool (cupy.cuda.using_allocator)")


def _count_if_new(name: str, result: Any, *sources: Any) -> Any:
    """Count ``name`` when ``result`` is an array in memory none of ``sources`` owns."""
    if isinstance(result, np.ndarray) and result.size and not any(
        isinstance(s, np.ndarray) and np.may_share_memory(result, s) for s in sources
    ):
        _operation(f"op {name}")
    return result


def _unwrap(value: Any, host_allowed: bool = False) -> Any:
    """NumPy values for NumPy, refusing host arrays as CuPy does (unless ``host_allowed``)."""
    if isinstance(value, DeviceArray):
        return value.host_view
    if isinstance(value, np.ndarray) and not host_allowed:
        raise TypeError(f"Unsupported type {type(value)}: a host (NumPy) array reached CuPy")
    if isinstance(value, list | tuple):
        return type(value)(_unwrap(v, host_allowed) for v in value)
    if isinstance(value, dict):
        return {k: _unwrap(v, host_allowed) for k, v in value.items()}
    return value


def _wrap(value: Any) -> Any:
    """Arrays and NumPy scalars as device arrays (CuPy's reductions give 0-d arrays)."""
    if isinstance(value, np.ndarray):
        return DeviceArray(value)
    if isinstance(value, np.generic):
        return DeviceArray(np.asarray(value))
    if isinstance(value, list | tuple):
        return type(value)(_wrap(v) for v in value)
    return value


class _Device:
    """``cupy.cuda.Device``: one device, id 0."""

    def __init__(self, device_id: int = 0) -> None:
        if device_id != 0:
            raise ValueError(f"the emulated machine has one device, 0; got {device_id}")
        self.id = 0

    def __enter__(self) -> _Device:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def synchronize(self) -> None:
        """Launches run to completion when called; copies held on side streams run now."""
        for stream in list(_STREAMS):
            stream.synchronize()


class _Event:
    """``cupy.cuda.Event``: launches are synchronous here, so the host clock times them."""

    def __init__(self) -> None:
        self.time = None
        self.stream: _Stream | None = None
        self.position = 0  # the stream's copies issued before the event

    def record(self, stream: _Stream | None = None) -> None:
        self.time = time.perf_counter()
        self.stream = stream or _current_stream()
        self.position = self.stream.issued

    def synchronize(self) -> None:
        """The copies issued on the event's stream before it have run."""
        if self.stream is not None:
            self.stream.run_until(self.position)

    @staticmethod
    def elapsed_ms(start: _Event, stop: _Event) -> float:
        return (stop.time - start.time) * 1e3


class DeviceArray(NDArrayOperatorsMixin):
    """An array on the emulated device: NumPy memory behind CuPy's rules.

    Operations between device arrays work as in NumPy and give device arrays; host arrays are
    refused; ``get()`` copies to the host and ``np.asarray`` on a device array raises.
    """

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, array: np.ndarray) -> None:
        self.host_view = array

    @property
    def device(self) -> _Device:
        return _Device(0)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """What marks a GPU array (``gln.backend.is_device_array``); the pointer is no real
        device memory, so nothing may read through it."""
        return {"shape": self.host_view.shape, "typestr": self.host_view.dtype.str,
                "data": (0, False), "version": 3}

    @property
    def data(self) -> types.SimpleNamespace:
        """``cupy.ndarray.data``: its ``ptr`` is the address of the first element, which only
        the emulated cuBLAS (``_gemm_ex``) reads through."""
        return types.SimpleNamespace(ptr=self.host_view.ctypes.data)

    def get(self, out: np.ndarray | None = None) -> np.ndarray:
        """A host copy, or the copy into ``out`` (``cupy.ndarray.get(out=...)``: a NumPy array
        of the same dtype and shape, C-contiguous as this one is)."""
        if out is not None:
            if not isinstance(out, np.ndarray):
                raise TypeError(f"get(out=) takes a NumPy array, got {type(out).__name__}")
            if out.dtype != self.host_view.dtype:
                raise TypeError(f"{out.dtype} array cannot be obtained from "
                                f"{self.host_view.dtype} array")
            if out.shape != self.host_view.shape:
                raise ValueError(f"get(out=) of shape {out.shape} from {self.host_view.shape}")
            if not (out.flags.c_contiguous and self.host_view.flags.c_contiguous):
                raise RuntimeError("get(out=) between arrays that are not both C-contiguous")
        _operation("copy device->host")
        if out is None:
            return self.host_view.copy()
        out[...] = self.host_view
        return out

    def set(self, array: np.ndarray, stream: _Stream | None = None) -> None:
        """Copy a host array of the same dtype and shape in (``cupy.ndarray.set``), on
        ``stream`` (default: the current one); see ``_Stream.run_later``."""
        if not isinstance(array, np.ndarray):
            raise TypeError(f"set() takes a NumPy array, got {type(array).__name__}")
        if array.dtype != self.host_view.dtype or array.shape != self.host_view.shape:
            raise ValueError(f"set() of {array.dtype} {array.shape} into "
                             f"{self.host_view.dtype} {self.host_view.shape}")
        if not self.host_view.flags.c_contiguous:
            raise RuntimeError("set() into a non-contiguous array")
        _operation("copy host->device")
        _check_within_one_registration(array)
        destination = self.host_view

        def copy() -> None:
            destination[...] = array

        copy.source = (array.__array_interface__["data"][0], array.nbytes)  # type: ignore[attr-defined]
        (stream or _current_stream()).run_later(copy)

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError("Implicit conversion to a NumPy array is not allowed. "
                        "Please use `.get()` to construct a NumPy array explicitly.")

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        outs = kwargs.get("out")
        _operation(f"op {ufunc.__name__}")
        result = getattr(ufunc, method)(*_unwrap(inputs), **_unwrap(kwargs))
        if outs is not None:
            return outs[0] if len(outs) == 1 else outs
        return _wrap(result)

    def __array_function__(self, func: Callable, types: Any, args: Any, kwargs: Any) -> Any:
        unwrapped = _unwrap(args)
        return _wrap(_count_if_new(func.__name__, func(*unwrapped, **_unwrap(kwargs)),
                                   *unwrapped))

    def __getattr__(self, name: str) -> Any:
        # No host_view before __init__ (copy, pickle); no NumPy protocols (__array_interface__
        # would hand NumPy the memory that np.asarray must not reach).
        if name == "host_view" or name.startswith("__"):
            raise AttributeError(name)
        value = getattr(self.host_view, name)
        if callable(value):
            return lambda *args, **kwargs: _wrap(_count_if_new(
                name, value(*_unwrap(args), **_unwrap(kwargs)), self.host_view))
        return _wrap(value) if isinstance(value, np.ndarray) else value

    def __getitem__(self, key: Any) -> Any:
        return _wrap(_count_if_new("gather", self.host_view[_unwrap(key, host_allowed=True)],
                                   self.host_view))

    def __setitem__(self, key: Any, value: Any) -> None:
        _operation("op setitem")
        self.host_view[_unwrap(key, host_allowed=True)] = _unwrap(value, host_allowed=True)

    def __len__(self) -> int:
        return len(self.host_view)

    def __iter__(self):
        return (_wrap(row) for row in self.host_view)

    def __bool__(self) -> bool:
        return bool(self.host_view)

    def __float__(self) -> float:
        return float(self.host_view)

    def __int__(self) -> int:
        return int(self.host_view)

    def __index__(self) -> int:
        return self.host_view.__index__()

    def __repr__(self) -> str:
        return f"DeviceArray({self.host_view!r})"


# --------------------------------------------------------------------------- kernels
class EmulatedKernel:
    """``cupy.RawKernel`` as ``RawModule.get_function`` gives it: call with (grid, block,
    args, shared_mem=...)."""

    def __init__(self, library: ctypes.CDLL, name: str) -> None:
        self.name = name
        signature = getattr(library, f"emu_signature_{name}")
        signature.restype = ctypes.c_char_p
        self.signature = signature().decode()
        if "?" in self.signature:
            raise NotImplementedError(f"{name}: a parameter type the emulator does not pass")
        self.max_threads = getattr(library, f"emu_max_threads_{name}")()
        self._launch = getattr(library, f"emu_launch_{name}")
        self._launch.argtypes = [ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_size_t,
                                 ctypes.POINTER(ctypes.c_void_p)]
        self._max_dynamic_shared = DEFAULT_SHARED_BYTES

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        return self._max_dynamic_shared

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, size: int) -> None:
        if not 0 <= size <= HOPPER_SHARED_BYTES:
            raise ValueError(f"{self.name}: cannot opt into {size} bytes of shared memory")
        self._max_dynamic_shared = int(size)

    def __call__(self, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0) -> None:
        grid_x, grid_y, grid_z = (*grid, 1, 1)[:3]
        block_x, block_y, block_z = (*block, 1, 1)[:3]
        if (grid_z, block_y, block_z) != (1, 1, 1):
            raise NotImplementedError("the emulator launches 1-D blocks on 2-D grids")
        if not 1 <= block_x <= self.max_threads:
            raise ValueError(f"{self.name}: {block_x} threads a block, __launch_bounds__ "
                             f"allows {self.max_threads}")
        if not (1 <= grid_x < 2**31 and 1 <= grid_y <= 65535):
            raise ValueError(f"{self.name}: grid {grid} out of range")
        if shared_mem > self._max_dynamic_shared:
            raise ValueError(f"{self.name}: {shared_mem} bytes of dynamic shared memory, "
                             f"{self._max_dynamic_shared} allowed (opt in beyond 48 KB)")
        holders = self._arguments(args)
        capture = _capturing_stream()
        if capture is not None:  # the arrays are kept with the launch, as a graph keeps them
            capture.launches.append((self, (grid_x, grid_y, block_x, shared_mem, holders,
                                            args)))
            return
        OPERATIONS[f"kernel {self.name}"] += 1
        self.run(grid_x, grid_y, block_x, shared_mem, holders, args)

    def run(self, grid_x: int, grid_y: int, block_x: int, shared_mem: int, holders: list[Any],
            args: tuple) -> None:
        """Run the launch (``args`` only keeps its arrays alive)."""
        pointers = (ctypes.c_void_p * max(len(holders), 1))(
            *(ctypes.addressof(h) for h in holders))
        with _LAUNCH_LOCK:
            failed = self._launch(grid_x, grid_y, block_x, shared_mem, pointers)
        if failed:
            raise RuntimeError(f"{self.name}: lanes of a warp left the lockstep")

    def _arguments(self, args: tuple) -> list[Any]:
        """Each argument as the C value the kernel's parameter takes, or an error."""
        if len(args) != len(self.signature):
            raise TypeError(f"{self.name} takes {len(self.signature)} arguments, "
                            f"got {len(args)}")
        holders = []
        for i, (code, value) in enumerate(zip(self.signature, args, strict=True)):
            where = f"{self.name} argument {i}"
            if code in _POINTER_DTYPES and value is None:  # CuPy passes None as a null pointer
                holders.append(ctypes.c_void_p(None))
            elif code in _POINTER_DTYPES:
                if not isinstance(value, DeviceArray):
                    raise TypeError(f"{where}: a device array, got {type(value).__name__}")
                array = value.host_view
                if array.dtype != _POINTER_DTYPES[code]:
                    raise TypeError(f"{where}: {np.dtype(_POINTER_DTYPES[code]).name} "
                                    f"elements, got {array.dtype}")
                if not array.flags.c_contiguous:
                    raise TypeError(f"{where}: not C-contiguous")
                holders.append(ctypes.c_void_p(array.ctypes.data))
            else:
                scalar_type, c_type = _SCALAR_TYPES[code]
                if type(value) is not scalar_type:
                    raise TypeError(f"{where}: {scalar_type.__name__}, got "
                                    f"{type(value).__name__}")
                holders.append(c_type(value.item()))
        return holders


class RawModule:
    """``cupy.RawModule(code=..., options=...)``, built with g++."""

    def __init__(self, code: str, options: tuple[str, ...] = ()) -> None:
        defines = []
        for option in options:
            if option.startswith("-D"):
                defines.append(option)
            elif option != "--fmad=false":  # g++ runs with -ffp-contract=off anyway
                raise NotImplementedError(f"compile option {option!r}")
        self._library, self._kernels = compile_module(code, tuple(defines))

    def get_function(self, name: str) -> EmulatedKernel:
        if name not in self._kernels:
            raise KeyError(f"no kernel {name!r} in the module")
        return EmulatedKernel(self._library, name)


# --------------------------------------------------------------------------- the module
_HOST_INPUTS = {"asarray", "array"}  # host -> device copies
_ALLOCATIONS = {"empty", "empty_like"}  # memory from the pool, no launch


class EmulatedCupy(types.ModuleType):
    """A ``cupy`` module: NumPy's functions on device arrays, ``RawModule``, ``cuda``."""

    ndarray = DeviceArray
    RawModule = RawModule
    operations = OPERATIONS

    def __init__(self) -> None:
        super().__init__("cupy", "CuPy on the CPU for tests (tests/gln/emulated_cupy.py)")
        runtime = types.SimpleNamespace(
            getDeviceCount=lambda: 1,
            getDeviceProperties=lambda device_id: {"name": b"emulated (CPU)"},
            cudaDevAttrMaxSharedMemoryPerBlockOptin=MAX_SHARED_OPTIN_ATTRIBUTE,
            deviceGetAttribute=_device_attribute,
            profilerStart=lambda: _operation("profiler start"),
            profilerStop=lambda: _operation("profiler stop"),
            hostRegister=_host_register,
            hostUnregister=_host_unregister,
            # (free, total) bytes: the device's memory is the host's here.
            memGetInfo=lambda: _host_memory_info(),
            CUDARuntimeError=CUDARuntimeError,
        )
        self.cuda = types.SimpleNamespace(runtime=runtime, Device=_Device, Event=_Event,
                                          get_elapsed_time=_Event.elapsed_ms, Stream=_Stream,
                                          get_current_stream=_current_stream,
                                          MemoryPool=_MemoryPool,
                                          using_allocator=_using_allocator,
                                          alloc_pinned_memory=_alloc_pinned_memory,
                                          cublas=types.SimpleNamespace(gemmEx=_gemm_ex),
                                          device=types.SimpleNamespace(
                                              get_cublas_handle=lambda: 0))

    def __getattr__(self, name: str) -> Any:
        value = getattr(np, name)
        if isinstance(value, types.ModuleType):
            raise AttributeError(f"the emulated cupy has no {name}")
        if isinstance(value, type) or not callable(value):
            return value  # dtypes and constants are NumPy's in CuPy too
        return functools.partial(_device_function, value, name in _HOST_INPUTS)


def _device_function(function: Callable, host_allowed: bool, *args: Any, **kwargs: Any) -> Any:
    if host_allowed and any(isinstance(a, np.ndarray) for a in args):
        _operation("copy host->device")  # a copy, as a transfer is
        args = tuple(np.array(a, copy=True) if isinstance(a, np.ndarray) else a for a in args)
        return _wrap(function(*args, **_unwrap(kwargs, host_allowed)))
    unwrapped = _unwrap(args, host_allowed)
    if function.__name__ in _ALLOCATIONS:
        _check_capture_allocation(function.__name__)
    result = function(*unwrapped, **_unwrap(kwargs, host_allowed))
    if function.__name__ not in _ALLOCATIONS:
        _count_if_new(function.__name__, result, *unwrapped)
    return _wrap(result)


# cuBLAS's gemmEx as BLAS defines it (column-major, by address), for the types the library
# asks for: int8 operands, int32 results and sums (exact), alpha and beta int32 on the host.
_COMPUTE_32I = 72


def _gemm_ex(handle: int, transa: int, transb: int, m: int, n: int, k: int, alpha: int,
             a: int, atype: int, lda: int, b: int, btype: int, ldb: int, beta: int, c: int,
             ctype: int, ldc: int, compute: int, algo: int) -> None:
    if (atype, btype, ctype, compute) != (3, 3, 10, _COMPUTE_32I):
        raise NotImplementedError(f"gemmEx of types {(atype, btype, ctype, compute)}")
    if transa not in (0, 1) or transb not in (0, 1) or min(lda, ldb, ldc) < 1:
        raise ValueError("gemmEx: operations N or T and positive leading dimensions")
    _operation("cublas gemmEx")

    def matrix(address: int, rows: int, columns: int, lead: int, kind: Any) -> np.ndarray:
        # Only the bytes BLAS reads: the last column ends `rows` elements after its start.
        if lead < rows:
            raise ValueError(f"gemmEx: leading dimension {lead} below {rows} rows")
        extent = lead * (columns - 1) + rows if columns else 0
        flat = np.ctypeslib.as_array((kind * extent).from_address(address))
        size = np.dtype(kind).itemsize
        return np.lib.stride_tricks.as_strided(flat, (rows, columns), (size, lead * size))

    op_a = matrix(a, k, m, lda, ctypes.c_int8).T if transa else matrix(a, m, k, lda, ctypes.c_int8)
    op_b = matrix(b, n, k, ldb, ctypes.c_int8).T if transb else matrix(b, k, n, ldb, ctypes.c_int8)
    scalars = [int(np.ctypeslib.as_array((ctypes.c_int32 * 1).from_address(p))[0])
               for p in (alpha, beta)]
    target = matrix(c, m, n, ldc, ctypes.c_int32)
    # In float64, through BLAS (NumPy's integer products have none): exact, since every sum of
    # int8 products stays far below 2^53.
    product = (op_a.astype(np.float64) @ op_b.astype(np.float64)).astype(np.int64)
    total = scalars[0] * product
    target[...] = (total + scalars[1] * target.astype(np.int64)).astype(np.int32)


def _device_attribute(attribute: int, device_id: int) -> int:
    if attribute != MAX_SHARED_OPTIN_ATTRIBUTE or device_id != 0:
        raise NotImplementedError(f"device attribute {attribute} of device {device_id}")
    return HOPPER_SHARED_BYTES


def forget_compiled_kernels() -> None:
    """Drop what ``gln.kernels.cuda`` and ``gln.kernels.cuda_modules`` cached from the CuPy
    they last saw: modules, kernels and device limits (call when ``cupy`` changes between the
    emulation and a real one)."""
    from gln.kernels import cuda, cuda_modules  # noqa: PLC0415

    for module in (cuda, cuda_modules):
        for value in vars(module).values():
            if hasattr(value, "cache_clear"):
                value.cache_clear()
    cuda._shared_limit_set.clear()


@contextlib.contextmanager
def emulated_cupy_installed() -> Iterator[EmulatedCupy]:
    """``import cupy`` gives the emulation inside the block, whatever it gave before."""
    previous = sys.modules.get("cupy")
    module = EmulatedCupy()
    OPERATIONS.clear()
    sys.modules["cupy"] = module
    forget_compiled_kernels()
    try:
        yield module
    finally:
        if previous is None:
            del sys.modules["cupy"]
        else:
            sys.modules["cupy"] = previous
        forget_compiled_kernels()


def _host_memory_info() -> tuple[int, int]:
    """cudaMemGetInfo's (free, total) for the emulated device, whose memory is the host's."""
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return free, pages
