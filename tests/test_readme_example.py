"""README.md's library sketch and docs/library.md's example run as written, and the stream
they learn from is learned; the batches scored inside a page-locked block are the model's
predictions."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

import numpy as np

README = Path(__file__).resolve().parents[1] / "README.md"
LIBRARY = Path(__file__).resolve().parents[1] / "docs" / "library.md"


def test_the_library_example_runs_and_its_online_loss_falls() -> None:
    section = _section(LIBRARY, "## In one example")
    codes = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    assert len(codes) == 2  # the example, then scoring in batches
    printed = io.StringIO()
    namespace: dict[str, Any] = {}
    with contextlib.redirect_stdout(printed):
        for code in codes:
            exec(compile(code, str(LIBRARY), "exec"), namespace)  # noqa: S102
    losses = [float(line.split()[-1]) for line in printed.getvalue().splitlines()]
    assert len(losses) == 10
    assert losses[-1] < 0.8 * losses[0]  # the stream is learnable; its loss falls
    assert namespace["same"].to_bytes() == namespace["blob"]
    model, X_test = namespace["model"], namespace["X_test"]
    assert namespace["test_probs"].shape == (len(X_test), 2)
    np.testing.assert_array_equal(namespace["test_probs"], model.predict_proba(X_test))


def _section(path: Path, heading: str) -> str:
    """The text of ``path`` under ``heading``, up to the next heading of its level."""
    return path.read_text().split(heading, 1)[1].split("\n## ", 1)[0]


def test_the_library_family_example_runs_and_its_members_are_models_alone() -> None:
    section = _section(LIBRARY, "## Many small models")
    stacked, served = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    namespace: dict[str, Any] = {}
    exec(compile(stacked, str(LIBRARY), "exec"), namespace)  # noqa: S102
    family, alone = namespace["family"], namespace["alone"]
    assert family.size == 3 and family.member_bytes(2) == alone.to_bytes()
    assert namespace["probs"].shape == (6, 2)
    exec(compile(served, str(LIBRARY), "exec"), namespace)  # noqa: S102
    X, y, GLN = namespace["X"], namespace["y"], namespace["GLN"]
    one_of_its_own = GLN(num_features=20, layer_sizes=(32, 32, 1), seed=0)
    one_of_its_own.learn(X, y)  # the member learned all six rows: two alone, four together
    assert namespace["tenant"].to_bytes() == one_of_its_own.to_bytes()
    assert namespace["family"].size == 10_000


def test_the_readme_sketch_runs_and_learns() -> None:
    section = README.read_text().split("## The library", 1)[1]
    code = re.findall(r"```python\n(.*?)```", section, re.DOTALL)[0]
    namespace: dict[str, Any] = {}
    exec(compile(code, str(README), "exec"), namespace)  # noqa: S102
    probs, y = namespace["probs"], namespace["y"]
    losses = -np.log(probs[np.arange(len(y)), y])
    assert losses[-200:].mean() < 0.8 * losses[:200].mean()  # it learns as it goes
    assert namespace["same"].to_bytes() == namespace["model"].to_bytes()
