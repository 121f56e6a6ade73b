"""The staging benchmark runs end to end on the emulated device, so that a GPU session does not
find it broken: every staging setting is sent and timed, every timeline traces the staging
ahead exactly where it is on, and the pieces sent while staging are marked where that is on."""

import json

import pytest

import gln.kernels.uploads
import gln.staging
from benchmarks.gpu_staging import SEND_SETTINGS, TIMELINE_SETTINGS, main
from tests.gln.emulated_cupy import GXX, emulated_cupy_installed

pytestmark = pytest.mark.skipif(GXX is None, reason="the emulated device needs g++ on PATH")


def test_the_script_runs_end_to_end_on_the_emulated_device(capsys, small_network, monkeypatch):
    monkeypatch.setattr(gln.staging, "PREDICT_CHUNK_ROWS_GPU", 8)  # the copy stream's way
    monkeypatch.setattr(gln.staging, "HOST_WIDENED_ROWS", 4)
    monkeypatch.setattr(gln.kernels.uploads, "SEND_REGISTERED_MIN_BYTES", 1)  # small rows too
    with emulated_cupy_installed():
        main(["--rows", "24", "--send-rows", "8", "--calls", "2", "--examples", "72"])
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    sends = [r for r in records if r["measure"] == "send_parts"]
    assert [(r["staging_threads"], r["staging_pieces"], r["staging_bytes_per_thread"])
            for r in sends] == list(SEND_SETTINGS)
    for record in sends:
        assert record["chunks"] == 9
        parts = record["median_us"]
        assert 0 < parts["staging"] and 0 < parts["send"] <= parts["until_copied"]
    timelines = [r for r in records if r["measure"] == "timeline_by_staging"]
    assert [(r["staging_threads"], r["stage_ahead"], r["launch_while_staging"],
             r["send_registered"], r["lock_rest_ahead"]) for r in timelines] == list(
        TIMELINE_SETTINGS)
    assert all(r["unlock_after_return"] == r["lock_rest_ahead"] for r in timelines)
    for record in timelines:
        assert len(record["call_us"]) == len(record["first_send_us"]) == 2
        names = [s["stage"] for s in record["median_call"]["stages"]]
        assert names.count("_sent") == 3  # 24 rows in chunks of 8
        # traced where on, and returning at once for page-locked rows
        assert names.count("stage_ahead") == (2 if record["stage_ahead"] else 0)
        assert min(record["call_us"]) <= record["median_call"]["call_us"] <= max(
            record["call_us"])
        if record["launch_while_staging"]:  # each chunk's one piece, or the first's
            marks = record["marks"]
            assert marks["pieces"] == [[1], [1]] if record["stage_ahead"] else [[1, 1, 1]] * 2
            for lasts, off_cpus, call in zip(marks["last_marked_us"], marks["most_off_cpu_us"],
                                             record["call_us"], strict=True):
                assert all(0 < last < call for last in lasts)
                assert all(off_cpu < last for off_cpu, last in zip(off_cpus, lasts, strict=True))
        else:
            assert "marks" not in record
    (registered,) = [r for r in records if r["measure"] == "registered_send"]
    assert registered["chunks"] == 9 and all(us > 0 for us in registered["median_us"].values())
