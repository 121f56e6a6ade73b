"""README.md's library example runs as written, and the stream it prints learns."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_library_example_runs_and_its_online_loss_falls() -> None:
    section = README.read_text().split("## The library in one example", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert code is not None
    printed = io.StringIO()
    namespace: dict[str, object] = {}
    with contextlib.redirect_stdout(printed):
        exec(compile(code.group(1), str(README), "exec"), namespace)  # noqa: S102
    losses = [float(line.split()[-1]) for line in printed.getvalue().splitlines()]
    assert len(losses) == 10
    assert losses[-1] < 0.8 * losses[0]  # the stream is learnable; its loss falls
    assert namespace["same"].to_bytes() == namespace["blob"]
