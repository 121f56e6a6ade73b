"""The staging-overlap benchmark runs end to end and times every way it names."""

import json
import sys

import pytest

from benchmarks.staging_overlap import main


def test_every_way_is_timed(capsys):
    main(["--rows", "16", "--features", "8", "--chunks", "3", "--work-ms", "0.1"])
    record = json.loads(capsys.readouterr().out)
    assert (record["rows"], record["features"], record["chunks"]) == (16, 8, 3)
    assert set(record["ms_per_chunk"]) == {"copy", "python_work", "no_handshake", "handshake",
                                           "marked_beside_python", "marked_beside_launches"}
    assert record["ms_per_chunk"]["python_work"] >= 0.1  # the caller's work ran its time
    assert all(ms > 0 for ms in record["ms_per_chunk"].values())


def test_the_switch_interval_is_set_for_the_run_and_put_back(capsys):
    before = sys.getswitchinterval()
    main(["--rows", "16", "--features", "8", "--chunks", "3", "--work-ms", "0.1",
          "--switch-interval-ms", "0.25"])
    record = json.loads(capsys.readouterr().out)
    assert record["switch_interval_ms"] == pytest.approx(0.25)
    assert sys.getswitchinterval() == before
