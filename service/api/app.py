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

Pure-ASGI middlewares wrap the app, outermost first, each in a module of its own: a trailing
slash dropped from the path (``service.api.trailing_slash``), the request's metrics
(``service.api.request_metrics``), its id (``service.api.request_id``), the answer to a request
cancelled by a shutdown (``service.api.shutdown_answer``), the Host header
(``service.api.host_check``), the bearer token (``service.api.auth``) and the body's size and pace
(``service.api.body_limit``). Pure ASGI because they run on every request: a FastAPI dependency or
``BaseHTTPMiddleware`` costs far more per call. Errors are answered by
``service.api.error_handlers``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import FastAPI

from service.api.auth import BearerAuthMiddleware
from service.api.body_limit import BodyLimitMiddleware
from service.api.error_handlers import add_error_handlers
from service.api.host_check import HostCheckMiddleware, allowed_hosts_for
from service.api.request_id import RequestIdMiddleware
from service.api.request_metrics import RequestMetricsMiddleware
from service.api.routes import router
from service.api.shutdown_answer import ShutdownAnswerMiddleware
from service.api.trailing_slash import TrailingSlashMiddleware
from service.engine.registry import ModelRegistry
from service.metrics import ServiceMetrics, package_version
from service.settings import Settings
from service.storage.dir_lock import lock_data_directories
from service.storage.store import open_store
from service.storage.wal import WalDurabilityError, WriteAheadLog, open_wal

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
    app.state.opened_log = None  # the log its host opened and checked, if it did (open_log)
    # The routes join the app's own list, ahead of FastAPI's documentation routes (the data
    # routes are the hot ones, and routes are matched in order), rather than through
    # include_router: FastAPI matches an included router's routes through a layer of its own,
    # twice per request, which cost more than the rest of the routing.
    app.router.routes[:0] = router.routes
    add_error_handlers(app)
    # The last added is the outermost: metrics see every answer, including the guards' 401
    # and 413; the token is checked before a byte of the body is read.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes,
                       import_max_bytes=settings.import_max_bytes,
                       timeout_s=settings.body_timeout_s,
                       max_large_bodies=settings.max_large_bodies,
                       max_buffered_bytes=settings.buffered_bytes_limit)
    app.add_middleware(BearerAuthMiddleware, token=settings.api_token,
                       protect_reads=settings.token_for_reads)
    # Outside the body limit: a request waiting for its turn to be parsed is answered too.
    app.add_middleware(ShutdownAnswerMiddleware)
    app.add_middleware(HostCheckMiddleware, allowed=allowed_hosts_for(
        settings.host, settings.allowed_host_names))
    app.add_middleware(RequestIdMiddleware)
    app.add_middleware(
        RequestMetricsMiddleware, metrics=app.state.metrics, routes=list(router.routes)
    )
    # Outermost: every layer below, routing included, sees the path without its slash.
    app.add_middleware(TrailingSlashMiddleware)
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
    """Serve with the data directories locked (``service.storage.dir_lock``): by this app,
    unless its host locked them already (``gln-service`` does, to refuse a taken one in one
    line)."""
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
    wal = app.state.opened_log
    if wal is None:
        wal = await asyncio.to_thread(open_log, settings)
    # Without a log, the one it would be is still opened: deleting a model deletes its log
    # there too, so that turning the log back on cannot replay a deleted model's entries.
    ignored_log = None if settings.wal_enabled else await asyncio.to_thread(_log_of, settings)
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


def open_log(settings: Settings) -> WriteAheadLog | None:
    """The write-ahead log the settings ask for (None when disabled), checked.

    A server that cannot give the configured durability refuses to start
    (WalDurabilityError); one that cannot be reached yet is checked at the first append.
    ``gln-service`` opens it before it serves, so that a refusal is one line, and hands it to
    the app (``app.state.opened_log``), which opens its own only for hosts that do not.
    """
    if not settings.wal_enabled:
        return None
    wal = _log_of(settings)
    try:
        wal.check_durability()
    except WalDurabilityError:
        wal.close()
        raise
    except Exception as exc:  # unreachable: the first append checks again
        log.warning("could not check the log's durability at start-up: %s", exc)
    return wal


def _log_of(settings: Settings) -> WriteAheadLog:
    """The write-ahead log that enabled ``settings`` describe, opened, not yet checked."""
    return open_wal(
        settings.redis_url, settings.wal_dir or settings.snapshot_dir,
        key_prefix=settings.redis_key_prefix, durability=settings.wal_durability,
        idempotency_ttl_s=settings.idempotency_ttl_s, fsync=settings.wal_fsync,
        replicas=settings.wal_replicas,
    )
