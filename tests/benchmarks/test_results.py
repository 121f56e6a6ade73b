"""The results files and the tables docs/benchmarks.md shows of them."""

import json
from pathlib import Path

import pytest

from benchmarks.results import render

DOC = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"


@pytest.mark.parametrize("name", sorted(render.TABLES))
def test_each_table_has_a_row_per_run_with_its_figures_commit_and_command(name):
    table = render.TABLES[name]
    lines = render.render(name).splitlines()
    keys = [key for key, _ in table.columns]
    runs = [run for run in render.load(table.file)
            if any(render.figure(run["figures"], key) is not None for key in keys)]
    assert runs and len(lines) == 2 + len(runs)
    for line, run in zip(lines[2:], runs, strict=True):
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert cells[-3:] == [run["commit"], run["machine"], f"`{run['command']}`"]
        assert cells[:-3] == [render.cell(render.figure(run["figures"], key)) for key in keys]


def test_figures_are_shown_as_measured():
    assert render.cell(326767) == "326,767"
    assert render.cell(0.9812) == "0.9812"
    assert render.cell([674000, 877000]) == "674,000-877,000"
    assert render.cell(True) == "yes" and render.cell(None) == ""
    assert render.figure({"errors_returned": {"503": 301}}, "errors_returned.503") == 301


def test_every_results_file_is_a_list_of_runs_a_table_shows():
    shown = {table.file for table in render.TABLES.values()}
    for path in sorted(render.RESULTS.glob("*.json")):
        assert path.name in shown
        assert all(set(run) == {"command", "machine", "commit", "figures"}
                   for run in json.loads(path.read_text()))


def test_the_docs_tables_are_the_results_files():
    """docs/benchmarks.md shows every table, as ``render.py --write`` writes it."""
    text = DOC.read_text()
    assert {m.group(2) for m in render.BLOCK.finditer(text)} == set(render.TABLES)
    assert render.main(["--check", str(DOC)]) == 0
