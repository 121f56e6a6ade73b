"""The engine as a process of its own (``GLN_WORKERS`` > 1): one per device, serving the HTTP
workers through :class:`service.engine.ipc.EngineServer`.

:func:`run_engine` is what ``gln-service`` starts: it opens the log (refusing a log that cannot
give the configured durability), locks the data directories, starts a
:class:`~service.engine.local.LocalEngine`, reports ready (or why not) on ``ready``, and serves
until SIGTERM; then it answers the calls in flight, drains every queue and snapshots what
changed. Its exit status is 0 when every snapshot succeeded, 1 if any failed, 3 if it could
not start.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from multiprocessing.connection import Connection

from service.engine.ipc import EngineServer
from service.engine.local import LocalEngine, open_log
from service.metrics import ServiceMetrics
from service.settings import Settings
from service.storage.dir_lock import DirectoryLock, lock_data_directories
from service.storage.wal import WalDurabilityError, WriteAheadLog

log = logging.getLogger("service.engine")

STARTUP_FAILED = 3


def run_engine(settings: Settings, address: str, control: Connection, log_format: str) -> int:
    """(engine process) Serve the models at ``address`` until told to stop on ``control``
    (which is told None once it serves, or why it cannot); the exit status."""
    logging.basicConfig(level=settings.log_level.upper(), format=log_format)
    try:
        locks = lock_data_directories(settings)
        opened_log = open_log(settings)
    except (WalDurabilityError, OSError, RuntimeError) as exc:
        control.send(f"{exc}")
        return STARTUP_FAILED
    try:
        return asyncio.run(_serve(settings, address, control, opened_log, locks))
    finally:
        for lock in locks:
            lock.release()


async def _serve(settings: Settings, address: str, control: Connection,
                 opened_log: WriteAheadLog | None, locks: list[DirectoryLock]) -> int:
    metrics = ServiceMetrics(device=settings.device, http=False,
                             models_with_series=settings.metrics_models)
    engine = LocalEngine(settings, metrics, opened_log, locks)
    await engine.start()
    server = EngineServer(engine, address)
    stop = asyncio.Event()
    # gln-service says when to stop, on ``control``, once its workers have finished their
    # requests (or the pipe closes: gln-service is gone). A SIGTERM or Ctrl-C sent to the whole
    # process group (systemd, a terminal) reaches this process too, while the workers still
    # need it.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    asyncio.get_running_loop().add_reader(control.fileno(), stop.set)
    serving = asyncio.create_task(server.serve(), name="gln-engine-server")
    control.send(None)  # serving
    log.info("engine (pid %d) serving at %s", os.getpid(), address)
    await stop.wait()
    serving.cancel()
    await asyncio.gather(serving, return_exceptions=True)
    await server.drain()
    clean = await engine.close()
    server.close()
    return 0 if clean else 1
