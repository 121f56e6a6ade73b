"""Crashes staged in process: an app whose shutdown writes no snapshot, as if it had died.

Shared by the service tests that restart an app on the same store and log
(test_durability.py, test_delayed_labels.py); the real ``kill -9`` of a server process is in
test_crash_recovery.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from fastapi import FastAPI

from gln import GLN


def skip_shutdown_snapshots(app: FastAPI) -> None:
    """Make the coming shutdown behave like a crash: no model looks changed, none is saved."""
    for entry in app.state.engine.registry.models():
        entry.snapshots.changed = lambda updates: False


async def model_bytes(app: FastAPI, name: str) -> bytes:
    """The bytes of the model ``name`` as the app holds it now."""
    entry = await app.state.engine.registry.get(name)
    with entry.lock:
        return entry.model.to_bytes()


def learned_bytes(config: Mapping[str, Any], batches: Iterable[tuple[Any, Any]]) -> bytes:
    """The bytes of a new ``GLN(**config)`` after learning ``batches`` ((rows, labels) pairs)
    in order: what a server's model must equal once it has learned the same."""
    reference = GLN(**config)
    for X, y in batches:
        reference.learn(np.asarray(X, dtype=np.float32), np.asarray(y))
    return reference.to_bytes()
