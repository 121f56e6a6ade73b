"""The clients: :class:`GLNClient` (blocking) and :class:`AsyncGLNClient` (``await``).

Both have the same verbs, written once in :class:`Verbs`: each hands an exchange of
:mod:`gln_client.protocol` (the requests, the retries, the answers) to the client's driver,
``_run``, which is all that differs between the two: ``httpx.Client`` and ``time.sleep``, or
``httpx.AsyncClient`` and ``asyncio.sleep``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import httpx
import numpy as np

from gln_client.errors import ConnectionFailed
from gln_client.protocol import (
    Answer,
    Exchange,
    LabelsResult,
    LearnResult,
    Message,
    Outcome,
    Protocol,
    Request,
    Retry,
    Step,
    model_path,
)
from gln_client.stream import AsyncStream, Stream, StreamClosed

T = TypeVar("T")
DEFAULT_URL = "http://127.0.0.1:8000"


class Verbs:
    """The service's verbs. Each returns its answer from :class:`GLNClient` and an awaitable
    of it from :class:`AsyncGLNClient`.

    ``rows`` are a NumPy array (n, num_features), a list of lists, a pandas DataFrame, a list
    of dicts or one dict (:mod:`gln_client.rows`). Dicts and DataFrames are put in the order of
    ``feature_names``: the call's, else the model's config's (when it has them), else the
    client's. Labels are class indices or, for a model with ``class_names``, names. Every
    call raises :class:`gln_client.GLNError` (a subclass per status) when the
    service refuses it, and ``ValueError`` for rows it cannot send.
    """

    _http_class: type[httpx.Client] | type[httpx.AsyncClient]

    def __init__(
        self, url: str = DEFAULT_URL, *, token: str | None = None, timeout: float = 60.0,
        binary: bool = True, retry: Retry | None = None,
        feature_names: Sequence[str] | None = None,
    ) -> None:
        """``token``: the service's ``GLN_API_TOKEN`` (default: that variable here, if set).
        ``timeout``: seconds per try (the first create after a server's install waits while
        the kernels compile). ``binary``: send and take rows as ``.npz`` (JSON otherwise, and
        with a server that refuses ``.npz``). ``retry``: :class:`gln_client.Retry`.
        ``feature_names``: the order of dict rows' and DataFrames' features, for every model.
        """
        token = os.environ.get("GLN_API_TOKEN") if token is None else token
        self._headers = {"authorization": f"Bearer {token}"} if token else {}
        self._protocol = Protocol(binary=binary, retry=retry or Retry(),
                                  feature_names=feature_names)
        self._http: Any = self._http_class(base_url=url, headers=self._headers, timeout=timeout)

    def _run(self, exchange: Exchange[T], socket: Any = None) -> Answer[T]:
        raise NotImplementedError

    def _stream_url(self, name: str) -> str:
        base = str(self._http.base_url).rstrip("/")
        return "ws" + base.removeprefix("http") + model_path(name, "stream")

    # -- models --
    def create_model(self, name: str, config: Mapping[str, Any] | None = None,
                     **options: Any) -> Answer[dict[str, Any]]:
        """Create model ``name`` from a GLN config (a dict, or keyword arguments:
        ``create_model("fraud", num_features=30)``); its info. ``Conflict`` if it exists."""
        return self._run(self._protocol.create_model(name, {**(config or {}), **options}))

    def list_models(self) -> Answer[list[dict[str, Any]]]:
        """Every model's info, by name."""
        return self._run(self._protocol.list_models())

    def model_info(self, name: str) -> Answer[dict[str, Any]]:
        """The model's info: config, examples_seen, online metrics, latest snapshot."""
        return self._run(self._protocol.model_info(name))

    def delete_model(self, name: str) -> Answer[None]:
        """Delete the model, its snapshots and its log."""
        return self._run(self._protocol.delete_model(name))

    def export_model(self, name: str) -> Answer[bytes]:
        """The model's bytes (``GLN.to_bytes``), for :meth:`import_model` or the library."""
        return self._run(self._protocol.export_model(name))

    def import_model(self, name: str, blob: bytes) -> Answer[dict[str, Any]]:
        """Serve a model's bytes as ``name``; its info."""
        return self._run(self._protocol.import_model(name, blob))

    def snapshot(self, name: str) -> Answer[dict[str, Any]]:
        """Snapshot the model now (if it changed since its last); that snapshot's info."""
        return self._run(self._protocol.snapshot(name))

    def health(self) -> Answer[dict[str, Any]]:
        """``{"status": "ok"}`` while the server runs."""
        return self._run(self._protocol.health())

    def ready(self) -> Answer[dict[str, Any]]:
        """``{"status": "ready" | "degraded", "problems": [...]}``; ``Unavailable`` at once
        (no retries) while the server restores its models."""
        return self._run(self._protocol.ready())

    # -- data --
    def learn(self, name: str, rows: Any, labels: Any, key: str | None = None, *,
              feature_names: Sequence[str] | None = None) -> Answer[LearnResult]:
        """Learn the rows in order; each is predicted before it is learned.

        ``key``: the request's Idempotency-Key (default: a new UUID). Every try sends the same
        key, so a retry after a lost answer is answered as a ``duplicate`` and not learned
        twice.
        """
        return self._run(self._protocol.learn(name, rows, labels, key, feature_names))

    def predict(self, name: str, rows: Any, ids: Any = None, *,
                feature_names: Sequence[str] | None = None) -> Answer[np.ndarray]:
        """Class probabilities (n, num_classes). With ``ids`` (one per row), the rows wait for
        their labels (:meth:`labels`)."""
        return self._run(self._protocol.predict(name, rows, ids, feature_names))

    def predict_classes(self, name: str, rows: Any, ids: Any = None, *,
                        feature_names: Sequence[str] | None = None) -> Answer[np.ndarray]:
        """The most probable class of each row (n,): its name where the model has
        ``class_names``, else its index. ``ids`` as for :meth:`predict`."""
        return self._run(self._protocol.predict(name, rows, ids, feature_names, "classes"))

    def labels(self, name: str, ids: Any, labels: Any) -> Answer[LabelsResult]:
        """Learn the rows predicted earlier under ``ids``, now that their labels are known."""
        return self._run(self._protocol.labels(name, ids, labels))

    def explain(self, name: str, rows: Any, *,
                feature_names: Sequence[str] | None = None) -> Answer[np.ndarray]:
        """Per-class saliency (n, num_classes, num_features) of each row."""
        return self._run(self._protocol.explain(name, rows, feature_names))


class GLNClient(Verbs):
    """The service's verbs as blocking calls; close it (or use ``with``) when done.

    >>> with GLNClient("http://127.0.0.1:8000") as client:  # doctest: +SKIP
    ...     client.create_model("fraud", num_features=3)
    ...     client.learn("fraud", [[0.5, 1.0, -2.0]], [1])
    ...     client.predict("fraud", [[0.5, 1.0, -2.0]])
    """

    _http_class = httpx.Client

    def _run(self, exchange: Exchange[T], socket: Any = None) -> T:
        outcome: Outcome = None
        try:
            while True:
                outcome = self._step(exchange.send(outcome), socket)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def _step(self, step: Step, socket: Any) -> Outcome:
        if isinstance(step, Request):
            try:
                return self._http.request(step.method, step.path, content=step.content,
                                          headers=step.headers)
            except httpx.TransportError as exc:
                return exc
        if isinstance(step, float):
            time.sleep(step)
            return None
        try:
            return socket.send(step.data) if isinstance(step, Message) else socket.recv()
        except StreamClosed as exc:
            raise ConnectionFailed(f"the stream closed: {exc}") from exc

    def stream(self, name: str, *, feature_names: Sequence[str] | None = None) -> Stream:
        """A learning stream to the model (``with client.stream(name) as s``): see
        :class:`gln_client.Stream`."""
        return Stream(self, name, feature_names)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> GLNClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncGLNClient(Verbs):
    """The service's verbs as coroutines; ``await client.aclose()`` (or ``async with``)."""

    _http_class = httpx.AsyncClient

    async def _run(self, exchange: Exchange[T], socket: Any = None) -> T:
        outcome: Outcome = None
        try:
            while True:
                outcome = await self._step(exchange.send(outcome), socket)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    async def _step(self, step: Step, socket: Any) -> Outcome:
        if isinstance(step, Request):
            try:
                return await self._http.request(step.method, step.path, content=step.content,
                                                headers=step.headers)
            except httpx.TransportError as exc:
                return exc
        if isinstance(step, float):
            await asyncio.sleep(step)
            return None
        try:
            return await (socket.send(step.data) if isinstance(step, Message)
                          else socket.recv())
        except StreamClosed as exc:
            raise ConnectionFailed(f"the stream closed: {exc}") from exc

    def stream(self, name: str, *, feature_names: Sequence[str] | None = None) -> AsyncStream:
        """A learning stream to the model (``async with client.stream(name) as s``): see
        :class:`gln_client.Stream`."""
        return AsyncStream(self, name, feature_names)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncGLNClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
