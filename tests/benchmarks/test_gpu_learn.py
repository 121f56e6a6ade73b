"""The GPU benchmark: its latency profile on the CPU model (the profiling is device-blind), and
the whole script on the emulated device, so that a GPU session does not find it broken."""

import contextlib
import json
import time
from collections.abc import Iterator

import numpy as np
import pytest

import benchmarks.gpu_learn
import gln.kernels.cuda
import gln.model
import gln.staging
from benchmarks.gpu_learn import (
    NETWORK,
    call_profile,
    first_chunk_rows,
    latency_profile,
    layer_shapes,
    main,
)
from gln import GLN
from gln.kernels import uploads
from tests.gln.emulated_cupy import GXX, emulated_cupy_installed


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


def test_the_layer_passes_timed_are_the_mnist_networks_layers():
    """(name, networks, neurons, inputs with the bias, groups of inputs) of each layer."""
    assert layer_shapes(NETWORK) == [("784->128", 10, 128, 785, 1), ("128->128", 10, 128, 129, 10),
                                     ("128->1", 10, 1, 129, 10)]


@pytest.mark.skipif(GXX is None, reason="the emulated device needs g++ on PATH")
def test_the_script_runs_end_to_end_on_the_emulated_device(capsys, monkeypatch, small_network):
    """Every kind of record, for the MNIST network at small layers, at the smallest sizes
    (timings meaningless)."""
    monkeypatch.setattr(gln.staging, "PREDICT_CHUNK_ROWS_GPU", 1)  # the layer rows timed
    # The gating GEMMs (int8 among them) from 2 rows, and only one-row calls captured (the
    # emulated device captures kernel launches alone).
    monkeypatch.setattr(gln.kernels.cuda, "GATING_GEMM_MIN_ROWS", 2)
    monkeypatch.setattr(gln.model, "REPLAY_MAX_ROWS", 1)
    # The probe's process has no emulated device: sending while staging works in this one.
    monkeypatch.setattr(benchmarks.gpu_learn, "sending_while_staging_works", lambda: (True, ""))
    with emulated_cupy_installed():
        main(["--examples", "6", "--plain-examples", "2", "--chunk", "4", "--latency-calls", "3",
              "--plain-latency-calls", "1", "--profile-calls", "1", "--layer-rows", "1",
              "--predict-rows-per-warp", "8", "--predict-rows-per-block", "8", "--repeats", "1",
              "--pygln-examples", "0", "--predict-chunk-rows", "2", "--staging", "1x1,2x3",
              "--first-chunk-rows", "3", "--upload-rounds", "1",
              "--predict-neurons-per-block", "1,32", "--predict-sum-batch", "1,32",
              "--gating-rounds", "1", "--kernel-rounds", "1", "--dtype-rounds", "1",
              "--wide-rows", "2", "--gating-rows", "1,3", "--gating-calls", "2"])
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["device"] for r in records} == {"emulated (CPU)"}
    # The shared kernel's warps and example groups are gpu_shared_grid.py's to time.
    assert not {"shared_layout", "predict_by_shared_layout"} & {r["measure"] for r in records}
    kinds = [(r["measure"], r.get("implementation")) for r in records]
    for kind in [("learn", "kernels"), ("predict", "kernels"), ("learn_latency", "kernels"),
                 ("learn_latency", "kernels_uncaptured"), ("predict_latency", "kernels"),
                 ("predict_latency", "kernels_uncaptured"),
                 ("learn_latency_profile", "kernels"), ("learn", "plain_cupy"),
                 ("predict", "plain_cupy"), ("agreement", None),
                 ("predict_by_chunk_rows", "kernels")]:
        assert kind in kinds
    by_gating = {(r["measure"], r["gating_product"]): r for r in records
                 if r["measure"].endswith("_by_gating")}
    assert set(by_gating) == {(f"{verb}_by_gating", product) for verb in ("learn", "predict")
                              for product in ("float32", "int8")}
    assert all(r["same_outputs_as_float32"] and r["examples_per_second"] > 0
               for r in by_gating.values())
    (probe,) = [r for r in records if r["measure"] == "page_locking_probe"]
    assert probe["works"] and probe["error"] == ""  # so the page-locked settings are timed
    by_dtype = {(r["dtype"], r["stage_ahead"], r["staging_threads"], r["launch_while_staging"],
                 r["send_registered"]): r
                for r in records if r["measure"] == "predict_by_dtype"}
    library_staging = (uploads.STAGE_AHEAD, uploads.STAGING_THREADS, False, True)
    assert set(by_dtype) == {(dtype, *setting) for dtype in ("uint8", "float32") for setting in (
        *((ahead, threads, behind, False) for ahead in (False, True) for threads in (1, 4)
          for behind in (False, True)), library_staging)}
    assert all(r["same_outputs_as_float32"] and r["examples_per_second"] > 0
               for r in by_dtype.values())
    by_locking = {(r["dtype"], r["unlock_after_return"], r["lock_rest_ahead"]): r
                  for r in records if r["measure"] == "predict_by_locking"}
    assert set(by_locking) == {(dtype, after, ahead) for dtype in ("uint8", "float32")
                               for after in (False, True) for ahead in (False, True)}
    assert all(r["same_outputs_as_float32"] and r["examples_per_second"] > 0
               for r in by_locking.values())
    by_kernel = {(r["kernels"], r["row_order"]): r for r in records
                 if r["measure"] == "learn_by_kernel"}
    assert set(by_kernel) == {("library", None), ("rows", "longest_first"), ("rows", "natural")}
    assert by_kernel[("rows", "natural")]["row_warps_min_rows"] == 1
    assert all(r["same_outputs_and_bytes"] and r["examples_per_second"] > 0
               for r in by_kernel.values())
    (held,) = [r for r in records if r["measure"] == "predict_page_locked"]
    assert held["passes"] == 3 and min(held["lock_ms"], held["unlock_ms"]) >= 0
    assert min(held["examples_per_second"], held["page_locked_examples_per_second"]) > 0
    (by_chunk,) = [r for r in records if r["measure"] == "predict_by_chunk_rows"]
    assert by_chunk["predict_chunk_rows"] == 2 and by_chunk["examples_per_second"] > 0
    by_upload = [(r["uploads"], r["staging_threads"], r["staging_pieces"], r["first_chunk_rows"],
                  r["launch_while_staging"])
                 for r in records if r["measure"] == "predict_by_upload"]
    library = (uploads.STAGING_THREADS, uploads.STAGING_PIECES)
    assert by_upload == [("current_stream", None, None, None, False),
                         ("copy_stream", 1, 1, None, False), ("copy_stream", 2, 3, None, False),
                         ("copy_stream", *library, 3, False),  # then sending while staging:
                         ("copy_stream", *library, None, True), ("copy_stream", *library, 3, True),
                         ("page_locked", *library, None, False)]
    layers = ("784->8", "8->8", "8->1")  # small_network's
    caps = {(r["layer"], r["max_neurons_per_block"]) for r in records
            if r["measure"] == "shared_neurons_per_block" and r["microseconds"] > 0}
    assert caps == {(layer, most) for layer in layers for most in (1, 32)}
    batches = {(r["layer"], r["sum_batch"]) for r in records
               if r["measure"] == "shared_sum_batch" and r["microseconds"] > 0}
    assert batches == {(layer, b) for layer in layers for b in (1, 32)}
    layer_passes = [r for r in records if r["measure"] == "layer_pass"]
    # Three layers x (streaming, resident and row learning, the rows in either order, on
    # uniform and on uneven contexts, streaming and shared prediction on uniform ones) at one
    # row.
    assert len(layer_passes) == 30 and all(r["microseconds"] > 0 for r in layer_passes)
    assert {(r["kernel"], r["learn"], r["row_order"], r["contexts"]) for r in layer_passes} == {
        *((kernel, True, order, drawn)
          for kernel, order in (("streaming", None), ("resident", None),
                                ("rows", "longest_first"), ("rows", "natural"))
          for drawn in ("uniform", "uneven")),
        ("streaming", False, None, "uniform"), ("shared", False, None, "uniform")}
    wide = {(r["kernel"], r["learn"], r["rows"], r["layer"]) for r in records
            if r["measure"] == "wide_kernel" and r["microseconds"] > 0}
    assert wide == {(kernel, learn, 2, "784->8") for kernel in ("streaming", "wide")
                    for learn in (True, False)}
    gating = {(r["rows"], r["path"]): r for r in records if r["measure"] == "gating_path"}
    assert set(gating) == {(n, path) for n in (1, 3) for path in ("kernel", "gemm")}
    assert all(r["same_contexts"] and r["calls"] == 2 and r["microseconds"] > 0
               for r in gating.values())
    (agreement,) = [r for r in records if r["measure"] == "agreement"]
    assert agreement["agree"] and agreement["max_abs_difference"] < 1e-5


@contextlib.contextmanager
def a_model_predicting_in_chunks(monkeypatch, seed: int) -> Iterator[tuple[GLN, np.ndarray,
                                                                           np.ndarray]]:
    """On the emulated device, a model that learned 30 float32 rows, which it predicts in
    chunks of 8 sent through ``ChunkUploads``: the model, the rows, its predictions of them."""
    monkeypatch.setattr(gln.staging, "PREDICT_CHUNK_ROWS_GPU", 8)
    monkeypatch.setattr(gln.staging, "HOST_WIDENED_ROWS", 2)  # every chunk through the uploads
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 1, (30, 6)).astype(np.float32)
    with emulated_cupy_installed():
        model = GLN(num_features=6, num_classes=3, layer_sizes=(4, 1), seed=0, device="cuda")
        model.learn(X, rng.integers(0, 3, 30))
        yield model, X, model.predict_proba(X)


@pytest.mark.skipif(GXX is None, reason="the emulated device needs g++ on PATH")
def test_a_short_first_chunk_changes_the_cut_not_the_predictions(monkeypatch):
    with a_model_predicting_in_chunks(monkeypatch, seed=0) as (model, X, usual):
        sent = []
        send = gln.staging.ChunkUploads.send
        monkeypatch.setattr(gln.staging.ChunkUploads, "send",
                            lambda self, rows: sent.append(len(rows)) or send(self, rows))
        with first_chunk_rows(3):
            np.testing.assert_array_equal(model.predict_proba(X), usual)
            assert sent == [3, 8, 8, 8, 3]
            sent.clear()
            model.predict_proba(X.astype(np.float64))  # float64 rows travel as float32 too
            assert sent == [3, 8, 8, 8, 3]
            sent.clear()
            model.predict_proba((X * 255).astype(np.uint8))  # pixels: chunks as they were
            assert sent == [8, 8, 8, 6]
            sent.clear()
        model.predict_proba(X)
        assert sent == [8, 8, 8, 6]


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_call_profile_ranks_functions_by_their_own_time_per_call():
    """Two helpers, one spinning four times as long, each called twice a call: ranked by own
    time the slower leads, and each is counted twice a call with its time per call."""
    def slow() -> None:
        _spin(0.004)

    def quick() -> None:
        _spin(0.001)

    def call() -> None:
        for _ in range(2):
            slow()
            quick()

    rows = call_profile(call, calls=3, top=50, by="own")
    by_name = {row["function"].rsplit(":", 1)[1]: row for row in rows}
    assert by_name["_spin"]["calls_per_call"] == 4
    assert by_name["slow"]["calls_per_call"] == by_name["quick"]["calls_per_call"] == 2
    assert by_name["slow"]["cumulative_us"] > 3 * by_name["quick"]["cumulative_us"]
    assert by_name["slow"]["cumulative_us"] >= 2 * 4000
    own = [row["own_us"] for row in rows]
    assert own == sorted(own, reverse=True)
    cumulative = call_profile(call, calls=1, top=50)
    assert [row["cumulative_us"] for row in cumulative] == sorted(
        (row["cumulative_us"] for row in cumulative), reverse=True)


def page_locked_calls(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each ``ChunkUploads`` closed from now on had its source page-locked, with
    rows of any length locked where ``SEND_REGISTERED`` is on."""
    monkeypatch.setattr(uploads, "SEND_REGISTERED_MIN_BYTES", 1)
    locked, close = [], uploads.ChunkUploads.close

    def closing(self):
        locked.append(self.registered)
        close(self)

    monkeypatch.setattr(uploads.ChunkUploads, "close", closing)
    return locked


@pytest.mark.skipif(GXX is None, reason="the emulated device needs g++ on PATH")
def test_every_upload_path_predicts_calls_of_several_chunks(monkeypatch):
    """``rates_by_upload`` on calls of several chunks sent as they are (the library's staging
    ahead among them, and sending while staging), each path's predictions the library's."""
    from benchmarks.gpu_learn import CurrentStreamUploads, module_constant, rates_by_upload

    monkeypatch.setattr(uploads, "STAGE_AHEAD", True)
    locked = page_locked_calls(monkeypatch)
    with a_model_predicting_in_chunks(monkeypatch, seed=1) as (model, X, usual):
        records = rates_by_upload(model, X, 30, [(1, 1), (2, 3)], [3], rounds=1,
                                  while_staging=True, page_locked=True)
        with module_constant(gln.staging, "ChunkUploads", CurrentStreamUploads):
            np.testing.assert_array_equal(model.predict_proba(X), usual)
    assert [r["uploads"] for r in records] == ["current_stream", *["copy_stream"] * 5,
                                               "page_locked"]
    assert [r["launch_while_staging"] for r in records] == [False] * 4 + [True] * 2 + [False]
    assert all(r["examples_per_second"] > 0 for r in records)
    assert any(locked)  # the page-locked path's calls were


def test_the_while_staging_probe_reports_a_process_that_cannot_send():
    """Without a GPU (CuPy missing, or no device) the probe's process fails, and the probe
    says so with the process's last word instead of failing the benchmark."""
    try:
        import cupy  # noqa: F401, PLC0415

        pytest.skip("CuPy is installed: the probe may work here")
    except ImportError:
        pass
    works, why = benchmarks.gpu_learn.sending_while_staging_works()
    assert not works and "cupy" in why.lower()


@pytest.mark.skipif(GXX is None, reason="the emulated device needs g++ on PATH")
def test_every_staging_setting_predicts_pixels_in_several_chunks(monkeypatch, small_network):
    """``predict_by_dtype`` on calls of two chunks sent through the uploads, as a GPU run's
    4,096-row calls are (the script's own run above sends one-row chunks, widened): every
    setting, staged ahead, sent while staging or neither, or page-locked where the rows lie,
    predicts the float32 rows' outputs for both dtypes."""
    from benchmarks.gpu_learn import rates_by_dtype

    monkeypatch.setattr(gln.staging, "PREDICT_CHUNK_ROWS_GPU", 4)
    monkeypatch.setattr(gln.staging, "HOST_WIDENED_ROWS", 2)  # every chunk through the uploads
    rng = np.random.default_rng(2)
    X = rng.uniform(0, 1, (16, small_network["num_features"])).astype(np.float32)
    locked = page_locked_calls(monkeypatch)
    with emulated_cupy_installed():
        records = rates_by_dtype(X, rng.integers(0, 10, 16), 8, rounds=1)
    # two dtypes x (staging ahead x threads x sending while staging, and page-locked)
    assert len(records) == 2 * (8 + 1)
    assert all(r["same_outputs_as_float32"] and r["examples_per_second"] > 0 for r in records)
    assert any(locked)  # the page-locked setting's calls were


@pytest.mark.skipif(GXX is None, reason="the emulated device needs g++ on PATH")
def test_the_page_locking_probe_reports_the_drivers_refusal(monkeypatch):
    """The probe locks and unlocks a batch where the driver agrees (the emulated device does),
    and reports the refusal where it does not, so that the benchmark times the setting only
    where it would lock anything."""
    from benchmarks.gpu_learn import page_locking_works

    with emulated_cupy_installed() as cp:
        assert page_locking_works(16, 8) == (True, "")
        assert page_locking_works(16, 8) == (True, "")  # unlocked after the first

        def refusing(address, size, flags):
            raise cp.cuda.runtime.CUDARuntimeError(801)

        monkeypatch.setattr(cp.cuda.runtime, "hostRegister", refusing)
        works, why = page_locking_works(16, 8)
        assert not works and "801" in why
