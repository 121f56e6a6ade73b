"""``gln-service`` with ``GLN_WORKERS`` > 1: one engine process, many HTTP worker processes.

The engine process (:mod:`service.engine.process`) holds the models, the log and the
snapshots; the workers (:mod:`service.api.worker`, started by uvicorn's process manager on
the listening sockets bound here) parse and check requests and call it over a Unix socket.
A worker that dies is replaced by uvicorn. An engine that dies is what a crash of the single
process is: it is started again, replays the log, and nothing acknowledged is lost; the calls
it had in flight are answered 503. On SIGTERM the workers finish their open requests first,
then the engine drains its queues and snapshots what changed; the exit status is the
engine's (0: every snapshot written, 1: some failed, 3: it could not start).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import shutil
import socket
import sys
import tempfile
import threading
from multiprocessing.connection import Connection

import uvicorn
from uvicorn.supervisors import Multiprocess

from service.api.listen import server_options
from service.api.worker import ENGINE_ADDRESS, METRICS_DIR
from service.engine.process import STARTUP_FAILED, run_engine
from service.settings import Settings

log = logging.getLogger("service")

ENGINE_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [engine]: %(message)s"
# How long the engine may take to open its store and log before gln-service gives up on it
# (restoring the models comes after: /readyz reports it).
ENGINE_START_TIMEOUT_S = 120.0


def _engine_main(settings: Settings, address: str, ready: object) -> None:
    sys.exit(run_engine(settings, address, ready, ENGINE_LOG_FORMAT))  # type: ignore[arg-type]


class EngineProcess:
    """The engine process, started, watched and restarted if it dies, stopped on request."""

    def __init__(self, settings: Settings, address: str) -> None:
        self.settings = settings
        self.address = address
        self._context = multiprocessing.get_context("spawn")
        self._process: multiprocessing.process.BaseProcess | None = None
        self._control: Connection | None = None  # says "stop"; the engine says when it serves
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

    def start(self) -> str | None:
        """Start it and wait until it serves; why it could not (None: it serves)."""
        control, engine_end = self._context.Pipe()
        process = self._context.Process(target=_engine_main, name="gln-engine",
                                        args=(self.settings, self.address, engine_end))
        process.start()
        engine_end.close()
        self._process, self._control = process, control
        if not control.poll(ENGINE_START_TIMEOUT_S):
            process.kill()
            return f"the engine process did not start in {ENGINE_START_TIMEOUT_S:.0f} s"
        try:
            why = control.recv()
        except EOFError:
            process.join()
            why = f"the engine process exited with status {process.exitcode} as it started"
        return why

    def watch(self) -> None:
        """Restart the engine whenever it dies, until :meth:`stop` (in a thread of its own)."""
        self._watcher = threading.Thread(target=self._keep_alive, name="gln-engine-watch",
                                         daemon=True)
        self._watcher.start()

    def _keep_alive(self) -> None:
        while not self._stopping.wait(0.2):
            process = self._process
            if process is None or process.is_alive():
                continue
            log.error("the engine process died (exit status %s); starting it again: it "
                      "replays the log, and requests get 503 until it serves",
                      process.exitcode)
            why = self.start()
            if why is not None:
                log.error("the engine process could not start again: %s", why)
                self._stopping.wait(1.0)

    def stop(self) -> int:
        """Tell it to stop and wait for it to snapshot; its exit status."""
        self._stopping.set()
        if self._watcher is not None:
            self._watcher.join()
        process = self._process
        if process is None:
            return STARTUP_FAILED
        if process.is_alive() and self._control is not None:
            with contextlib.suppress(OSError):  # it is exiting already
                self._control.send("stop")
        process.join()
        return process.exitcode if process.exitcode is not None else 1


def serve_with_workers(settings: Settings, listeners: list[socket.socket]) -> int:
    """Serve with one engine process and ``settings.workers`` HTTP workers; exit status."""
    runtime = tempfile.mkdtemp(prefix="gln-service-")
    metrics_dir = os.path.join(runtime, "metrics")
    os.mkdir(metrics_dir)
    engine = EngineProcess(settings, f"ipc://{runtime}/engine.sock")
    try:
        why = engine.start()
        if why is not None:
            print(f"gln-service: {why}", file=sys.stderr)
            return STARTUP_FAILED
        engine.watch()
        os.environ[ENGINE_ADDRESS] = engine.address
        os.environ[METRICS_DIR] = metrics_dir
        config = uvicorn.Config("service.api.worker:create_worker_app", factory=True,
                                workers=settings.workers, **server_options(settings))
        Multiprocess(config, sockets=listeners).run()
    finally:
        status = engine.stop()
        shutil.rmtree(runtime, ignore_errors=True)
    return status
