"""The CPU kernels' one-thread twins compute what their parallel kernels compute, bit for bit."""

import threading

import numpy as np
import pytest

from gln.gating import dot_rounding_bound, sample_halfspaces
from gln.kernels import cpu
from gln.kernels.cpu_int16_gating import _int16_contexts, _quantize, context_layout, int16_normals
from tests.gln.layer_data import random_layer


@pytest.mark.parametrize("learn", [True, False], ids=["learn", "predict"])
@pytest.mark.parametrize(("glns", "neurons", "inputs", "n", "shared"), [
    (1, 8, 7, 1, True),
    (1, 13, 41, 5, True),  # three blocks of four neurons and one alone; vector remainders
    (3, 6, 9, 20, False),
    (10, 128, 785, 3, True),  # an MNIST-sized first layer
    (10, 32, 129, 64, False),
])
def test_the_layer_pass_twins_give_the_same_bytes(learn, glns, neurons, inputs, n, shared):
    rng = np.random.default_rng(inputs)
    w, ctx, x, targets, rates = random_layer(rng, glns, neurons, 16, inputs, n, shared)
    results = []
    for kernel in cpu._layer_pass.dispatchers:
        weights, probs = w.copy(), np.empty((n, glns, neurons), np.float32)
        kernel(weights, ctx, x, targets, rates, 0.01, 5.0, learn, probs)
        results.append((weights.tobytes(), probs.tobytes()))
    assert results[0] == results[1]


@pytest.mark.parametrize(("neurons", "m", "dim", "n"), [(13, 3, 6, 1), (40, 3, 30, 5),
                                                    (160, 4, 784, 3)])
def test_the_16_bit_kernels_twins_give_the_same_bytes(neurons, m, dim, n):
    rng = np.random.default_rng(neurons)
    planes = neurons * m
    normals, offsets = sample_halfspaces(rng, planes, dim, 1.0)
    z = rng.normal(size=(n, dim)).astype(np.float32)
    offsets[::7] = z[0] @ normals[::7].T  # close margins: re-checked
    copy = int16_normals(normals)
    slack = 1.0 + 4.0 * (dim + 2) * 2.0**-53
    layout = context_layout(1, [neurons])
    results = []
    for quantize, contexts in zip(_quantize.dispatchers, _int16_contexts.dispatchers,
                                  strict=True):
        values, scales = np.empty_like(copy.values), np.empty_like(copy.scales)
        residuals, norms = np.empty_like(copy.norms), np.empty_like(copy.norms)
        quantize(normals, slack, values, scales, residuals, norms)
        out = np.empty(n * neurons, np.int32)
        assert contexts(z, values, scales, residuals, norms, normals, offsets,
                        dot_rounding_bound(dim), m, layout, out)
        results.append(b"".join(a.tobytes() for a in (values, scales, residuals, norms, out)))
    assert results[0] == results[1]


def test_the_twin_runs_by_the_size_of_the_work(monkeypatch):
    """Below ``PARALLEL_MIN_WORK`` a call runs the one-thread twin, from there the parallel one;
    the threshold is read at each call."""
    ran = []
    kernel = cpu.ThreadedKernel(lambda a: None)
    monkeypatch.setattr(kernel, "parallel", lambda a: ran.append("parallel"))
    monkeypatch.setattr(kernel, "one_thread", lambda a: ran.append("one_thread"))
    kernel(cpu.PARALLEL_MIN_WORK - 1, None)
    kernel(cpu.PARALLEL_MIN_WORK, None)
    monkeypatch.setattr(cpu, "PARALLEL_MIN_WORK", 0)
    kernel(0, None)
    assert ran == ["one_thread", "parallel", "parallel"]


@pytest.mark.parametrize("agree", [True, False])
def test_a_small_layer_pass_runs_the_twin_only_where_the_twins_agree(monkeypatch, agree):
    """Where the one-thread twin's bits differ from the parallel kernel's on this CPU, every
    call runs the parallel kernel, so the bytes never depend on a call's size."""
    ran = []
    monkeypatch.setattr(cpu, "layer_pass_twins_agree", lambda: agree)
    monkeypatch.setattr(cpu._layer_pass, "parallel", lambda *a: ran.append("parallel"))
    monkeypatch.setattr(cpu._layer_pass, "one_thread", lambda *a: ran.append("one_thread"))
    rng = np.random.default_rng(1)
    w, ctx, x, targets, rates = random_layer(rng, 1, 8, 16, 7, 1, True)
    probs = np.empty((1, 1, 8), np.float32)
    cpu.cpu_layer_pass(w, ctx, x, targets, rates, 0.01, 5.0, True, probs)
    assert ran == ["one_thread" if agree else "parallel"]


def test_the_twins_agreement_is_checked_on_both_kernels_once(monkeypatch):
    """The check runs both compiled kernels on the same layer and compares every byte they
    write: a twin that changes one weight's last bit is caught."""
    cpu.layer_pass_twins_agree.cache_clear()
    real = cpu._layer_pass.one_thread

    def off_by_one_bit(weights, *args):
        real(weights, *args)
        weights.view(np.uint32)[0, 0, 0, 0] ^= 1

    monkeypatch.setattr(cpu._layer_pass, "one_thread", off_by_one_bit)
    try:
        assert cpu._layer_pass.dispatchers[1] is off_by_one_bit
        assert not cpu.layer_pass_twins_agree()
        monkeypatch.setattr(cpu._layer_pass, "one_thread", real)
        cpu.layer_pass_twins_agree.cache_clear()
        assert cpu.layer_pass_twins_agree()  # as the twins' byte tests above hold them here
    finally:
        cpu.layer_pass_twins_agree.cache_clear()


def test_only_a_parallel_call_takes_the_kernel_lock(monkeypatch):
    """Numba's threading layer takes one caller at a time, so a parallel call holds the lock;
    a one-thread call never enters that layer and runs while another thread holds it (two
    models' small calls on a server then run side by side)."""
    held = []
    monkeypatch.setattr(cpu._layer_pass, "parallel", lambda *a: held.append(cpu._LOCK.locked()))
    rng = np.random.default_rng(2)
    w, ctx, x, targets, rates = random_layer(rng, 1, 8, 16, 7, 1, True)
    probs = np.empty((1, 1, 8), np.float32)
    cpu._layer_pass(cpu.PARALLEL_MIN_WORK, w, ctx, x, targets, rates, 0.01, 5.0, True, probs)
    assert held == [True]
    done = threading.Event()

    def small_call():
        cpu._layer_pass(0, w, ctx, x, targets, rates, 0.01, 5.0, True, probs)
        done.set()

    with cpu._LOCK:  # as a parallel call of another model would hold it
        worker = threading.Thread(target=small_call, daemon=True)
        worker.start()
        assert done.wait(timeout=30), "a one-thread call waited for the kernel lock"
    assert np.all((probs > 0) & (probs < 1))
