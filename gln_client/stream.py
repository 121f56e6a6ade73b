"""A learning stream: batches of labelled rows sent on one WebSocket, answered in order.

``/v1/models/{name}/stream`` learns each batch as ``learn`` would and answers it once it is in
the service's log; the server reads up to ``GLN_STREAM_MAX_IN_FLIGHT`` (8) batches ahead of
their answers, then stops reading, so :meth:`Stream.send` waits there. Every batch carries an
idempotency key (a new UUID unless given). Nothing on a stream is retried: a connection that
drops leaves its unanswered batches' outcome unknown, and :attr:`Stream.unanswered` holds them
(arrays and key) to send again on a new stream, where a batch already learned is answered as a
duplicate::

    with client.stream("fraud") as stream:
        for X, y in batches:
            stream.send(X, y)
        results = [stream.receive() for _ in batches]
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator, Sequence
from typing import Any

import websockets.asyncio.client
import websockets.sync.client
from websockets.exceptions import ConnectionClosed as StreamClosed
from websockets.exceptions import InvalidHandshake, InvalidStatus

from gln_client.errors import ConnectionFailed, GLNError, Unauthorized, error_for
from gln_client.protocol import RECEIVE, Answer, LearnResult, stream_answer

__all__ = ["AsyncStream", "Stream", "StreamClosed"]

MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # the service's default GLN_MAX_BODY_BYTES


class _Stream:
    """What both streams do; ``client`` is the GLNClient or AsyncGLNClient that opened it."""

    def __init__(self, client: Any, name: str, feature_names: Sequence[str] | None) -> None:
        self.name = name
        self.unanswered: deque[dict[str, Any]] = deque()  # {"features", "labels", "key"}
        self._client = client
        self._feature_names = feature_names
        self._socket: Any = None
        self._options = {"additional_headers": client._headers, "max_size": MAX_MESSAGE_BYTES}
        self._url = client._stream_url(name)

    def send(self, rows: Any, labels: Any, key: str | None = None) -> Answer[str]:
        """Send a batch (rows as ``learn`` takes them); its idempotency key."""
        return self._client._run(self._send(rows, labels, key), self._socket)

    def receive(self) -> Answer[LearnResult]:
        """The answer to the oldest unanswered batch; a batch the server refused raises its
        error (``InvalidRequest``, ``ModelNotFound``, ...), and the stream goes on."""
        return self._client._run(self._receive(), self._socket)

    def _send(self, rows: Any, labels: Any, key: str | None) -> Generator[Any, Any, str]:
        protocol = self._client._protocol
        batch = yield from protocol.stream_batch(self.name, rows, labels, key,
                                                 self._feature_names)
        self.unanswered.append(batch)
        yield protocol.message(batch)
        return str(batch["key"])

    def _receive(self) -> Generator[Any, Any, LearnResult]:
        message = yield RECEIVE
        self.unanswered.popleft()
        return stream_answer(message)


def _refused(exc: Exception) -> GLNError:
    """The error for a handshake that failed: the server's refusal (403 for a missing or wrong
    token), or no server."""
    if isinstance(exc, InvalidStatus):
        status, body = exc.response.status_code, exc.response.body or b""
        detail = body.decode(errors="replace") or f"the stream was refused ({status})"
        return Unauthorized(status, detail) if status == 403 else error_for(status, detail)
    return ConnectionFailed(f"cannot open the stream: {type(exc).__name__}: {exc}")


class Stream(_Stream):
    """A learning stream of :class:`gln_client.GLNClient` (module docstring)."""

    def __enter__(self) -> Stream:
        try:
            self._connection = websockets.sync.client.connect(self._url, **self._options)
            self._socket = self._connection.__enter__()
        except (InvalidHandshake, OSError, TimeoutError) as exc:
            raise _refused(exc) from exc
        return self

    def __exit__(self, *exc: Any) -> None:
        self._connection.__exit__(*exc)


class AsyncStream(_Stream):
    """A learning stream of :class:`gln_client.AsyncGLNClient` (module docstring)."""

    async def __aenter__(self) -> AsyncStream:
        try:
            self._connection = websockets.asyncio.client.connect(self._url, **self._options)
            self._socket = await self._connection.__aenter__()
        except (InvalidHandshake, OSError, TimeoutError) as exc:
            raise _refused(exc) from exc
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._connection.__aexit__(*exc)
