"""Request ids: every answer carries ``X-Request-ID``, and the service's log lines name it.

A client (or the reverse proxy in front) that sends an ``X-Request-ID`` of up to 128 safe
characters gets the same one back, so its own logs and ours meet on one id. Any other request
gets a new id, unique across restarts (a random prefix per process, then a count). While a
request is handled, :data:`current_request_id` holds its id, and :class:`RequestIdLogFilter`
puts it on every log record, which the log format of ``gln-service`` prints. Work a request
hands to a worker thread or to its model's queue logs without it.
"""

from __future__ import annotations

import contextvars
import itertools
import logging
import re
import secrets

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = b"x-request-id"
# What a client's id may be: it is echoed in a header and written to the log, so nothing
# that could break either (no spaces, quotes or control characters), and not a page long.
_ACCEPTED = re.compile(rb"[A-Za-z0-9._:/+=@-]{1,128}")

current_request_id: contextvars.ContextVar[str] = contextvars.ContextVar(
    "gln_request_id", default="-")


class RequestIdMiddleware:
    """Gives each HTTP request its id (the client's, if acceptable, else a new one), sets
    :data:`current_request_id` while the app runs, and adds the id to the answer's headers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        # A count is far cheaper per request than a UUID; the prefix keeps ids of different
        # processes (and of a restart) apart.
        self._prefix = secrets.token_hex(4)
        self._count = itertools.count(1)

    def _id_for(self, scope: Scope) -> bytes:
        for key, value in scope["headers"]:
            if key == HEADER:
                if _ACCEPTED.fullmatch(value):
                    return value
                break
        return f"{self._prefix}-{next(self._count)}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = self._id_for(scope)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), (HEADER, request_id)]
            await send(message)

        token = current_request_id.set(request_id.decode())
        await self.app(scope, receive, send_with_id)
        # Kept when the app raises: the 500 is answered outside every middleware (Starlette's
        # ServerErrorMiddleware), by a handler of this same context that names the id.
        current_request_id.reset(token)


# The service's log lines: each names its request, if it has one (RequestIdLogFilter).
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s%(request_tag)s: %(message)s"


class RequestIdLogFilter(logging.Filter):
    """Adds to every record ``request_id``, the id of the request being handled (or "-"), and
    ``request_tag``, the same as `` [<id>]`` (or nothing outside a request) for a log format."""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = current_request_id.get()
        record.request_id = request_id
        record.request_tag = "" if request_id == "-" else f" [{request_id}]"
        return True
