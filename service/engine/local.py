"""The engine in this process: the store, the log, the registry and its periodic tasks.

``LocalEngine`` answers :class:`service.engine.client.EngineClient` by calling the registry
directly. ``start`` opens the store and the log (a log that cannot give the configured
durability refuses to start), starts restoring every stored model in the background and the
periodic snapshots and label expiry; ``close`` stops them, lets every model's queued requests
finish, snapshots what changed and closes the store and the log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from service.engine.client import Labels, Rows, snapshot_answer
from service.engine.learn_answers import LearnResult
from service.engine.long_lived import frozen_survivors
from service.engine.registry import ModelRegistry
from service.metrics import ServiceMetrics
from service.settings import Settings
from service.storage.dir_lock import DirectoryLock, lock_data_directories
from service.storage.store import open_store
from service.storage.wal import WalDurabilityError, WriteAheadLog, open_wal

log = logging.getLogger(__name__)

STORE_THREADS = 2  # snapshots are written one model at a time each; two keep one slow save apart


class LocalEngine:
    """The models of this process, served through the engine interface."""

    def __init__(self, settings: Settings, metrics: ServiceMetrics,
                 opened_log: WriteAheadLog | None = None,
                 directory_locks: list[DirectoryLock] | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        # Opened and checked by the host, if it did (open_log); the data directories locked by
        # the host, if it did (gln-service does, to refuse a taken one in one line).
        self._opened_log = opened_log
        self._host_locked = directory_locks is not None
        self._locks: list[DirectoryLock] = []
        self.registry: ModelRegistry | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._closables: list[Any] = []
        self._executor: ThreadPoolExecutor | None = None
        self._store_executor: ThreadPoolExecutor | None = None
        self._read_executor: ThreadPoolExecutor | None = None
        self._frozen = False  # frozen_survivors installed by start

    # -- lifecycle --
    async def start(self) -> None:
        """Open the store and the log, then restore and snapshot in the background."""
        settings = self.settings
        if not self._host_locked:
            self._locks = await asyncio.to_thread(lock_data_directories, settings)
        self._executor = ThreadPoolExecutor(settings.worker_threads,
                                            thread_name_prefix="gln-worker")
        self._store_executor = ThreadPoolExecutor(STORE_THREADS, thread_name_prefix="gln-store")
        self._read_executor = ThreadPoolExecutor(settings.worker_threads,
                                                 thread_name_prefix="gln-read")
        store = open_store(settings.redis_url, settings.snapshot_dir,
                           key_prefix=settings.redis_key_prefix, keep=settings.snapshot_keep)
        wal = self._opened_log
        if wal is None:
            wal = await asyncio.to_thread(open_log, settings)
        # Without a log, the one it would be is still opened: deleting a model deletes its log
        # there too, so that turning the log back on cannot replay a deleted model's entries.
        ignored = None if settings.wal_enabled else await asyncio.to_thread(_log_of, settings)
        self._closables = [c for c in (store, wal, ignored) if c is not None]
        registry = ModelRegistry(store, settings, self.metrics, self._executor, wal, ignored,
                                 self._store_executor, self._read_executor)
        self.registry = registry
        frozen_survivors.install()
        self._frozen = True
        self._tasks = [
            asyncio.create_task(self._restore(registry), name="gln-restore"),
            asyncio.create_task(registry.snapshot_periodically(settings.snapshot_interval_s),
                                name="gln-snapshots"),
            asyncio.create_task(
                registry.expire_labels_periodically(min(5.0, settings.label_ttl_s / 2)),
                name="gln-label-expiry"),
        ]

    @staticmethod
    async def _restore(registry: ModelRegistry) -> None:
        """Restore every stored model, then freeze what that made (``long_lived``)."""
        await registry.restore_all()
        frozen_survivors.freeze_now()

    async def close(self) -> bool:
        """Drain every queue and snapshot what changed; False if any snapshot failed."""
        if self.registry is not None:
            self.registry.stop_periodic_work()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        clean = True
        if self.registry is not None:
            clean = await self.registry.close()
            if clean:
                log.info("shutdown: snapshots written (what they lack is in the log)"
                         if self.registry.wal is not None else
                         "shutdown: every changed model snapshotted")
            else:
                log.error("shutdown: some snapshots failed; %s", (
                    "the write-ahead log holds their acknowledged learning, which the next "
                    "start replays" if self.registry.wal is not None else
                    "their learning since their last snapshot is lost (GLN_WAL_ENABLED=false)"))
        for closable in self._closables:
            await asyncio.to_thread(closable.close)
        for executor in (self._executor, self._store_executor, self._read_executor):
            if executor is not None:
                await asyncio.to_thread(executor.shutdown, wait=True)
        for lock in self._locks:
            lock.release()
        if self._frozen:
            self._frozen = False
            frozen_survivors.uninstall()
        return clean

    @property
    def _models(self) -> ModelRegistry:
        assert self.registry is not None, "the engine has not started"
        return self.registry

    # -- models --
    async def create(self, name: str, config: dict[str, Any],
                     replace_unrestored: bool = False) -> dict[str, Any]:
        return (await self._models.create(name, config, replace_unrestored)).describe()

    async def import_model(self, name: str, blob: bytes) -> dict[str, Any]:
        return (await self._models.import_model(name, blob)).describe()

    async def export(self, name: str) -> memoryview:
        return await self._models.export(name)

    async def delete(self, name: str) -> None:
        await self._models.delete(name)

    async def list_models(self) -> list[dict[str, Any]]:
        return [served.describe() for served in await self._models.restored_models()]

    async def info(self, name: str) -> dict[str, Any]:
        return (await self._models.get(name)).describe()

    async def snapshot(self, name: str) -> dict[str, Any]:
        return snapshot_answer(await self._models.snapshot(name))

    # -- data --
    async def learn(
        self, name: str, features: Rows, labels: Labels, key: str | None = None
    ) -> LearnResult:
        return await self._models.learn(name, features, labels, key)

    async def predict(
        self, name: str, features: Rows, ids: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        return await self._models.predict(name, features, ids)

    async def labels(
        self, name: str, ids: Sequence[str], labels: Labels
    ) -> tuple[LearnResult | None, list[str]]:
        return await self._models.labels(name, ids, labels)

    async def explain(self, name: str, features: Rows) -> np.ndarray:
        return await self._models.explain(name, features)

    # -- operations --
    async def readiness(self) -> list[str]:
        return await self._models.readiness_problems()

    async def metrics_text(self) -> bytes:
        if self.registry is not None:
            await self.registry.store_reachable()  # gln_store_up as of this scrape
        # In a thread: the page of many models takes a while, and the loop serves on.
        return await asyncio.to_thread(self.metrics.render)


def open_log(settings: Settings) -> WriteAheadLog | None:
    """The write-ahead log the settings ask for (None when disabled), checked.

    A server that cannot give the configured durability refuses to start
    (WalDurabilityError); one that cannot be reached yet is checked at the first append.
    ``gln-service`` opens it before it serves, so that a refusal is one line, and hands it to
    the engine, which opens its own only for hosts that do not.
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
        replicas=settings.wal_replicas, call_timeout_s=settings.wal_timeout_s,
        wal_url=settings.wal_url, stream_replicas=settings.wal_stream_replicas,
    )
