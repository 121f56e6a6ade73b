"""README's client example runs as written against a real server, and learns."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from tests.service.durable_client import ServerProcess

README = Path(__file__).resolve().parents[2] / "README.md"

pytestmark = pytest.mark.slow


def test_the_readme_client_example_runs(tmp_path: Path) -> None:
    (code,) = [block for block in re.findall(r"```python\n(.*?)```", README.read_text(),
                                             re.DOTALL) if "GLNClient(" in block]
    with ServerProcess({"GLN_SNAPSHOT_DIR": str(tmp_path / "s")},
                       tmp_path / "server.log") as server:
        server.start()
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code.replace("http://127.0.0.1:8000", server.url), str(README),  # noqa: S102
                         "exec"), {})
    loss, _, probabilities = printed.getvalue().partition(" ")
    assert 0 < float(loss) < 0.69 and "[[" in probabilities  # it learned the stream
