"""The engine across processes: :class:`EngineServer` serves an engine on a ZeroMQ socket,
:class:`RemoteEngine` is the :class:`~service.engine.client.EngineClient` that HTTP workers
call it through (``GLN_WORKERS`` > 1).

Why ZeroMQ (pyzmq): it frames messages, queues them, reconnects a worker to an engine that
restarted, and reports disconnects, over a Unix socket, and sends array bytes as they lie (no
re-encoding). A call is one message: a JSON header (its id, the verb, the arguments) and the
bytes of its arrays and blobs, which the header names by index: behind the header in one frame
for a small call, a frame each for a large one. The answer has the same shape, with the
result or the error's status and words.

An engine that dies fails every call in flight at once (503: its outcome is unknown, so a
learn is retried with its Idempotency-Key) rather than leaving it to hang; a worker does not
queue calls while no engine listens (503 after ``connect_timeout_s``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import orjson
import zmq
from zmq.utils.monitor import parse_monitor_message

from service.engine.client import EngineClient, Labels, Rows
from service.engine.learn_answers import LearnResult
from service.errors import RegistryError, Unavailable

log = logging.getLogger(__name__)

# The verbs a worker may call: EngineClient's, nothing else of the engine.
VERBS = frozenset(name for name, value in vars(EngineClient).items()
                  if callable(value) and not name.startswith("_"))


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


# A message whose arrays hold less than this travels as one frame (its arrays copied once
# behind the header); a larger one as the header's frame, then a frame per array (no copy):
# each frame costs a send and a receive, which dominated a single-row call.
INLINE_BYTES = 64 * 1024
_ALIGN = 16  # inline arrays start on multiples of this, as NumPy's own allocations do


def message(header: dict[str, Any], value_key: str, value: Any) -> list[Any]:
    """``header`` with ``value`` packed under ``value_key``, as a message's frames."""
    buffers: list[Any] = []
    header[value_key] = pack(value, buffers)
    sizes = [memoryview(buffer).nbytes for buffer in buffers]
    if sum(sizes) > INLINE_BYTES:
        return [orjson.dumps(header), *buffers]
    header["$inline"] = sizes
    head = orjson.dumps(header)
    parts: list[Any] = [len(head).to_bytes(4, "little"), head]
    at = 4 + len(head)
    for buffer, size in zip(buffers, sizes, strict=True):
        parts.append(bytes(-at % _ALIGN))
        parts.append(buffer)
        at += -at % _ALIGN + size
    return [b"".join(parts)]


def read_message(frames: Sequence[zmq.Frame]) -> tuple[dict[str, Any], list[Any]]:
    """A message's header and its arrays' buffers (views of the frames, no copy)."""
    if len(frames) > 1:
        return orjson.loads(frames[0].buffer), [frame.buffer for frame in frames[1:]]
    whole = frames[0].buffer
    length = int.from_bytes(whole[:4], "little")
    header = orjson.loads(whole[4:4 + length])
    buffers = []
    at = 4 + length
    for size in header.pop("$inline"):
        at += -at % _ALIGN
        buffers.append(whole[at:at + size])
        at += size
    return header, buffers


class _RemoteError(RegistryError):
    """An engine's refusal, as the worker re-raises it: the engine's status and words."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status_code = status


class _Channel:
    """A ZeroMQ socket driven by the running loop: the loop watches the socket's descriptor, and
    each wake-up takes every message waiting (``on_message`` is called with its frames). Plain
    sockets, not zmq.asyncio's: those make a future and a poller event per message, which cost
    more than the rest of an engine call."""

    def __init__(self, socket: zmq.Socket, on_message: Callable[[list[zmq.Frame]], None]) -> None:
        self.socket = socket
        self._on_message = on_message
        self._loop = asyncio.get_running_loop()
        self._fd = socket.getsockopt(zmq.FD)
        self._loop.add_reader(self._fd, self._take_all)
        self._loop.call_soon(self._take_all)  # the descriptor signals edges: take what waits

    def _take_all(self) -> None:
        while True:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._on_message(frames)

    def send(self, parts: list[Any]) -> bool:
        """Send one message now; False if the socket cannot take it (no peer, or full)."""
        try:
            self.socket.send_multipart(parts, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        finally:  # a send can consume the descriptor's edge for messages that arrived meanwhile
            if self.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                self._loop.call_soon(self._take_all)
        return True

    def stop(self) -> None:
        """Stop taking messages (the socket stays open, for answers still to send)."""
        self._loop.remove_reader(self._fd)


# -- the engine's side -------------------------------------------------------------------------
class EngineServer:
    """Serves ``engine`` (any EngineClient) to the workers connected at ``address``."""

    def __init__(self, engine: Any, address: str) -> None:
        self.engine = engine
        self.address = address
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, 0)  # answers are bounded by the calls in flight
        self._socket.setsockopt(zmq.RCVHWM, 0)
        self._socket.bind(address)
        self._channel: _Channel | None = None
        self._calls: set[asyncio.Task[None]] = set()

    async def serve(self) -> None:
        """Answer calls until cancelled; each call runs as a task of its own, started in the
        order the socket delivers them (so one worker's calls queue in the order it sent)."""
        self._channel = _Channel(self._socket, self._start_call)
        try:
            await asyncio.Event().wait()
        finally:
            self._channel.stop()

    def _start_call(self, frames: list[zmq.Frame]) -> None:
        call = asyncio.create_task(self._answer(frames))
        self._calls.add(call)
        call.add_done_callback(self._calls.discard)

    async def drain(self) -> None:
        """Wait for the calls in flight (after ``serve`` was cancelled)."""
        if self._calls:
            await asyncio.gather(*self._calls, return_exceptions=True)

    def close(self) -> None:
        if not self._socket.closed:
            self._socket.close()
        self._context.term()

    async def _answer(self, frames: list[zmq.Frame]) -> None:
        peer, *body = frames
        try:
            header, buffers = read_message(body)
            answer: dict[str, Any] = {"id": int(header["id"])}
        except (ValueError, TypeError, KeyError):  # no worker of ours sent it: nobody to answer
            log.exception("the engine dropped a malformed message")
            return
        try:
            verb = header["verb"]
            if verb not in VERBS:
                raise _RemoteError(400, f"the engine has no verb {verb!r}")
            args = unpack(header["args"], buffers)
            result = await getattr(self.engine, verb)(*args)
            parts = message(answer, "ok", result)
        except RegistryError as exc:
            parts = message(answer, "error", {"status": exc.status_code, "detail": str(exc)})
        except Exception as exc:  # a bug: the worker answers 500, the engine goes on
            log.exception("engine call %s failed", header.get("verb"))
            parts = message(answer, "error", {
                "status": 500, "detail": f"internal error ({type(exc).__name__})"})
        if self._channel is not None and not self._socket.closed:  # closed: the worker's 503
            self._channel.send([peer.bytes, *parts])


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
        self._context: zmq.Context | None = None
        self._socket: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None
        self._channel: _Channel | None = None
        self._monitor_channel: _Channel | None = None

    async def start(self) -> None:
        self._context = zmq.Context()
        socket = self._context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.IMMEDIATE, 1)  # no queueing for an engine that is not there
        socket.setsockopt(zmq.SNDHWM, 0)  # bounded by the requests in flight
        socket.setsockopt(zmq.RCVHWM, 0)
        monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        socket.connect(self.address)
        self._socket = socket
        self._monitor = monitor
        self._channel = _Channel(socket, self._take_answer)
        self._monitor_channel = _Channel(monitor, self._take_event)

    async def close(self) -> bool:
        self._fail_all(Unavailable("the server is shutting down"))
        for channel in (self._channel, self._monitor_channel):
            if channel is not None:
                channel.stop()
        if self._socket is not None:
            self._socket.disable_monitor()
            self._socket.close()
        if self._monitor is not None:
            self._monitor.close()
        if self._context is not None:
            self._context.term()
        return True  # the engine process snapshots; its exit status says how that went

    async def _call(self, verb: str, *args: Any) -> Any:
        assert self._channel is not None, "the remote engine has not started"
        call_id = next(self._ids)
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = answer
        try:
            parts = message({"id": call_id, "verb": verb}, "args", list(args))
            waited = 0.0
            while not self._channel.send(parts):  # no engine connected (IMMEDIATE)
                if waited >= self.connect_timeout_s:
                    raise Unavailable("the engine process is not answering (starting or "
                                      "restarting); retry shortly")
                await asyncio.sleep(0.02)
                waited += 0.02
            return await answer
        finally:
            self._calls.pop(call_id, None)

    def _take_answer(self, frames: list[zmq.Frame]) -> None:
        header, buffers = read_message(frames)
        answer = self._calls.get(header["id"])
        if answer is None or answer.done():
            return  # its caller was cancelled, or was answered that the engine died
        if "error" in header:
            error = header["error"]
            answer.set_exception(_RemoteError(error["status"], error["detail"]))
        else:
            answer.set_result(unpack(header["ok"], buffers))

    def _take_event(self, frames: list[zmq.Frame]) -> None:
        """Fail every call in flight when the connection to the engine drops."""
        event = parse_monitor_message([frame.bytes for frame in frames])
        if event["event"] == zmq.EVENT_DISCONNECTED:
            log.warning("the engine process disconnected; %d request(s) in flight are "
                        "answered 503", len(self._calls))
            self._fail_all(Unavailable(ENGINE_GONE))

    def _fail_all(self, error: Exception) -> None:
        for answer in self._calls.values():
            if not answer.done():
                answer.set_exception(error)

    # -- EngineClient --
    async def create(self, name: str, config: dict[str, Any],
                     replace_unrestored: bool = False) -> dict[str, Any]:
        return await self._call("create", name, config, replace_unrestored)

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
    rows that do not make one (ragged, or given by name) travel as they are, for the engine to
    read by name or to name the row."""
    if isinstance(features, np.ndarray):
        return features
    try:
        return np.array(features, dtype=np.float64)
    except (ValueError, TypeError):
        return features


def labels_array(labels: Labels) -> Any:
    """JSON labels (ints, checked by the schema) as one int64 array; labels that hold class
    names travel as they are, for the engine to look them up."""
    if isinstance(labels, np.ndarray):
        return labels
    array = np.array(labels)  # not dtype=int64, which would read the name "1" as 1
    return array.astype(np.int64, copy=False) if array.dtype.kind in "iu" else labels
