"""``python -m service`` / ``gln-service``: run the service under uvicorn.

Configuration comes from ``GLN_*`` environment variables (see :mod:`service.settings`); the
flags below override the most common ones. One process, one worker: models live in this
process's memory, so more workers would mean separate, diverging copies of each model.

SIGTERM (or Ctrl-C) shuts down gracefully: uvicorn stops accepting connections, lets open
requests finish, then the app's lifespan drains every learn queue and snapshots every model
that changed. The exit status is 1 if any of those snapshots failed, else 0.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import resource
import signal
import sys
from types import FrameType

import uvicorn
from pydantic import ValidationError

from gln.backend import resolve_device
from service.api import slow_clients
from service.api.app import create_app
from service.api.listen import bind_listeners, server_options
from service.api.request_id import LOG_FORMAT, RequestIdLogFilter
from service.engine.local import open_log
from service.settings import Settings, unknown_variables
from service.storage.dir_lock import DirectoryInUseError, lock_data_directories
from service.storage.wal import WalDurabilityError
from service.supervisor import serve_with_workers


def main(argv: list[str] | None = None) -> int:
    """Parse flags, build the app, serve until SIGTERM/SIGINT; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="gln-service",
        description="Gated Linear Networks as an online-learning HTTP service. Configure with "
        "GLN_* environment variables (GLN_HOST, GLN_PORT, GLN_DEVICE, GLN_REDIS_URL, "
        "GLN_SNAPSHOT_DIR, GLN_SNAPSHOT_INTERVAL_S, GLN_API_TOKEN, GLN_MAX_BODY_BYTES, ...).",
    )
    parser.add_argument("--host", help="override GLN_HOST")
    parser.add_argument("--port", type=int, help="override GLN_PORT")
    parser.add_argument("--log-level", help="override GLN_LOG_LEVEL")
    args = parser.parse_args(argv)

    overrides = {k: v for k, v in vars(args).items() if v is not None}
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        print(f"gln-service: invalid configuration:\n{_settings_errors(exc)}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), format=LOG_FORMAT)
    for handler in logging.getLogger().handlers:
        handler.addFilter(RequestIdLogFilter())
    try:  # a server that cannot build a model must not start and blame its clients for it
        device = resolve_device(settings.device)
    except ValueError as exc:
        print(f"gln-service: GLN_DEVICE={settings.device}: {exc}", file=sys.stderr)
        return 2
    try:  # before the start-up restores anything: a taken port is one line, at once
        listeners = bind_listeners(settings.host, settings.port)
    except OSError as exc:
        print(f"gln-service: cannot listen on {settings.host}:{settings.port}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return 3
    log = logging.getLogger("service")
    for warning in unknown_variables(os.environ):
        log.warning("%s", warning)
    log.info("%s", settings.summary(device))
    if settings.workers > 1:
        for name, value in overrides.items():  # the workers read their settings anew
            os.environ[f"GLN_{name.upper()}"] = str(value)
        return serve_with_workers(settings, listeners)
    app = create_app(settings)
    try:  # here, not in the app's start-up, so that a taken directory is one line, no traceback
        app.state.directory_locks = lock_data_directories(settings)
    except DirectoryInUseError as exc:
        print(f"gln-service: {exc}", file=sys.stderr)
        return 3
    except OSError as exc:
        print(f"gln-service: cannot use {exc.filename} as a data directory (GLN_SNAPSHOT_DIR, "
              f"GLN_WAL_DIR): {exc.strerror}", file=sys.stderr)
        return 2
    try:  # likewise: a log that cannot give the durability asked for is one line, not a traceback
        app.state.opened_log = open_log(settings)
    except WalDurabilityError as exc:
        print(f"gln-service: {exc}", file=sys.stderr)
        return 3
    _raise_open_files_limit()
    _tune_gc()
    # uvicorn handles SIGTERM/SIGINT while serving (graceful shutdown), then restores the
    # previous handlers and raises the signal again. Installing these first makes that final
    # re-raise a no-op, so a graceful stop exits with our status instead of "killed by 15".
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _after_graceful_stop)
    config = uvicorn.Config(app, **server_options(settings))
    slow_clients.header_timeout_s = settings.header_timeout_s
    server = uvicorn.Server(config)
    server.run(sockets=listeners)
    if not server.started:  # its start-up failed, and said why in the log
        return 3
    return 0 if app.state.shutdown_clean is not False else 1


# Settings whose values are not repeated in an error: a Redis or NATS URL may carry a password.
SECRET_SETTINGS = frozenset({"redis_url", "wal_url", "api_token"})


def _settings_errors(exc: ValidationError) -> str:
    """One line per wrong setting, named as its environment variable (pydantic's own message
    is a traceback-sized block per error)."""
    lines = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"])
        message = error["msg"].removeprefix("Value error, ")  # pydantic's, for our own checks
        if field in SECRET_SETTINGS:  # its value may hold a password: never echo it
            lines.append(f"  GLN_{field.upper()}: {message}")
        elif field:
            lines.append(f"  GLN_{field.upper()}: {message} (got {error.get('input')!r})")
        else:  # a rule across settings; its message names them
            lines.append(f"  {message}")
    return "\n".join(lines)


def _tune_gc() -> None:
    """Make the garbage collector's pauses rare and short; they were this server's p99.

    With CPython's default thresholds (700, 10, 10), the objects of the ~32 requests in flight
    survive the frequent young collections, get promoted, and keep triggering full
    collections of the whole heap (imports, compiled kernels): 70-100 ms pauses several times
    a second under load. A young generation of 50,000 objects lets request garbage die before
    it is collected, and freezing what start-up allocated keeps it out of every later pass.
    Measured with benchmarks/service_load.py (small model, single-example learn, 32
    connections, 2 cores): p99 105 ms -> 36 ms, and ~10 % more requests/s.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def _raise_open_files_limit() -> None:
    """Let the process open as many files as its hard limit allows: each connection is one,
    and uvicorn keeps idle ones open, so the usual soft limit of 1,024 let that many idle
    sockets shut every client out (without a word in the log)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _after_graceful_stop(signum: int, frame: FrameType | None) -> None:
    logging.getLogger("service").info("stopped by %s", signal.Signals(signum).name)


if __name__ == "__main__":
    sys.exit(main())
