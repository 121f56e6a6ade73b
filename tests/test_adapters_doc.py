"""docs/adapters.md's examples run as written, in order, and the GLN adapters in them learn."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parents[1] / "docs" / "adapters.md"


def test_the_adapters_examples_run_and_learn() -> None:
    codes = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert len(codes) == 6  # scikit-learn: two; River: two, mini-batches, the table's figures
    printed = io.StringIO()
    namespace: dict[str, Any] = {}
    with contextlib.redirect_stdout(printed):
        for code in codes:
            exec(compile(code, str(DOC), "exec"), namespace)  # noqa: S102
    lines = printed.getvalue().splitlines()
    assert float(lines[1].split()[-1]) > 0.9  # GLNClassifier's test accuracy, breast cancer
    assert set(namespace["probabilities"]) == set(namespace["classes"])  # ImageSegments'
    table = [line for line in lines if line.startswith(("Phishing", "Bananas", "ImageSeg"))]
    assert len(table) == 6  # the figures' program: three datasets, two models
