"""The TF32 gating experiment runs end to end on the emulated device (TF32 products emulated by
rounding the operands to TF32 and multiplying in float32), so that a GPU session does not find
it broken, and its measures order the products as their precision does."""

import json

import numpy as np
import pytest

import benchmarks.gpu_gating_tf32 as experiment
from tests.gln.emulated_cupy import GXX, emulated_cupy_installed

pytestmark = pytest.mark.skipif(GXX is None, reason="the emulated device needs g++ on PATH")


def test_the_split_parts_are_tf32_values_that_add_up_to_nearly_the_operand():
    with emulated_cupy_installed() as cp:
        a = cp.asarray(np.random.default_rng(0).standard_normal((3, 40)).astype(np.float32))
        high = experiment.tf32_part(cp, a)
        low = experiment.tf32_part(cp, a - high)
        for part in (high, low):
            assert ((part.view(cp.uint32) & np.uint32(0x1FFF)) == 0).all().get()
        residual = cp.abs(a - high - low) / cp.abs(a)
        assert 0 < float(residual.max()) <= 2.0 ** -20  # 24 bits kept of 24, less two at most


def test_the_script_runs_end_to_end_on_the_emulated_device(capsys, small_network):
    experiment.main(["--emulated", "--rows", "48", "--repeats", "1", "--path-rows", "16,48,64"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    by_rows = {r["rows"]: r for r in lines if r["measure"] == "gating_paths"}
    assert sorted(by_rows) == [16, 48]  # 64 is more rows than were served
    paths = by_rows[48]
    records = {r["product"]: r for r in lines if r["measure"] == "gating_product"}
    assert set(records) == {"float32", "tf32", "tf32x3", "int8_2slices", "int8_3slices"}
    assert {r["device"] for r in records.values()} == {"emulated (CPU)"}
    errors = {name: r["max_error_in_bounds"] for name, r in records.items()}
    assert errors["float32"] < 1 < errors["tf32"] and errors["tf32x3"] < errors["tf32"]
    for record in records.values():
        shares = [b["rechecked_share"] for b in record["by_bound_multiple"]]
        assert shares == sorted(shares) and 0 <= shares[0] and shares[-1] <= 1
        assert record["device_us"] > 0
    assert all(b["wrong_outside"] == 0 for b in records["float32"]["by_bound_multiple"])
    own = {name: records[name]["own_bound"] for name in ("int8_2slices", "int8_3slices")}
    rows = {name: records[name]["own_row_bound"] for name in own}
    for bound in [*own.values(), *rows.values()]:  # the proved bounds hold, and decide alike
        assert bound["max_error_in_own_bounds"] <= 1 and bound["wrong_outside"] == 0
    assert all(rows[name]["rechecked_share"] >= own[name]["rechecked_share"] for name in own)
    # The library's paths: the same decisions outside their bounds, int8's the tighter bound.
    assert {"float32", "int8"} <= set(paths)
    assert all(paths[name]["wrong_outside"] == 0 and paths[name]["device_us"] > 0
               for name in ("float32", "int8"))
    assert paths["int8"]["median_bound_in_float32_bounds"] < 1
    assert paths["int8"]["rechecked_share"] <= paths["float32"]["rechecked_share"]
    assert own["int8_3slices"]["median_in_library_bounds"] < 1  # tighter than float32's
    assert own["int8_3slices"]["rechecked_share"] <= own["int8_2slices"]["rechecked_share"]
