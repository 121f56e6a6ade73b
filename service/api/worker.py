"""An HTTP worker of ``gln-service`` with ``GLN_WORKERS`` > 1: the HTTP face alone, in a
process of its own, calling the engine process through
:class:`service.engine.ipc.RemoteEngine`.

uvicorn starts each worker (and a new one for any that dies) and calls
:func:`create_worker_app`, which reads where the engine listens and where the workers count
their HTTP metrics from the variables ``gln-service`` set for it.
"""

from __future__ import annotations

import logging
import os

from fastapi import FastAPI

from service.api import slow_clients
from service.api.app import create_app
from service.api.request_id import LOG_FORMAT, RequestIdLogFilter
from service.engine.client import EngineClient
from service.engine.ipc import RemoteEngine
from service.metrics import count_across_processes, workers_http_metrics
from service.settings import Settings

# Set by gln-service for its workers: the engine's socket, and the workers' metrics directory.
ENGINE_ADDRESS = "GLN_ENGINE_ADDRESS"
METRICS_DIR = "GLN_WORKERS_METRICS_DIR"


def create_worker_app() -> FastAPI:
    """(worker process) The app of one HTTP worker, configured by the environment."""
    metrics_dir = os.environ[METRICS_DIR]
    count_across_processes(metrics_dir)  # before the app makes its metrics
    settings = Settings()
    slow_clients.header_timeout_s = settings.header_timeout_s
    logging.basicConfig(level=settings.log_level.upper(), format=LOG_FORMAT)
    for handler in logging.getLogger().handlers:
        handler.addFilter(RequestIdLogFilter())
    app = create_app(settings, RemoteEngine(os.environ[ENGINE_ADDRESS]))

    async def page(engine: EngineClient) -> bytes:
        return await engine.metrics_text() + workers_http_metrics(metrics_dir)

    app.state.metrics_page = page
    return app
