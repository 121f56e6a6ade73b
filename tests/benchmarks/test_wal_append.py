"""The log benchmark at tiny settings: every scenario measured, the summary's figures there
(timings meaningless)."""

import json

from benchmarks.wal_append import SCENARIOS, main


def test_the_script_measures_every_scenario(capsys, tmp_path):
    summary = main(["--rounds", "1", "--appends", "64", "--models", "40",
                    "--dir", str(tmp_path)])
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["scenario"] for r in summary] == list(SCENARIOS)
    assert all(r["log"] == "one log, group commit" and r["appends_per_s"] > 0 for r in summary)
    many = {r["scenario"]: r["fdatasyncs_per_append"] for r in summary}
    assert many["1-thread"] == 1 and many["append_many-32"] == round(1 / 32, 3)
    assert len(records) == len(SCENARIOS) * 2
