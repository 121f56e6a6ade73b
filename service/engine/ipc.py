"""The engine across processes: :class:`EngineServer` serves an engine on a ZeroMQ socket,
:class:`RemoteEngine` is the :class:`~service.engine.client.EngineClient` that HTTP workers
call it through (``GLN_WORKERS`` > 1).

Why ZeroMQ (pyzmq): it frames messages, queues them, reconnects a worker to an engine that
restarted, and reports disconnects, over a Unix socket, with array bytes sent as frames of
their own (no copy into a larger buffer, no re-encoding). A call is one multipart message:
a JSON header (its id, the verb, the arguments) and one frame per array or blob, which the
header names by index. The answer has the same shape, or carries the error's status and words.

An engine that dies fails every call in flight at once (503: its outcome is unknown, so a
learn is retried with its Idempotency-Key) rather than leaving it to hang; a worker does not
queue calls while no engine listens (503 after ``connect_timeout_s``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from service.engine.client import Labels, Rows
from service.engine.learn_answers import LearnResult
from service.errors import RegistryError, Unavailable

log = logging.getLogger(__name__)

# The verbs a worker may call: EngineClient's, nothing else of the engine.
VERBS = frozenset({"create", "import_model", "export", "delete", "list_models", "info", "learn",
                   "predict", "labels", "explain", "snapshot", "readiness", "metrics_text"})


# -- the wire ----------------------------------------------------------------------------------
def pack(value: Any, frames: list[Any]) -> Any:
    """``value`` as JSON-able data; its arrays and blobs appended to ``frames`` by reference."""
    if isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        frames.append(array)
        return {"$array": len(frames) - 1, "dtype": array.dtype.str, "shape": array.shape}
    if isinstance(value, bytes | bytearray | memoryview):
        frames.append(value)
        return {"$bytes": len(frames) - 1}
    if isinstance(value, LearnResult):
        fields = {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
        return {"$learn": pack(fields, frames)}
    if isinstance(value, dict):
        return {key: pack(item, frames) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [pack(item, frames) for item in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def unpack(data: Any, frames: Sequence[Any]) -> Any:
    """What :func:`pack` made, arrays viewing ``frames`` (no copy)."""
    if isinstance(data, dict):
        if "$array" in data:
            dtype = np.dtype(data["dtype"])
            return np.frombuffer(frames[data["$array"]], dtype).reshape(data["shape"])
        if "$bytes" in data:
            return bytes(frames[data["$bytes"]])
        if "$learn" in data:
            fields = unpack(data["$learn"], frames)
            return LearnResult(**{**fields, "stale_ids": tuple(fields["stale_ids"])})
        return {key: unpack(item, frames) for key, item in data.items()}
    if isinstance(data, list):
        return [unpack(item, frames) for item in data]
    return data


def message(header: dict[str, Any], value_key: str, value: Any) -> list[Any]:
    """A multipart message: ``header`` with ``value`` packed under ``value_key``, then frames."""
    frames: list[Any] = []
    header[value_key] = pack(value, frames)
    return [json.dumps(header).encode(), *frames]


class _RemoteError(RegistryError):
    """An engine's refusal, as the worker re-raises it: the engine's status and words."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status_code = status


# -- the engine's side -------------------------------------------------------------------------
class EngineServer:
    """Serves ``engine`` (any EngineClient) to the workers connected at ``address``."""

    def __init__(self, engine: Any, address: str) -> None:
        self.engine = engine
        self.address = address
        self._context = zmq.asyncio.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(address)
        self._calls: set[asyncio.Task[None]] = set()

    async def serve(self) -> None:
        """Answer calls until cancelled; each call runs as a task of its own, taken in the
        order the socket delivers them (so one worker's calls queue in the order it sent)."""
        while True:
            frames = await self._socket.recv_multipart(copy=False)
            call = asyncio.create_task(self._answer(frames))
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)

    async def drain(self) -> None:
        """Wait for the calls in flight (after ``serve`` was cancelled)."""
        if self._calls:
            await asyncio.gather(*self._calls, return_exceptions=True)

    def close(self) -> None:
        self._socket.close()
        self._context.term()

    async def _answer(self, frames: list[zmq.Frame]) -> None:
        peer, header_frame, *data = frames
        header = json.loads(header_frame.bytes)
        answer: dict[str, Any] = {"id": header["id"]}
        try:
            verb = header["verb"]
            if verb not in VERBS:
                raise _RemoteError(400, f"the engine has no verb {verb!r}")
            args = unpack(header["args"], [frame.buffer for frame in data])
            result = await getattr(self.engine, verb)(*args)
            parts = message(answer, "ok", result)
        except RegistryError as exc:
            answer["error"] = {"status": exc.status_code, "detail": str(exc)}
            parts = [json.dumps(answer).encode()]
        except Exception as exc:  # a bug: the worker answers 500, the engine goes on
            log.exception("engine call %s failed", header.get("verb"))
            answer["error"] = {"status": 500, "detail": f"internal error ({type(exc).__name__})"}
            parts = [json.dumps(answer).encode()]
        await self._socket.send_multipart([peer.bytes, *parts], copy=False)


# -- the workers' side -------------------------------------------------------------------------
ENGINE_GONE = ("the engine process stopped while it served this request, so whether it was "
               "carried out is unknown; retry it (a learn with the same Idempotency-Key is "
               "not learned twice)")


class RemoteEngine:
    """The engine of another process, through :class:`EngineServer` at ``address``."""

    def __init__(self, address: str, connect_timeout_s: float = 5.0) -> None:
        self.address = address
        self.connect_timeout_s = connect_timeout_s
        self._ids = itertools.count()
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._context: zmq.asyncio.Context | None = None
        self._socket: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._context = zmq.asyncio.Context()
        socket = self._context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.IMMEDIATE, 1)  # no queueing for an engine that is not there
        monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        socket.connect(self.address)
        self._socket = socket
        self._tasks = [asyncio.create_task(self._receive(), name="gln-engine-answers"),
                       asyncio.create_task(self._watch(monitor), name="gln-engine-watch")]

    async def close(self) -> bool:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._fail_all(Unavailable("the server is shutting down"))
        if self._socket is not None:
            self._socket.disable_monitor()
            self._socket.close()
        if self._context is not None:
            self._context.term()
        return True  # the engine process snapshots; its exit status says how that went

    async def _call(self, verb: str, *args: Any) -> Any:
        assert self._socket is not None, "the remote engine has not started"
        call_id = next(self._ids)
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = answer
        try:
            parts = message({"id": call_id, "verb": verb}, "args", list(args))
            try:
                await asyncio.wait_for(self._socket.send_multipart(parts, copy=False),
                                       self.connect_timeout_s)
            except TimeoutError:
                raise Unavailable("the engine process is not answering (starting or "
                                  "restarting); retry shortly") from None
            return await answer
        finally:
            self._calls.pop(call_id, None)

    async def _receive(self) -> None:
        assert self._socket is not None
        while True:
            header_frame, *data = await self._socket.recv_multipart(copy=False)
            header = json.loads(header_frame.bytes)
            answer = self._calls.get(header["id"])
            if answer is None or answer.done():
                continue  # its caller was cancelled, or was answered that the engine died
            if "error" in header:
                error = header["error"]
                answer.set_exception(_RemoteError(error["status"], error["detail"]))
            else:
                answer.set_result(unpack(header["ok"], [frame.buffer for frame in data]))

    async def _watch(self, monitor: zmq.asyncio.Socket) -> None:
        """Fail every call in flight when the connection to the engine drops."""
        try:
            while True:
                event = parse_monitor_message(await monitor.recv_multipart())
                if event["event"] == zmq.EVENT_DISCONNECTED:
                    log.warning("the engine process disconnected; %d request(s) in flight "
                                "are answered 503", len(self._calls))
                    self._fail_all(Unavailable(ENGINE_GONE))
        finally:
            monitor.close()

    def _fail_all(self, error: Exception) -> None:
        for answer in self._calls.values():
            if not answer.done():
                answer.set_exception(error)

    # -- EngineClient --
    async def create(self, name: str, config: dict[str, Any]) -> dict[str, Any]:
        return await self._call("create", name, config)

    async def import_model(self, name: str, blob: bytes) -> dict[str, Any]:
        return await self._call("import_model", name, blob)

    async def export(self, name: str) -> bytes:
        return await self._call("export", name)

    async def delete(self, name: str) -> None:
        await self._call("delete", name)

    async def list_models(self) -> list[dict[str, Any]]:
        return await self._call("list_models")

    async def info(self, name: str) -> dict[str, Any]:
        return await self._call("info", name)

    async def learn(
        self, name: str, features: Rows, labels: Labels, key: str | None = None
    ) -> LearnResult:
        return await self._call("learn", name, rows_array(features), labels_array(labels), key)

    async def predict(
        self, name: str, features: Rows, ids: Sequence[str] | None = None
    ) -> np.ndarray:
        return await self._call("predict", name, rows_array(features),
                                None if ids is None else list(ids))

    async def labels(
        self, name: str, ids: Sequence[str], labels: Labels
    ) -> tuple[LearnResult | None, list[str]]:
        result, missing = await self._call("labels", name, list(ids), labels_array(labels))
        return result, missing

    async def explain(self, name: str, features: Rows) -> np.ndarray:
        return await self._call("explain", name, rows_array(features))

    async def snapshot(self, name: str) -> dict[str, Any]:
        return await self._call("snapshot", name)

    async def readiness(self) -> list[str]:
        return await self._call("readiness")

    async def metrics_text(self) -> bytes:
        return await self._call("metrics_text")


def rows_array(features: Rows) -> Any:
    """JSON rows as one float64 array, converted here in the worker rather than in the engine;
    rows that do not make one (ragged) travel as they are, for the engine to name the row."""
    if isinstance(features, np.ndarray):
        return features
    try:
        return np.array(features, dtype=np.float64)
    except (ValueError, TypeError):
        return features


def labels_array(labels: Labels) -> Any:
    """JSON labels (ints, checked by the schema) as one int64 array."""
    if isinstance(labels, np.ndarray):
        return labels
    return np.array(labels, dtype=np.int64)
