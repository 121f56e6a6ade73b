"""The FastAPI app factory and its lifespan.

``create_app(settings)`` builds one self-contained app: its own settings, metrics registry,
and (while the lifespan runs) its own snapshot store, thread pool and model registry, all on
``app.state``. Nothing lives in module globals, so tests can run several apps side by side.

Lifespan:

* start-up opens the store and the write-ahead log (refusing to start if the log cannot give
  the configured durability), starts restoring every stored model in the background (snapshot,
  then the log's tail; ``/readyz`` answers 503 until that is done, ``/healthz`` answers at
  once), and starts the periodic snapshot task;
* shutdown (uvicorn runs it on SIGTERM, after open requests finish) stops the periodic task,
  lets every model's queued learn requests finish, then snapshots every model that changed
  since its last snapshot. ``app.state.shutdown_clean`` records whether that all succeeded.

Pure-ASGI middlewares wrap the app, outermost first: one counts and times every request per
route template (``gln_http_*``); one gives it an id (``X-Request-ID``, ``service.request_id``);
one refuses a Host header this server does not answer to (``service.host_check``); one answers
401 to a POST/DELETE without the bearer token (when ``GLN_API_TOKEN`` is set); one refuses
bodies larger than ``GLN_MAX_BODY_BYTES`` with 413, by Content-Length and by counting the bytes
actually streamed. Pure ASGI because they run on every request: a FastAPI dependency or
``BaseHTTPMiddleware`` costs far more per call.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import SecretStr
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.dir_lock import lock_data_directories
from service.errors import RegistryError
from service.host_check import HostCheckMiddleware, allowed_hosts_for
from service.metrics import ServiceMetrics, package_version
from service.registry import ModelRegistry
from service.request_id import RequestIdMiddleware, current_request_id
from service.routes import router
from service.settings import Settings
from service.store import open_store
from service.wal import WalDurabilityError, WriteAheadLog, open_wal

log = logging.getLogger(__name__)

# FastAPI's native OpenTelemetry hooks, all off: this service exports Prometheus metrics
# (service.metrics), and left on, FastAPI asks the global OpenTelemetry providers on every
# request whether they have been configured.
NO_TELEMETRY = {"tracing": False, "metrics": False, "logs": False, "operation_spans": False}


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the service app; ``settings`` defaults to the ``GLN_*`` environment."""
    settings = settings or Settings()
    app = FastAPI(
        title="gln-service",
        version=package_version(),
        summary="Gated Linear Networks that learn online, one example at a time, over HTTP.",
        lifespan=_lifespan,
        telemetry=NO_TELEMETRY,
    )
    app.state.settings = settings
    app.state.metrics = ServiceMetrics(device=settings.device)
    app.state.registry = None
    app.state.shutdown_clean = None
    app.state.directory_locks = None  # held by the host, if it locked them before serving
    app.include_router(router)
    app.add_exception_handler(RegistryError, _registry_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _internal_error)
    # The last added is the outermost: metrics see every answer, including the guards' 401
    # and 413; the token is checked before a byte of the body is read.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes,
                       import_max_bytes=settings.import_max_bytes,
                       timeout_s=settings.body_timeout_s,
                       max_large_bodies=settings.max_large_bodies,
                       max_buffered_bytes=settings.buffered_bytes_limit)
    app.add_middleware(BearerAuthMiddleware, token=settings.api_token,
                       protect_reads=settings.token_for_reads)
    app.add_middleware(HostCheckMiddleware, allowed=allowed_hosts_for(
        settings.host, settings.allowed_host_names))
    app.add_middleware(RequestIdMiddleware)
    app.add_middleware(
        RequestMetricsMiddleware, metrics=app.state.metrics, routes=list(router.routes)
    )
    app.openapi = functools.partial(_openapi_with_bearer, app)  # type: ignore[method-assign]
    return app


def _openapi_with_bearer(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema plus the bearer scheme the mutating routes refer to."""
    if app.openapi_schema is None:
        schema = FastAPI.openapi(app)
        schemes = schema.setdefault("components", {}).setdefault("securitySchemes", {})
        schemes["bearerAuth"] = {
            "type": "http",
            "scheme": "bearer",
            "description": "Needed on POST and DELETE routes, and to export a model, when "
            "the server sets GLN_API_TOKEN.",
        }
    return app.openapi_schema


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Serve with the data directories locked (``service.dir_lock``): by this app, unless its
    host locked them already (``gln-service`` does, to refuse a taken one in one line)."""
    settings: Settings = app.state.settings
    locks = [] if app.state.directory_locks is not None else await asyncio.to_thread(
        lock_data_directories, settings)
    try:
        async with _serving(app, settings):
            yield
    finally:
        for lock in locks:
            lock.release()


@contextlib.asynccontextmanager
async def _serving(app: FastAPI, settings: Settings) -> AsyncIterator[None]:
    """Open the store and the log, restore the models and run the periodic tasks; on exit,
    drain every queue and snapshot what changed."""
    executor = ThreadPoolExecutor(settings.worker_threads, thread_name_prefix="gln-worker")
    store = open_store(settings.redis_url, settings.snapshot_dir,
                       key_prefix=settings.redis_key_prefix)
    wal = await asyncio.to_thread(_open_log, settings)
    ignored_log = None if settings.wal_enabled else await asyncio.to_thread(
        _open_log, settings.model_copy(update={"wal_enabled": True}), False)
    registry = ModelRegistry(store, settings, app.state.metrics, executor, wal, ignored_log)
    app.state.registry = registry
    restore = asyncio.create_task(registry.restore_all(), name="gln-restore")
    periodic = asyncio.create_task(
        registry.snapshot_periodically(settings.snapshot_interval_s), name="gln-snapshots"
    )
    expiry = asyncio.create_task(
        registry.expire_labels_periodically(min(5.0, settings.label_ttl_s / 2)),
        name="gln-label-expiry",
    )
    try:
        yield
    finally:
        for task in (periodic, expiry, restore):
            task.cancel()
        await asyncio.gather(periodic, expiry, restore, return_exceptions=True)
        clean = await registry.close()
        app.state.shutdown_clean = clean
        if clean:
            log.info("shutdown: every changed model snapshotted")
        else:
            log.error("shutdown: some snapshots failed; %s", (
                "the write-ahead log holds their acknowledged learning, which the next start "
                "replays" if wal is not None else
                "their learning since their last snapshot is lost (GLN_WAL_ENABLED=false)"))
        await asyncio.to_thread(store.close)
        for opened in (wal, ignored_log):
            if opened is not None:
                await asyncio.to_thread(opened.close)
        await asyncio.to_thread(executor.shutdown, wait=True)


def _open_log(settings: Settings, checked: bool = True) -> WriteAheadLog | None:
    """The write-ahead log the settings ask for (None when disabled), ``checked``.

    A server that cannot give the configured durability refuses to start
    (WalDurabilityError); one that cannot be reached yet is checked at the first append.
    """
    if not settings.wal_enabled:
        return None
    wal = _log_of(settings)
    if not checked:
        return wal
    try:
        wal.check_durability()
    except WalDurabilityError:
        wal.close()
        raise
    except Exception as exc:  # unreachable: the first append checks again
        log.warning("could not check the log's durability at start-up: %s", exc)
    return wal


def refuse_unavailable_durability(settings: Settings) -> None:
    """Raise ``WalDurabilityError`` now if the configured log cannot give the durability asked
    for, so that ``gln-service`` refuses it in one line before it serves (the app's start-up
    checks again, for hosts that run the app themselves). A log that cannot be reached yet is
    left to that check and to the first append, as there."""
    if not settings.wal_enabled:
        return
    wal = _log_of(settings)
    try:
        wal.check_durability()
    except WalDurabilityError:
        raise
    except Exception:
        pass
    finally:
        wal.close()


def _log_of(settings: Settings) -> WriteAheadLog:
    """The write-ahead log that enabled ``settings`` describe, opened, not yet checked."""
    return open_wal(
        settings.redis_url, settings.wal_dir or settings.snapshot_dir,
        key_prefix=settings.redis_key_prefix, durability=settings.wal_durability,
        idempotency_ttl_s=settings.idempotency_ttl_s, fsync=settings.wal_fsync,
        replicas=settings.wal_replicas,
    )


# -- error bodies: always {"detail": "<message>"} -------------------------------------------------
async def _registry_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RegistryError)
    return JSONResponse({"detail": _shortened(str(exc))}, status_code=exc.status_code)


# An error's words echo what the client sent (a config value, a label); a value of megabytes
# would come back whole. Past this many characters the message is cut, saying how much.
DETAIL_MAX_CHARS = 2000


def _shortened(detail: str) -> str:
    if len(detail) <= DETAIL_MAX_CHARS:
        return detail
    return f"{detail[:DETAIL_MAX_CHARS]}... ({len(detail) - DETAIL_MAX_CHARS} characters more)"


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
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
        problems.append(f"{where or 'body'}: {error.get('msg', 'invalid')}")
    return JSONResponse({"detail": _shortened("; ".join(problems))}, status_code=422)


# -- middlewares ----------------------------------------------------------------------------------
HTTP_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"}
)


class RequestMetricsMiddleware:
    """Counts and times every HTTP request by route template, method and status."""

    def __init__(
        self, app: ASGIApp, metrics: ServiceMetrics, routes: Sequence[BaseRoute] = ()
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes  # to name requests refused before routing (401, 413)
        # Label children, looked up once per (route, method[, status]) instead of per request.
        self._counters: dict[tuple[str, str, int], Any] = {}
        self._histograms: dict[tuple[str, str], Any] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status_code = 500  # what the client gets if the app raises before answering

        async def send_and_record(message: Message) -> None:
            nonlocal status_code
            if message["type"] == "http.response.start":
                status_code = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            elapsed = time.perf_counter() - start
            route = _route_template(scope, self.routes)
            method = scope["method"]
            if method not in HTTP_METHODS:
                method = "other"  # a client's made-up method must not become a label value
            counter = self._counters.get((route, method, status_code))
            if counter is None:
                counter = self.metrics.http_requests.labels(route, method, str(status_code))
                self._counters[(route, method, status_code)] = counter
            counter.inc()
            histogram = self._histograms.get((route, method))
            if histogram is None:
                histogram = self.metrics.http_duration.labels(route, method)
                self._histograms[(route, method)] = histogram
            histogram.observe(elapsed)


async def _send_json(send: Send, status: int, detail: str, headers: list | None = None) -> None:
    """Answer with ``{"detail": ...}`` from a middleware (the app never sees the request)."""
    body = json.dumps({"detail": detail}).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *(headers or []),
        ],
    })
    await send({"type": "http.response.body", "body": body})


class BearerAuthMiddleware:
    """401 for POST/PUT/PATCH/DELETE without ``Authorization: Bearer <token>``, if one is set.

    One rule for every mutating route, so a new route cannot forget it. Reads stay open unless
    ``protect_reads``: then the API's GET routes (``/v1/...``) need the token too, while the
    probes (``/healthz``, ``/readyz``), ``/metrics`` and the OpenAPI pages stay open for
    orchestrators, Prometheus and people. A model's export always needs it: its bytes answer
    every prediction, which POST predict keeps behind the token.
    """

    MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})

    def __init__(self, app: ASGIApp, token: SecretStr | None, protect_reads: bool = False) -> None:
        self.app = app
        self.expected = None if token is None else token.get_secret_value().encode()
        self.protect_reads = protect_reads

    def _needs_token(self, scope: Scope) -> bool:
        if self.expected is None or scope["type"] != "http":
            return False
        if scope["method"] in self.MUTATING or _is_model_action(scope["path"], "export"):
            return True
        return self.protect_reads and scope["path"].startswith("/v1/")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._needs_token(scope):
            await self.app(scope, receive, send)
            return
        given = b""
        for key, value in scope["headers"]:
            if key == b"authorization":
                scheme, _, credentials = value.partition(b" ")
                if scheme.lower() == b"bearer":
                    given = credentials.strip()
                break
        # compare_digest: the time taken does not reveal how much of the token matched.
        if hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        await _send_json(
            send, 401,
            "missing or invalid bearer token (Authorization: Bearer <GLN_API_TOKEN>)",
            [(b"www-authenticate", b"Bearer")],
        )


def _is_model_action(path: str, action: str) -> bool:
    """Whether ``path`` is ``/v1/models/<name>/<action>`` (the middlewares run before routing)."""
    name, slash, rest = path.removeprefix("/v1/models/").partition("/")
    return path.startswith("/v1/models/") and bool(name) and slash == "/" and rest == action


def _route_template(scope: Scope, routes: Sequence[BaseRoute]) -> str:
    """``/v1/models/{name}/learn``, never the concrete path (bounded label values)."""
    route = scope.get("route")
    if route is not None:
        return str(getattr(route, "path", "unmatched"))
    # The router did not run (e.g. the body limit refused the request): match by hand.
    for candidate in routes:
        match, _ = candidate.matches(scope)
        if match != Match.NONE:
            return str(getattr(candidate, "path", "unmatched"))
    return "unmatched"


# Methods none of whose routes take a body: any body is refused, not buffered.
_BODILESS_METHODS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})
# A body over this counts against ``max_large_bodies``.
LARGE_BODY_BYTES = 1024 * 1024
# A declared body up to this is awaited without a deadline for its first piece.
SMALL_BODY_BYTES = 64 * 1024


class BodyLimitMiddleware:
    """413 for a request body over its limit, before the app sees any of it; 408 for a body
    that stops arriving; and at most ``max_large_bodies`` large bodies in the app at once.

    A declared Content-Length over the limit is refused without reading. Otherwise the body
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
                 max_buffered_bytes: int | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.import_max_bytes = import_max_bytes
        self.timeout_s = timeout_s
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
            await _refuse_body(send, limit, setting)
            return
        held = 0  # what this request counts in ``buffered``, given back however it ends
        try:
            chunks: list[bytes] = []
            # A small declared body's first piece is awaited with no deadline: it holds little
            # (counted in ``buffered`` all the same), and a deadline per request cost a few
            # percent of a small learn. Every later piece, and any larger body, has one.
            patient = chunked or declared > SMALL_BODY_BYTES
            while True:
                if patient:
                    try:
                        async with asyncio.timeout(self.timeout_s):
                            message = await receive()
                    except TimeoutError:
                        await _send_json(
                            send, 408, f"request body incomplete after {self.timeout_s:g} s "
                            "without data (GLN_BODY_TIMEOUT_S)", [(b"connection", b"close")])
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
                    await _send_json(
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

    def _limit(self, scope: Scope) -> tuple[int, str]:
        """The largest body this request may have, and the setting that says so."""
        # Only a POST is an import: any other method on that path (which no one need be
        # authorised for) keeps the small limit, else it could make the server buffer a GiB.
        method, path = scope["method"], scope["path"]
        if method == "POST" and _is_model_action(path, "import"):
            return self.import_max_bytes, "GLN_MAX_MODEL_BYTES"
        if method in _BODILESS_METHODS:
            return 0, f"{method} takes no body"
        if method == "POST" and _is_model_action(path, "snapshot"):
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
    await _send_json(
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

