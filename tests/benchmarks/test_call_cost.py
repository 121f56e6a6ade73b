"""The call cost benchmark end to end: a few short calls of each verb, alone and compared."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import call_cost

ROOT = Path(__file__).resolve().parent.parent.parent


def test_it_times_every_verb_and_call_size_and_prints_what_it_returns(capsys):
    result = call_cost.main(["--models", "small", "--rows", "1,3", "--calls", "4",
                             "--min-calls", "2"])
    assert json.loads(capsys.readouterr().out) == result
    assert Path(result["gln"]) == ROOT / "gln"
    timings = result["results"]["small"]
    assert set(timings) == set(call_cost.VERBS)
    for by_rows in timings.values():
        assert set(by_rows) == {"1", "3"}
        assert all(t["us_per_call"] > 0 and t["calls"] == 4 for t in by_rows.values())
        assert by_rows["3"]["us_per_row"] == pytest.approx(by_rows["3"]["us_per_call"] / 3,
                                                           abs=1e-2)


def test_a_comparison_runs_both_checkouts_and_gives_their_ratio(capsys):
    """Compared with itself (by the same Python): both sides measured, a ratio per size."""
    result = call_cost.main(["--models", "small", "--verbs", "learn", "--rows", "2",
                             "--calls", "3", "--min-calls", "2", "--rounds", "2",
                             "--compare", str(ROOT), "--compare-python", sys.executable])
    assert json.loads(capsys.readouterr().out) == result
    for side in ("this", "other"):
        assert Path(result[side]["gln"]) == ROOT / "gln"
        assert len(result[side]["results"]["small"]["learn"]["2"]["rounds_us"]) == 2
    assert result["ratio_this_to_other"]["small"]["learn"]["2"] > 0
    assert result["best_round_ratio"]["small"]["learn"]["2"] > 0


def _callgrind_header_compiles() -> bool:
    if shutil.which("cc") is None:
        return False
    probe = subprocess.run(["cc", "-E", "-include", "valgrind/callgrind.h", "-x", "c", "-"],
                           input="", capture_output=True, text=True, check=False)
    return probe.returncode == 0


@pytest.mark.skipif(not _callgrind_header_compiles(), reason="needs cc and valgrind's headers")
def test_the_callgrind_mode_runs_the_one_verb_and_says_how_many_calls_it_made(capsys, monkeypatch):
    """Outside callgrind its client requests do nothing: the mode runs, and reports what the
    dump's summary is to be divided by."""
    made = []
    original = call_cost.call_times
    monkeypatch.setattr(call_cost, "call_times",
                        lambda *args, **kwargs: made.append(args) or original(*args, **kwargs))
    result = call_cost.main(["--models", "small", "--rows", "2", "--calls", "3",
                             "--min-calls", "2", "--callgrind", "predict_checked"])
    assert json.loads(capsys.readouterr().out) == result
    assert (result["callgrind"], result["model"], result["rows"], result["calls"]) == (
        "predict_checked", "small", 2, 3)
    assert [args[1:] for args in made] == [("predict_checked", 2, 3)]


def test_the_callgrind_mode_counts_one_model_and_one_call_size():
    with pytest.raises(SystemExit, match="one model and one call size"):
        call_cost.main(["--models", "small", "--rows", "1,2", "--callgrind", "learn"])
