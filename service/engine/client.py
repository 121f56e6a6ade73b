"""The seam between the HTTP face and the engine: every verb the face may ask of the models.

The face (``service.api``) parses and validates requests, then calls one of these; the
engine (``service.engine``) owns the models, their single writers, the log and the snapshots.
Two engines answer it: :class:`service.engine.local.LocalEngine` in the face's own process
(``GLN_WORKERS=1``), and :class:`service.engine.ipc.RemoteEngine`, which sends each call to the
engine process over a socket (``GLN_WORKERS`` > 1). Rows cross it as NumPy arrays (or, from a
JSON body, as the nested lists the client sent); answers are arrays, plain dicts and
:class:`~service.engine.learn_answers.LearnResult`. Refusals are
:class:`service.errors.RegistryError` subclasses carrying their HTTP status.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from service.engine.learn_answers import LearnResult

# Rows as a client sent them: an array (a binary body), nested lists, or (for a model with
# feature names) objects of values by name (a JSON body), which the engine checks against the
# model (width, finiteness, names, label range) before they queue. Labels may be class names.
Rows = np.ndarray | Sequence[Sequence[float]] | Sequence[Mapping[str, float]]
Labels = np.ndarray | Sequence[int | str]


class EngineClient(Protocol):
    """What the HTTP face asks of the engine; each call is one request's work."""

    async def create(self, name: str, config: dict[str, Any],
                     replace_unrestored: bool = False) -> dict[str, Any]:
        """Build and serve a model; its info (``GET /v1/models/{name}``'s body).
        ``replace_unrestored``: first delete a stored model of the name that could not be
        restored (else that is a 409)."""
        ...

    async def import_model(self, name: str, blob: bytes) -> dict[str, Any]:
        """Serve the model of a ``GLN.to_bytes`` blob under ``name``; its info."""
        ...

    async def export(self, name: str) -> bytes | memoryview:
        """The model's bytes, every learn queued before this call included."""
        ...

    async def delete(self, name: str) -> None:
        """Finish the model's queued work, forget it, remove its snapshots and log."""
        ...

    async def list_models(self) -> list[dict[str, Any]]:
        """Every model's info, by name."""
        ...

    async def info(self, name: str) -> dict[str, Any]:
        """One model's info: config, progress, online metrics, latest snapshot."""
        ...

    async def learn(
        self, name: str, features: Rows, labels: Labels, key: str | None = None
    ) -> LearnResult:
        """Learn the rows in order (logged first); their prequential answer."""
        ...

    async def predict(
        self, name: str, features: Rows, ids: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """``probabilities`` (n, num_classes) and ``classes``, each row's most probable class
        (its name where the model has class names); with ``ids`` the rows wait for labels."""
        ...

    async def labels(
        self, name: str, ids: Sequence[str], labels: Labels
    ) -> tuple[LearnResult | None, list[str]]:
        """Learn waiting rows by id; the result and the ids that were not waiting."""
        ...

    async def explain(self, name: str, features: Rows) -> np.ndarray:
        """Per-class saliency (n, num_classes, num_features)."""
        ...

    async def snapshot(self, name: str) -> dict[str, Any]:
        """Snapshot the model if it changed; the latest snapshot's version, time and size."""
        ...

    async def readiness(self) -> list[str]:
        """What the engine cannot do now (none: ready); Unavailable while restoring."""
        ...

    async def metrics_text(self) -> bytes:
        """The engine's Prometheus metrics, in text exposition format."""
        ...


def snapshot_answer(info: Any) -> dict[str, Any]:
    """The public fields of a store's :class:`~service.storage.store.SnapshotInfo`."""
    return {"version": info.version, "created_at": info.created_at,
            "nbytes": info.nbytes, "sha256": info.sha256}
