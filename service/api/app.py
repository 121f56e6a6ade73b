"""The FastAPI app factory and its lifespan.

``create_app(settings, engine)`` builds one self-contained app: its own settings, metrics
registry and engine, all on ``app.state``. Nothing lives in module globals, so tests can run
several apps side by side. The engine (``service.engine``) is started with the app and closed
with it: start-up opens the store and the log and restores the stored models in the
background (``/readyz`` answers 503 until that is done, ``/healthz`` at once); shutdown (after
open requests finish) lets every queued request finish and snapshots every model that changed.
``app.state.shutdown_clean`` records whether that all succeeded.

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

import contextlib
import functools
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI

from service.api.auth import BearerAuthMiddleware
from service.api.body_limit import BodyLimitMiddleware
from service.api.docs_page import add_docs_page
from service.api.error_handlers import add_error_handlers
from service.api.host_check import HostCheckMiddleware, allowed_hosts_for
from service.api.kserve import router as kserve_router
from service.api.request_id import RequestIdMiddleware
from service.api.request_metrics import RequestMetricsMiddleware
from service.api.routes import router
from service.api.shutdown_answer import ShutdownAnswerMiddleware
from service.api.stream import router as stream_router
from service.api.trailing_slash import TrailingSlashMiddleware
from service.engine.client import EngineClient
from service.engine.local import LocalEngine
from service.metrics import ServiceMetrics, package_version
from service.settings import Settings

log = logging.getLogger(__name__)

# FastAPI's native OpenTelemetry hooks, all off: this service exports Prometheus metrics
# (service.metrics), and left on, FastAPI asks the global OpenTelemetry providers on every
# request whether they have been configured.
NO_TELEMETRY = {"tracing": False, "metrics": False, "logs": False, "operation_spans": False}


def create_app(settings: Settings | None = None, engine: EngineClient | None = None) -> FastAPI:
    """Build the service app; ``settings`` defaults to the ``GLN_*`` environment, ``engine``
    to one in this process, started and closed with the app."""
    settings = settings or Settings()
    app = FastAPI(
        title="gln-service",
        version=package_version(),
        summary="Gated Linear Networks that learn online, one example at a time, over HTTP.",
        lifespan=_lifespan,
        telemetry=NO_TELEMETRY,
        docs_url=None,  # add_docs_page: Swagger UI from the package, not a CDN
        redoc_url=None,  # ReDoc has no bundled copy; /docs shows the same schema
    )
    app.state.settings = settings
    app.state.metrics = ServiceMetrics(device=settings.device,
                                       models_with_series=settings.metrics_models)
    app.state.engine = engine
    # The /metrics page: this process's engine renders every metric, the HTTP ones included;
    # a worker of another process's engine adds the workers' HTTP metrics to the engine's.
    app.state.metrics_page = _engine_metrics
    app.state.shutdown_clean = None
    app.state.directory_locks = None  # held by the host, if it locked them before serving
    app.state.opened_log = None  # the log its host opened and checked, if it did (open_log)
    # The routes join the app's own list, ahead of FastAPI's documentation routes (the data
    # routes are the hot ones, and routes are matched in order), rather than through
    # include_router: FastAPI matches an included router's routes through a layer of its own,
    # twice per request, which cost more than the rest of the routing.
    app.router.routes[:0] = [*router.routes, *stream_router.routes, *kserve_router.routes]
    add_error_handlers(app)
    add_docs_page(app)
    # The last added is the outermost: metrics see every answer, including the guards' 401
    # and 413; the token is checked before a byte of the body is read.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes,
                       import_max_bytes=settings.import_max_bytes,
                       timeout_s=settings.body_timeout_s,
                       max_large_bodies=settings.max_large_bodies,
                       max_buffered_bytes=settings.buffered_bytes_limit,
                       min_bytes_per_s=settings.min_body_bytes_per_s)
    app.add_middleware(BearerAuthMiddleware, token=settings.api_token,
                       protect_reads=settings.token_for_reads)
    # Outside the body limit: a request waiting for its turn to be parsed is answered too.
    app.add_middleware(ShutdownAnswerMiddleware)
    app.add_middleware(HostCheckMiddleware, allowed=allowed_hosts_for(
        settings.host, settings.allowed_host_names))
    app.add_middleware(RequestIdMiddleware)
    app.add_middleware(
        RequestMetricsMiddleware, metrics=app.state.metrics,
        routes=[*router.routes, *kserve_router.routes]
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


async def _engine_metrics(engine: EngineClient) -> bytes:
    return await engine.metrics_text()


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Serve with the engine started: the one given to :func:`create_app` (another process's,
    through :class:`service.engine.ipc.RemoteEngine`), else one of this process's own
    (:class:`service.engine.local.LocalEngine`), which locks the data directories unless its
    host locked them already (``gln-service`` does, to refuse a taken one in one line)."""
    engine = app.state.engine
    if engine is None:
        engine = LocalEngine(app.state.settings, app.state.metrics, app.state.opened_log,
                             app.state.directory_locks)
    await engine.start()
    app.state.engine = engine
    try:
        yield
    finally:
        app.state.shutdown_clean = await engine.close()
