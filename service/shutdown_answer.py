"""The answer to a request the server stopped waiting for while shutting down.

After a SIGTERM, uvicorn waits ``GLN_SHUTDOWN_TIMEOUT_S`` for open requests, then cancels
their handlers and would answer each with a plain-text 500. A request still queued then is
withdrawn from its model's queue, not carried out (``ModelEntry``; one being carried out is
waited for and answered as usual): :class:`ShutdownAnswerMiddleware` says so, in the service's
error shape, as a 503 that invites the retry.
"""

from __future__ import annotations

import asyncio
import contextlib

from starlette.types import ASGIApp, Receive, Scope, Send

from service.asgi_replies import send_json

DETAIL = (
    "the server is shutting down and stopped waiting for this request (GLN_SHUTDOWN_TIMEOUT_S); "
    "it was not carried out: retry it"
)


class ShutdownAnswerMiddleware:
    """A JSON 503 for a request cancelled before its answer started (then the cancellation
    goes on); nothing for one cancelled mid-answer, whose client sees the connection close."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # ``send`` is not wrapped to see whether the answer started: that would cost every
        # request. An answer that started refuses a second start, and is left as it is.
        try:
            await self.app(scope, receive, send)
        except asyncio.CancelledError:
            if scope["type"] == "http":
                with contextlib.suppress(Exception):
                    await send_json(send, 503, DETAIL, [(b"connection", b"close")])
            raise
