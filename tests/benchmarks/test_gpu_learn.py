"""The GPU benchmark end to end on the emulated device, so that a GPU session does not find it
broken: every headline figure, at the smallest sizes (timings meaningless)."""

import json

import pytest

from benchmarks.gpu_learn import main
from tests.gln.emulated_cupy import GXX, emulated_cupy_installed

SUMMARY = {"learn_examples_per_second", "prequential_accuracy",
           "predict_float32_rows_per_second", "predict_page_locked_rows_per_second",
           "predict_uint8_rows_per_second", "learn_latency_median_us", "learn_latency_p99_us",
           "predict_latency_median_us", "predict_latency_p99_us",
           "plain_cupy_learn_examples_per_second", "plain_cupy_predict_rows_per_second",
           "plain_cupy_learn_latency_median_us"}


@pytest.mark.skipif(GXX is None, reason="the emulated device needs g++ on PATH")
def test_the_script_prints_every_headline_figure_on_the_emulated_device(capsys, small_network):
    with emulated_cupy_installed():
        summary = main(["--examples", "8", "--plain-examples", "4", "--chunk", "4",
                        "--rounds", "1", "--latency-calls", "2", "--plain-latency-calls", "1"])
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["device"] for r in records} == {"emulated (CPU)"}
    assert records[-1] == {"benchmark": "gpu_learn", "device": "emulated (CPU)",
                           "measure": "summary", "data": "random", "call_rows": 4, **summary}
    assert set(summary) == SUMMARY
    assert all(value > 0 for key, value in summary.items() if key != "prequential_accuracy")
    assert 0 <= summary["prequential_accuracy"] <= 1
    predictions = {r["rows"]: r for r in records
                   if r["measure"] == "predict" and r["implementation"] == "kernels"}
    assert set(predictions) == {"float32", "page_locked", "uint8"}
    assert predictions["uint8"]["same_outputs_as_float32"]
    (agreement,) = [r for r in records if r["measure"] == "agreement"]
    assert agreement["rows"] == 4 and agreement["agree"]
