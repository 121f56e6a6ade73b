"""The side-by-side benchmark measures each checkout with its own code, in alternating rounds,
on the CPU (as the child processes of CI can) and, in process, on the emulated device."""

import argparse
import json
import shutil
from pathlib import Path

import pytest

from benchmarks.gpu_compare import main, measure
from tests.gln.emulated_cupy import GXX, emulated_cupy_installed

REPOSITORY = Path(__file__).resolve().parents[2]
SMALL = ["--learn-rows", "8", "--examples", "8", "--chunk", "4"]


def test_each_checkout_runs_its_own_code_in_alternating_rounds(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GLN_DATA_DIR", raising=False)  # random rows, whoever runs the tests
    # One measurement here first, so that the CPU kernels that the children take are in the
    # repository's Numba cache, which each copy carries in its __pycache__ (with the sources'
    # times, which the cache checks): a child then loads them instead of compiling them for a
    # quarter of a minute.
    measure(argparse.Namespace(data_dir=None, learn_rows=8, examples=8, chunk=4, device="cpu",
                               page_locked=False))
    checkouts = []
    for name in ("old", "new"):
        shutil.copytree(REPOSITORY / "gln", tmp_path / name / "gln")
        checkouts.append(str(tmp_path / name))
    main([*checkouts, "--rounds", "2", "--device", "cpu", *SMALL])
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["checkout"], r["round"]) for r in records] == [
        (checkouts[0], 1), (checkouts[1], 1), (checkouts[0], 2), (checkouts[1], 2)]
    assert all(r["gln"] == str(Path(r["checkout"]).resolve()) for r in records)
    assert len({r["first_call_digest"] for r in records}) == 1  # the same code, the same bytes
    assert len({r["learn_digest"] for r in records}) == 1
    assert all(len(r["predict_per_second"]) == 3 and min(r["predict_per_second"]) > 0
               for r in records)
    assert all(r["learn_per_second"] > 0 for r in records)  # 8 rows: a first call, then one


def test_one_checkout_is_no_comparison():
    with pytest.raises(SystemExit):
        main([str(REPOSITORY), "--device", "cpu"])


@pytest.mark.skipif(GXX is None, reason="the emulated device needs g++ on PATH")
def test_a_measurement_runs_on_the_emulated_device(monkeypatch, small_network):
    monkeypatch.delenv("GLN_DATA_DIR", raising=False)
    args = argparse.Namespace(data_dir=None, learn_rows=4, examples=4, chunk=2, device="cuda",
                              page_locked=True)
    with emulated_cupy_installed():
        record = measure(args)
    assert record["device"] == "cuda" and record["data"] == "random"
    assert min(record["predict_per_second"]) > 0 and len(record["first_call_digest"]) == 16
    # each plain pass followed by one inside a block holding the rows page-locked
    assert len(record["page_locked_predict_per_second"]) == 3
    assert min(record["page_locked_predict_per_second"]) > 0
    assert min(record["page_lock_ms"] + record["page_unlock_ms"]) >= 0
