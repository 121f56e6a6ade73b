"""The answer to a request the server stopped waiting for while shutting down.

After a SIGTERM, uvicorn waits ``GLN_SHUTDOWN_TIMEOUT_S`` for open requests, then cancels
their handlers and would answer each with a plain-text 500. A request still queued then is
withdrawn from its model's queue, not carried out (``ServedModel``; one being carried out is
waited for and answered as usual), and :class:`ShutdownAnswerMiddleware` says so, in the
service's error shape, as a 503 that invites the retry. Of any other request cancelled before
its answer (one still being read, or a create or delete under way) nothing is known for sure,
and its 503 says that.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.asgi_replies import send_json
from service.errors import RequestWithdrawn

log = logging.getLogger(__name__)

_STOPPED = ("the server is shutting down and stopped waiting for this request "
            "(GLN_SHUTDOWN_TIMEOUT_S)")
WITHDRAWN = f"{_STOPPED}; it was not carried out: retry it"
UNKNOWN = (
    f"{_STOPPED}; whether it was carried out is not known: retry a learn with the same "
    "Idempotency-Key, and look up a model before creating or deleting it again"
)


class ShutdownAnswerMiddleware:
    """A JSON 503 for a request cancelled before its answer started, which then ends as
    answered (with a line in the log, not the traceback uvicorn writes for each cancelled
    request: a shutdown may cancel many); nothing for one cancelled mid-answer, whose
    client sees the connection close."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # ``send`` is not wrapped to see whether the answer started: that would cost every
        # request. An answer that started refuses a second start, and is left as it is.
        try:
            await self.app(scope, receive, send)
        except asyncio.CancelledError as cancelled:
            if scope["type"] != "http":
                raise
            withdrawn = isinstance(cancelled, RequestWithdrawn)
            try:
                await send_json(send, 503, WITHDRAWN if withdrawn else UNKNOWN,
                                [(b"connection", b"close"), (b"retry-after", b"1")])
            except Exception:
                raise cancelled from None  # its answer had started: uvicorn closes it
            log.warning("%s %s answered 503: the shutdown stopped waiting for it (%s)",
                        scope["method"], scope["path"],
                        "withdrawn" if withdrawn else "outcome unknown")
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
