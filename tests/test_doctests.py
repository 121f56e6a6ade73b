"""The examples in the docstrings run as written: every module of ``gln``, ``service`` and
``gln_client`` that has examples is checked with ``doctest``, so an example that no longer
matches the code fails."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from types import ModuleType

import pytest

import gln
import gln_client
import service


def _modules_with_examples() -> list[ModuleType]:
    modules = [
        importlib.import_module(info.name)
        for package in (gln, service, gln_client)
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}.")
        if not info.name.endswith("__main__")
    ]
    finder = doctest.DocTestFinder()
    return [m for m in modules if any(
        not example.options.get(doctest.SKIP)  # a GPU's examples are marked to skip
        for test in finder.find(m) for example in test.examples
    )]


MODULES = _modules_with_examples()


def test_the_modules_with_examples_are_found():
    names = {m.__name__ for m in MODULES}
    assert {"gln.checks", "gln.model", "service.engine.waiting_rows", "service.storage.store",
            "service.storage.wal", "gln_client.rows"} <= names


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_docstring_examples_run(module: ModuleType) -> None:
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed"
