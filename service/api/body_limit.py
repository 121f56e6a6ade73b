"""Request bodies: how large, how slow, and how many at once the server takes.

Bodies are read here, before the app, so a route never sees one over its limit, a stalled one
never holds a buffer for long, and a burst of large ones cannot make the server parse them all
at once (:class:`BodyLimitMiddleware`).
"""

from __future__ import annotations

import asyncio
import math

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.asgi_replies import is_model_action, send_json

# Methods none of whose routes take a body: any body is refused, not buffered.
_BODILESS_METHODS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})
# A body over this counts against ``max_large_bodies``.
LARGE_BODY_BYTES = 1024 * 1024
# A declared body up to this is awaited without a deadline for its first piece.
SMALL_BODY_BYTES = 64 * 1024
# A declared body over its limit, up to this, is read and dropped before its 413: a client
# still sending when the server closed would read a reset connection, not the answer.
DRAIN_BYTES = 8 * 1024 * 1024


class BodyLimitMiddleware:
    """413 for a request body over its limit, before the app sees any of it; 408 for a body
    that stops arriving; and at most ``max_large_bodies`` large bodies in the app at once.

    A declared Content-Length over the limit is refused without passing any of it on (up to
    ``DRAIN_BYTES`` it is read and dropped first, so that the client reads the 413). Otherwise
    the body
    is read here, counting bytes as they stream in (a chunked upload or a lying
    Content-Length cannot get past), and handed to the app whole. Our handlers buffer the
    body anyway, so this costs no extra memory in practice.

    A model's import is the one body that is raw bytes rather than JSON: its limit is
    ``import_max_bytes`` (the blob of the largest model the server admits), so a model too
    big for ``max_bytes`` can still be moved between servers. GET, HEAD, DELETE and OPTIONS,
    and a snapshot's POST, take no body, so theirs is limited to 0 bytes: an open route such as
    ``/healthz`` cannot be made to buffer one.

    A client that stops sending midway gets 408 after ``timeout_s`` without a byte, so it cannot
    hold a buffer open (the first piece of a body declared at most ``SMALL_BODY_BYTES`` is
    awaited without a deadline: it would hold nothing). A body over ``LARGE_BODY_BYTES``, once
    read, waits for one of ``max_large_bodies`` turns before the app sees it, and keeps its turn
    until its answer is sent: parsing JSON takes many times a body's size in memory (Python
    floats and lists), and this bounds how many such parses a burst of big requests runs at
    once. The turn is taken only after the whole body has arrived, so a slow sender holds none.
    What every request holds of its body, read or waiting, counts against
    ``max_buffered_bytes``: past it a request gets 503, so many clients (or slow ones) cannot
    make the server hold any amount.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, import_max_bytes: int,
                 timeout_s: float = 30.0, max_large_bodies: int = 2,
                 max_buffered_bytes: int | None = None,
                 min_bytes_per_s: float = math.inf) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.import_max_bytes = import_max_bytes
        self.timeout_s = timeout_s
        self.min_bytes_per_s = min_bytes_per_s
        self._large_turns = asyncio.Semaphore(max_large_bodies)
        # None: no bound (the app passes Settings.buffered_bytes_limit, which has the default)
        self.max_buffered_bytes = max_buffered_bytes if max_buffered_bytes else math.inf
        self.buffered = 0  # bytes of bodies held now (one event loop: no lock)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, setting = self._limit(scope)
        declared, chunked = _declared_body(scope)
        if declared > limit or (chunked and limit == 0):
            if not chunked and declared <= DRAIN_BYTES:
                await self._drain(receive)
            await _refuse_body(send, limit, setting)
            return
        held = 0  # what this request counts in ``buffered``, given back however it ends
        try:
            chunks: list[bytes] = []
            # A small declared body's first piece is awaited with no deadline: it holds little
            # (counted in ``buffered`` all the same), and a deadline per request cost a few
            # percent of a small learn. Every later piece, and any larger body, has one.
            patient = chunked or declared > SMALL_BODY_BYTES
            loop = asyncio.get_running_loop()
            started = loop.time()
            while True:
                if patient:
                    # Each piece within timeout_s, and the whole at min_bytes_per_s on average
                    # after the first timeout_s: a trickle of bytes cannot hold a connection.
                    paced = started + self.timeout_s + held / self.min_bytes_per_s
                    wait = min(self.timeout_s, paced - loop.time())
                    try:
                        async with asyncio.timeout(max(wait, 0.0)):
                            message = await receive()
                    except TimeoutError:
                        await send_json(send, 408, (
                            f"request body incomplete after {self.timeout_s:g} s without data, "
                            f"or slower than {self.min_bytes_per_s:g} bytes/s "
                            "(GLN_BODY_TIMEOUT_S, GLN_MIN_BODY_BYTES_PER_S)"),
                            [(b"connection", b"close")])
                        return
                else:
                    message = await receive()
                    patient = True
                if message["type"] != "http.request":  # client went away
                    await self.app(scope, _replay([message], receive), send)
                    return
                body = message.get("body", b"")
                if held + len(body) > limit:
                    await _refuse_body(send, limit, setting)
                    return
                if self.buffered + len(body) > self.max_buffered_bytes:
                    await send_json(
                        send, 503, f"the server holds {self.max_buffered_bytes:.0f} bytes of "
                        "request bodies already (GLN_MAX_BUFFERED_BYTES); retry shortly",
                        [(b"connection", b"close"), (b"retry-after", b"1")])
                    return
                self.buffered += len(body)
                held += len(body)
                chunks.append(body)
                if not message.get("more_body", False):
                    break
            if len(chunks) > 1:
                message = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            chunks.clear()  # else the body is held twice while the app runs (an import)
            if held <= LARGE_BODY_BYTES:
                await self.app(scope, _replay([message], receive), send)
                return
            async with self._large_turns:
                await self.app(scope, _replay([message], receive), send)
        finally:
            self.buffered -= held

    async def _drain(self, receive: Receive) -> None:
        """Read a refused body to its end, dropping it; each piece within ``timeout_s``."""
        while True:
            try:
                async with asyncio.timeout(self.timeout_s):
                    message = await receive()
            except TimeoutError:
                return
            if message["type"] != "http.request" or not message.get("more_body", False):
                return

    def _limit(self, scope: Scope) -> tuple[int, str]:
        """The largest body this request may have, and the setting that says so."""
        # Only a POST is an import: any other method on that path (which no one need be
        # authorised for) keeps the small limit, else it could make the server buffer a GiB.
        method, path = scope["method"], scope["path"]
        if method == "POST" and is_model_action(path, "import"):
            if self.import_max_bytes == self.max_bytes:  # the body limit is the larger
                return self.max_bytes, "GLN_MAX_BODY_BYTES"
            return self.import_max_bytes, "an import: GLN_MAX_MODEL_BYTES plus room for its header"
        if method in _BODILESS_METHODS:
            return 0, f"{method} takes no body"
        if method == "POST" and is_model_action(path, "snapshot"):
            return 0, "a snapshot takes no body"
        return self.max_bytes, "GLN_MAX_BODY_BYTES"


def _declared_body(scope: Scope) -> tuple[int, bool]:
    """The request's Content-Length (0 where absent or malformed: the server, or the count of
    the bytes streamed in, catches a lie) and whether it is sent in chunks."""
    length, chunked = 0, False
    for key, value in scope["headers"]:
        if key == b"content-length":
            try:
                length = int(value)
            except ValueError:
                length = 0
        elif key == b"transfer-encoding":
            chunked = True
    return length, chunked


async def _refuse_body(send: Send, limit: int, setting: str) -> None:
    await send_json(
        send, 413, f"request body larger than {limit} bytes ({setting})",
        # The rest of the body was not read: do not reuse this connection.
        [(b"connection", b"close")],
    )


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A ``receive`` that first returns ``messages``, then defers to the real one."""
    queue = list(messages)

    async def replayed() -> Message:
        if queue:
            return queue.pop(0)
        return await receive()

    return replayed
