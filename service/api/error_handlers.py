"""The app's error answers: always ``{"detail": "<message>"}``, never the client's data whole."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from service.api.request_id import current_request_id
from service.errors import RegistryError

log = logging.getLogger(__name__)


def add_error_handlers(app: FastAPI) -> None:
    """Answer a registry's refusal, a malformed request and an unexpected failure in the
    service's one error shape."""
    app.add_exception_handler(RegistryError, _registry_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(ClientDisconnect, _client_gone)
    app.add_exception_handler(Exception, _internal_error)


# A 503 says when to try again: the log or the store is away, the engine restarting, the
# models still being restored; each is usually over in seconds, and clients back off from it.
RETRY_AFTER_S = "1"


async def _registry_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RegistryError)
    headers = {"retry-after": RETRY_AFTER_S} if exc.status_code == 503 else None
    return JSONResponse({"detail": shortened(str(exc))}, status_code=exc.status_code,
                        headers=headers)


# An error's words echo what the client sent (a config value, a label); a value of megabytes
# would come back whole. Past this many characters the message is cut, saying how much.
DETAIL_MAX_CHARS = 2000


def shortened(detail: str) -> str:
    """``detail`` cut past ``DETAIL_MAX_CHARS``, saying how much was left out."""
    if len(detail) <= DETAIL_MAX_CHARS:
        return detail
    return f"{detail[:DETAIL_MAX_CHARS]}... ({len(detail) - DETAIL_MAX_CHARS} characters more)"


# nginx's status for a request whose client hung up before it was answered: counted among
# the clients' errors (4xx), not the server's, which the error-rate alert and panel watch.
CLIENT_CLOSED_REQUEST = 499


async def _client_gone(request: Request, exc: Exception) -> Response:
    """A client that hung up while sending its body: nothing of the request was done, nobody
    reads the answer, and the server did not fail."""
    log.info("the client hung up while sending %s %s (request %s); nothing was done",
             request.method, request.url.path, current_request_id.get())
    return Response(status_code=CLIENT_CLOSED_REQUEST)


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    """500 in the same shape as every other error, naming the request's id; the log has a
    line with that id, and the traceback (which uvicorn writes) follows it."""
    request_id = current_request_id.get()
    log.error("internal error answering %s %s: %s", request.method, request.url.path,
              type(exc).__name__)
    return JSONResponse(
        {"detail": f"internal error: {type(exc).__name__}; see the service log "
                   f"(request {request_id})"},
        status_code=500, headers={"x-request-id": request_id},
    )


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    """422 with one readable line per problem; never echoes the input (it may hold NaN)."""
    assert isinstance(exc, RequestValidationError)
    return JSONResponse({"detail": validation_detail(exc)}, status_code=422)


def validation_detail(exc: RequestValidationError) -> str:
    """One readable line per problem of a malformed request (also a stream's batch)."""
    return shortened("; ".join(f"{_place(error.get('loc', ()))}: {error.get('msg', 'invalid')}"
                               for error in exc.errors()))


def _place(loc: tuple[int | str, ...]) -> str:
    """Where a problem is, in the client's words: ``labels.1`` in the body, ``name in the
    path``, ``the Idempotency-Key header`` (not pydantic's ``path.name``)."""
    part, *rest = loc or ("body",)
    inside = ".".join(str(p) for p in rest)
    if part == "path" and inside:
        return f"{inside} in the path"
    if part == "header" and inside:
        return f"the {inside} header"
    if part == "query" and inside:
        return f"query parameter {inside}"
    if part == "body":
        return inside or "body"
    return ".".join(str(p) for p in loc)
