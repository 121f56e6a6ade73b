"""benchmarks/gpu_session.sh runs only on a GPU machine, where a broken line costs device time:
it is held here to valid bash and to scripts and test files that exist."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
SCRIPT = REPOSITORY / "benchmarks" / "gpu_session.sh"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_every_file_the_script_runs_exists():
    named = set(re.findall(r"\b((?:benchmarks|tests/gln)/\w+\.py)\b", SCRIPT.read_text()))
    assert {"benchmarks/gpu_learn.py", "benchmarks/gpu_compare.py"} <= named
    assert [path for path in sorted(named) if not (REPOSITORY / path).is_file()] == []


def test_the_script_writes_at_most_the_eight_files_a_call_brings_back():
    written = set(re.findall(r'"\$OUT/([\w.-]+)"', SCRIPT.read_text()))
    assert {"tests.log", "gpu_learn.jsonl", "ncu.txt"} <= written
    assert len(written) <= 8, sorted(written)
