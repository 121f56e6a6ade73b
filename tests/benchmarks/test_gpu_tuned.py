"""The tuned-headline benchmark changes exactly the recommended constants that differ from the
library's, only while it measures, and runs end to end on the emulated device."""

import json

import pytest

import gln.kernels.cuda as cuda
import gln.kernels.uploads as uploads
import gln.staging as staging
from benchmarks.gpu_tuned import changes, constants_set, main
from tests.gln.emulated_cupy import GXX, emulated_cupy_installed


def test_only_recommendations_that_differ_from_the_library_are_changes():
    recommended = {"GATING_PRODUCT": "int8" if cuda.GATING_PRODUCT != "int8" else "float32",
                   "ROW_ORDER": cuda.ROW_ORDER,  # the same: no change
                   "RESIDENT_MIN_ROWS": None,  # not measured: no change
                   "current": {"GATING_PRODUCT": cuda.GATING_PRODUCT}}  # not a constant
    assert changes(recommended) == {"GATING_PRODUCT": recommended["GATING_PRODUCT"]}


def test_the_constants_are_set_in_their_module_and_restored_even_after_an_error():
    before = (cuda.ROW_WARPS_MIN_ROWS, uploads.STAGE_AHEAD)
    with pytest.raises(RuntimeError), constants_set(
            {"ROW_WARPS_MIN_ROWS": 7, "STAGE_AHEAD": not before[1]}):
        assert (cuda.ROW_WARPS_MIN_ROWS, uploads.STAGE_AHEAD) == (7, not before[1])
        raise RuntimeError
    assert (cuda.ROW_WARPS_MIN_ROWS, uploads.STAGE_AHEAD) == before


@pytest.mark.skipif(GXX is None, reason="the emulated device needs g++ on PATH")
def test_the_recommended_constants_are_measured_beside_the_librarys(
        tmp_path, capsys, monkeypatch, small_network, shared_launch_defines):
    monkeypatch.delenv("GLN_DATA_DIR", raising=False)
    monkeypatch.setattr(cuda, "GATING_PRODUCT", "float32")
    monkeypatch.setattr(cuda, "GATING_GEMM_MIN_ROWS", 2)  # the int8 GEMMs from 2 rows
    monkeypatch.setattr(cuda, "INT8_GATING_MIN_ROWS", 2)
    monkeypatch.setattr(staging, "PREDICT_CHUNK_ROWS_GPU", 4)  # 8-row calls: two chunks each
    monkeypatch.setattr(staging, "HOST_WIDENED_ROWS", 2)
    monkeypatch.setattr(cuda, "PREDICT_SHARED_MIN_ROWS", 1)  # 4-row chunks: the shared kernel
    # The library's shared-kernel settings as this test takes them: the source's sum batch, 32
    # warps a block on the first layer (25 a lane), the others' examples in pairs (1 a lane).
    monkeypatch.setattr(cuda, "PREDICT_SUM_BATCH", None)
    monkeypatch.setattr(cuda, "PREDICT_WARPS", 32)
    monkeypatch.setattr(cuda, "PREDICT_EXAMPLE_GROUP", 2)
    wanted = {"GATING_PRODUCT": "int8", "ROW_WARPS_MIN_ROWS": 1, "PREDICT_SUM_BATCH": 8,
              "PREDICT_WARPS": 24, "PREDICT_EXAMPLE_GROUP": 4}
    constants = tmp_path / "constants.json"
    constants.write_text(json.dumps({"benchmark": "gpu_constants", "ROW_ORDER": None, **wanted,
                                     "current": {}}) + "\n")
    shared_defines = shared_launch_defines
    with emulated_cupy_installed() as cp:
        main([str(constants), "--rows", "48", "--chunk", "8", "--rounds", "1"])
        used = dict(cp.operations)
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["measure"], r["constants"]) for r in records] == [
        ("learn_tuned", "library"), ("learn_tuned", "recommended"),
        ("predict_tuned", "library"), ("predict_tuned", "recommended")]
    assert all(r["changed"] == wanted and r["same_outputs_and_bytes"]
               and r["examples_per_second"] > 0 for r in records)
    # The recommended model ran what the values select: int8 GEMMs, the row kernel and the
    # shared kernel's settings, none of which the library's values take here.
    assert used["cublas gemmEx"] > 0 and used["kernel gln_layer_pass_rows"] > 0
    assert shared_defines == {
        ("-DGLN_PREDICT_WARPS=32", "-DGLN_PREFETCH=0"), ("-DGLN_EXAMPLE_GROUP=2",),  # library's
        ("-DGLN_SUM_BATCH=8", "-DGLN_PREDICT_WARPS=24", "-DGLN_PREFETCH=0"),  # first layer's
        ("-DGLN_SUM_BATCH=8", "-DGLN_EXAMPLE_GROUP=4")}  # the others'
    assert (cuda.GATING_PRODUCT, cuda.PREDICT_SUM_BATCH, cuda.PREDICT_WARPS,
            cuda.PREDICT_EXAMPLE_GROUP) == ("float32", None, 32, 2)


def test_nothing_to_change_is_said_and_nothing_measured(tmp_path, capsys):
    constants = tmp_path / "constants.json"
    constants.write_text(json.dumps({"GATING_PRODUCT": cuda.GATING_PRODUCT}) + "\n")
    with emulated_cupy_installed():
        main([str(constants)])
    (record,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert record["measure"] == "tuned" and record["changed"] == {}
