"""All models of one app: create, find, delete, restore and snapshot them; data requests.

Each model is a :class:`service.engine.served_model.ServedModel` (its queue, single writer, log and
snapshots); this module owns the names: creating and deleting models within the server's
limits, restoring every stored model (snapshot, then the log's tail) at start-up, periodic
snapshots, validating requests against a model before they join its queue, and delayed labels.

Errors the HTTP layer should show to the client are :class:`service.errors.RegistryError`
subclasses that carry their status code; routes never translate exceptions themselves.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from gln import GLN, FamilyMember
from gln.backend import resolve_device
from service.engine import memory
from service.engine.client import Labels, Rows
from service.engine.families import Families
from service.engine.learn_answers import LearnResult
from service.engine.passes import Passes
from service.engine.served_model import ServedModel, StoredModel
from service.engine.snapshot_blob import WAL_ID, split_snapshot
from service.engine.waiting_rows import WaitingRow
from service.errors import (
    InvalidRequest,
    LimitExceeded,
    ModelExists,
    ModelNotFound,
    Unavailable,
)
from service.log_throttle import Throttled
from service.metrics import ServiceMetrics
from service.settings import Settings
from service.storage.store import SnapshotInfo, SnapshotStore
from service.storage.wal import ModelListing, WalDurabilityError, WriteAheadLog

__all__ = ["ModelRegistry"]

log = logging.getLogger(__name__)

T = TypeVar("T")
Model = GLN | FamilyMember  # a served model: a GLN of its own, or a member of its family
# Store failures repeat with every request while the store is down (a snapshot's POST, say).
throttled = Throttled(log)
# How long a ping's answer stands for every caller (probes, restore's retries).
PING_REUSE_S = 1.0
# A 503's words for a store that failed: what it was, not its message (which may name paths).
_UNAVAILABLE = "snapshot store unavailable ({}); see the service log"


def _shape_of(model: GLN) -> str:
    """A model's size in words, for the log lines of its creation."""
    size = (f"{model.nbytes / 2**20:.1f} MiB" if model.nbytes >= 2**20
            else f"{model.nbytes / 2**10:.1f} KiB")
    return (f"{model.num_features} features, {model.num_classes} classes, layers "
            f"{list(model.layer_sizes)}, {size}")


def _store_failed(what: str, name: str, exc: Exception) -> Unavailable:
    """Log a failed store call in one line (a store that is down is no bug: its traceback
    only at debug level); the 503 to answer it with."""
    throttled.warning(f"{what} {name}", f"{what}: %s: %s", name, type(exc).__name__, exc,
                      exc_info=log.isEnabledFor(logging.DEBUG))
    return Unavailable(_UNAVAILABLE.format(type(exc).__name__))

# An import's counters stay below half of what a snapshot may hold (gln.serialize.MAX_COUNT,
# 2**62), so that no learning a server could ever do takes them past it: a model that learned
# past it would be saved in snapshots that no later start-up loads.
IMPORT_MAX_COUNT = 1 << 61
# What a client may put in a model's config: GLN's arguments, less the server's own choices
# (the device) and the library's test switch (use_kernels, which a snapshot does not keep).
CONFIG_KEYS = frozenset(inspect.signature(GLN).parameters) - {"device", "use_kernels"}

# Requests with more numbers than this are converted and checked in a thread, not the loop.
_INLINE_CHECK_VALUES = 20_000
# Models restored, closed or snapshotted at once: enough to keep the store's threads and the
# disk busy (at 10,000 models one at a time took most of a 30 s shutdown grace period); more
# would only queue for the same threads.
PARALLEL_MODELS = 16


async def _for_each(items: Iterable[T], fn: Callable[[T], Awaitable[Any]]) -> list[Any]:
    """``await fn(item)`` for every item, at most PARALLEL_MODELS at a time; the results."""
    gate = asyncio.Semaphore(PARALLEL_MODELS)

    async def one(item: T) -> Any:
        async with gate:
            return await fn(item)

    return await asyncio.gather(*(one(item) for item in items))


def _check_ids(ids: Sequence[str], rows: int, against: str) -> None:
    """422 unless there is one id per row and no id twice."""
    if len(ids) != rows:
        raise InvalidRequest(f"ids: {len(ids)} ids for {rows} {against}; give one per row")
    if len(set(ids)) != len(ids):
        raise InvalidRequest("ids: an id appears twice; give each row its own id")


class ModelRegistry:
    """The models of one app: create, find, delete, restore and snapshot them.

    Name-level changes (create, delete, start-up restore) are serialised by one asyncio lock,
    so a name never has two lives at once. :meth:`restore_all` first lists the stored names,
    then loads them in the background; from the listing on, a request for a stored model not
    loaded yet loads it at once (ahead of the others), so the server is ready within a second
    whatever its model count. Until the listing, lookups wait for it; until every model is
    loaded, creates, deletes and the list of models wait for that (each up to
    ``restore_wait_s``, then 503) rather than answer a misleading 404 or list, or create a
    second model of a stored name.
    """

    def __init__(
        self,
        store: SnapshotStore,
        settings: Settings,
        metrics: ServiceMetrics,
        executor: Executor,
        wal: WriteAheadLog | None = None,
        ignored_log: WriteAheadLog | None = None,
        store_executor: Executor | None = None,
        read_executor: Executor | None = None,
    ) -> None:
        self.store = store
        self.wal = wal
        # With the log disabled (GLN_WAL_ENABLED=false), the log an earlier run wrote: a model
        # it holds entries for past the model's snapshot is not served (that learning would be
        # lost now, and replayed out of order once the log is enabled again), and a delete
        # clears the model's entries from it too.
        self.ignored_log = ignored_log
        self.settings = settings
        self.metrics = metrics
        self.executor = executor
        # The log listed at restore for models born in it: this server's, or the one it ignores
        # (whose births it refuses to serve without, as it refuses their learning). Where it
        # is this server's, a create makes a new model durable by logging its birth (one
        # group-committed append, not a snapshot's files); its first snapshot is the first
        # periodic (or shutdown) one, and a restore finds a model of none yet by the log.
        listed = wal if wal is not None else ignored_log
        self._birth_log = listed if isinstance(listed, ModelListing) else None
        # The snapshot store's calls run on threads of their own: a store that hangs holds
        # none of the threads the models learn and predict on.
        self.store_executor = store_executor or executor
        # Batches of predictions alone run on threads of their own too: a log that hangs, in
        # whose appends every model thread may sit, never holds them.
        self.read_executor = read_executor or executor
        # The writers of every model: passes serving many models' batches at once.
        self.passes = Passes(executor, self.read_executor, settings.worker_threads, wal)
        self._models: dict[str, ServedModel] = {}
        self._derived_budget: tuple[int, str] | None = None  # GLN_MAX_TOTAL_MODEL_BYTES unset
        # The device models are built on: GLN_DEVICE with "auto" resolved, so that a model's
        # info and gln_build_info say where it runs.
        try:
            self._device = resolve_device(settings.device)
        except ValueError:  # no model can be built on it: _build says why
            self._device = settings.device
        metrics.show_device(self._device)
        self._failed: dict[str, str] = {}  # stored names that could not be restored -> why
        # Kept as models come and go, so that admitting one costs the same at any count:
        # every name held (served or failed), by its case-folded form, and the bytes the
        # served models may come to hold (each one's ``reserved_nbytes``).
        self._by_folded_name: dict[str, str] = {}
        self._held_nbytes = 0
        self._warmed: set[str] = set()  # the configurations of CPU models warmed up
        self.families = Families(self._family_capacity)
        self._stopping = False  # stop_periodic_work was called
        self._names_lock = asyncio.Lock()
        self._restored = asyncio.Event()  # every stored model loaded, or failed
        self._listed = asyncio.Event()  # the stored names known: each loads when asked for
        self._unloaded: set[str] = set()  # stored names listed and not loaded (or failed) yet
        self._loading: dict[str, asyncio.Future[None]] = {}  # the restores under way, by name
        self._restores_retrying: dict[str, str] = {}  # name -> why its restore is retrying
        self._retry_s = 1.0  # the first wait of a restore that retries (restore_all's)
        self._ping_in_flight: asyncio.Future[bool] | None = None
        self._last_ping: tuple[float, bool] | None = None  # (monotonic time, answer)
        metrics.ready.set(0)
        metrics.models_unrestored.set_function(lambda: len(self._failed))

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def _run_store(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.store_executor, fn, *args)

    def _served(self, name: str, model: GLN, snapshot: SnapshotInfo | None) -> ServedModel:
        return ServedModel(
            name, model, executor=self.executor, store_executor=self.store_executor,
            metrics=self.metrics, passes=self.passes,
            settings=self.settings, snapshot=snapshot, wal=self.wal,
            load_snapshot=functools.partial(self._stored, name, afresh=True),
        )

    def _stored(self, name: str, afresh: bool = False) -> StoredModel | None:
        """(thread) ``name`` as its latest snapshot holds it, on this server's device; None if
        it has no snapshot. ``afresh``: reconnect the store first (after a failover)."""
        if afresh:
            self.store.reconnect()
        loaded = self.store.load(name)
        if loaded is None:
            return self._born(name, place=not afresh)
        blob, info = loaded
        if info.damage:  # loud, though not smaller: the log replays from its entry
            log.warning("the newest snapshot of %r is damaged (%s); restoring it from version %d, "
                        "an older one kept (GLN_SNAPSHOT_KEEP), and the log after it",
                        name, self._without_paths(info.damage), info.version)
            self.metrics.snapshot_fallbacks.inc()
        model_blob, waiting = split_snapshot(blob, info.metadata)
        # A rebuild's model goes into the served model's own room
        # (ServedModel.start_again_from_snapshot), a restore's into a room of its own.
        return StoredModel(self._load(model_blob, place=not afresh), info, waiting)

    @property
    def _logs_births(self) -> bool:
        """Whether a create logs the model's birth: the log this server writes lists its
        models."""
        return self.wal is not None and self._birth_log is self.wal

    def _born(self, name: str, place: bool) -> StoredModel | None:
        """(thread) A model of no snapshot as its birth in the log made it (the log replays
        what follows); None if the log holds no birth of it (the log a crash left in the
        middle of a delete, which the next create of the name clears)."""
        if self._birth_log is None:
            return None
        first = next(iter(self._birth_log.read_after(name, None)), None)  # type: ignore[attr-defined]
        if first is None or first.config is None:
            return None
        if self.wal is None:
            raise RuntimeError(
                f"the write-ahead log holds the birth of {name!r} (and any learning since), "
                "which has no snapshot yet, and GLN_WAL_ENABLED=false ignores the log: start "
                f"once with the log enabled, or DELETE /v1/models/{name} to drop the model and "
                "its log")
        return StoredModel(self._build(first.config, place), None, [])

    def _add(self, served: ServedModel) -> None:
        self._models[served.name] = served
        self._by_folded_name[served.name.casefold()] = served.name
        self._held_nbytes += served.reserved_nbytes
        served.start()
        self.metrics.add_model(served.name, lambda: int(served.model.nbytes))
        if served.snapshot is not None:  # its first, or the one it was restored from
            self.metrics.show_snapshot(served.name, served.snapshot.nbytes,
                                       served.snapshot.created_at)
        self.metrics.models_loaded.set(len(self._models))

    # -- readiness --
    @property
    def restored(self) -> bool:
        """True once start-up restore has finished (successfully or not, see ``failed``)."""
        return self._restored.is_set()

    async def wait_restored(self) -> None:
        """Wait until start-up restore has finished."""
        await self._restored.wait()

    @property
    def failed(self) -> dict[str, str]:
        """Stored models that could not be restored, with the reason."""
        return dict(self._failed)

    def _snapshot_failed(self, what: str, name: str, exc: Exception) -> Unavailable:
        """Count a snapshot that could not be stored (gln_snapshot_failures_total), then log
        it and make its 503 as for any store failure."""
        self.metrics.snapshot_failures.inc()
        return _store_failed(what, name, exc)

    async def readiness_problems(self) -> list[str]:
        """What this process cannot do now, for ``/readyz`` (none: ready); Unavailable until
        the stored models are listed (each then loads when asked for), and while a restore
        retries (the store is unreachable, or the log's tail not yet as durable as an
        acknowledged entry: no model may serve entries a failover could still lose)."""
        if not self._listed.is_set() or self._restores_retrying:
            problem = "restoring models from snapshots"
            if not await self.store_reachable():
                problem += " (the snapshot store is unreachable; retrying)"
            elif self._restores_retrying:
                name, why = next(iter(self._restores_retrying.items()))
                problem += f" ({len(self._restores_retrying)} retrying, {name!r}: {why})"
            raise Unavailable(problem)
        problems = []
        if self._failed:
            if self.settings.api_token is not None and self.settings.token_for_reads:
                # An open probe; why a model failed (its store's words) is for token holders.
                listed, hint = ", ".join(sorted(self._failed)), "GET /v1/models/<name> says why; "
            else:
                listed = "; ".join(f"{n}: {why}" for n, why in sorted(self._failed.items()))
                hint = ""
            problems.append(f"could not restore stored model(s) ({listed}); {hint}fix or "
                            "DELETE them")
        if not await self.store_reachable():
            problems.append("snapshot store or write-ahead log unreachable: learn requests and "
                            "snapshots fail until it answers")
        # The log fell short of the configured durability at its latest answer to a model,
        # and has confirmed no entry of any model since: learn requests are refused.
        logs = sorted((served.log for served in self._models.values() if served.log is not None),
                      key=lambda model_log: model_log.name)
        confirmed = max((model_log.confirmed_at for model_log in logs), default=0.0)
        problems += [
            f"learn requests of {model_log.name!r} are refused: {shortfall[0]}"
            for model_log in logs
            if (shortfall := model_log.durability_shortfall) is not None
            and shortfall[1] > confirmed
        ]
        return problems

    async def store_reachable(self) -> bool:
        """``ping()`` of the store and of the log, in a thread of their own: not a model
        worker's, since a Redis that hangs holds a ping for ``PING_TIMEOUT_S`` and probes must
        not take the threads that predictions need. One ping at a time, its answer shared by
        every caller for ``PING_REUSE_S``."""
        now = time.monotonic()
        if self._last_ping is not None and now - self._last_ping[0] < PING_REUSE_S:
            return self._last_ping[1]
        if self._ping_in_flight is None:
            self._ping_in_flight = asyncio.ensure_future(asyncio.to_thread(self._ping))
        in_flight = self._ping_in_flight
        try:
            reachable = await asyncio.shield(in_flight)
        finally:
            if in_flight.done() and self._ping_in_flight is in_flight:
                self._ping_in_flight = None
        self._last_ping = (time.monotonic(), reachable)
        self.metrics.store_up.set(int(reachable))
        return reachable

    def _ping(self) -> bool:
        """(thread) Whether the store and the log answer; never raises."""
        try:
            return bool(self.store.ping()) and (self.wal is None or bool(self.wal.ping()))
        except Exception:
            return False

    # -- lookups --
    async def _wait_restored(self) -> None:
        """Wait (a bounded time) for start-up restore; 503 if it is still not done."""
        if not self.restored:
            await self._wait_for(self._restored.wait())

    async def _wait_for(self, restoring: Awaitable[Any]) -> None:
        """Wait for ``restoring`` (a part of start-up restore) up to ``restore_wait_s``; 503 if
        it is not done by then."""
        try:
            await asyncio.wait_for(restoring, self.settings.restore_wait_s)
        except TimeoutError:
            why = "" if await self.store_reachable() else (
                " (the snapshot store is unreachable; retrying: GET /readyz says more)")
            raise Unavailable(
                f"models are still being restored from snapshots{why}; retry shortly"
            ) from None

    async def get(self, name: str) -> ServedModel:
        """The model called ``name``; 404 if unknown (after start-up restore has finished)."""
        served = self._models.get(name)
        if served is None and not self.restored:  # it may be a stored model not loaded yet
            if not self._listed.is_set():
                await self._wait_for(self._listed.wait())
            if name in self._unloaded:
                await self._wait_for(asyncio.shield(self._restore(name)))
            served = self._models.get(name)
        if served is None:
            raise ModelNotFound(name, self._failed.get(name))
        return served

    def models(self) -> list[ServedModel]:
        """Every loaded model, by name."""
        return [self._models[name] for name in sorted(self._models)]

    async def restored_models(self) -> list[ServedModel]:
        """Every model, once start-up restore is done: a list taken before would leave out
        stored models still on their way (503 after a bounded wait, as for one model)."""
        await self._wait_restored()
        return self.models()

    # -- create / import / export / delete --
    async def create(self, name: str, config: dict[str, Any],
                     replace_unrestored: bool = False) -> ServedModel:
        """Build a model from ``config``, make it durable, and start serving it.

        A model is durable from birth: a restart brings it back even if it never learned.
        Where the log lists its models (the file and Redis logs), its birth is logged (its
        configuration), and its first snapshot is the next periodic (or shutdown) one; else
        the first snapshot is stored before the answer. 409 if the name exists, or is a stored
        model that could not be restored (unless ``replace_unrestored``: its remains are
        deleted first), 422 for a config GLN rejects, 503 if the log (or the store) cannot
        take it (then nothing is created).
        """
        await self._wait_restored()
        if replace_unrestored and name in self._failed:
            log.warning("replacing model %r, which could not be restored (%s): its snapshots "
                        "and log are deleted", name, self._failed[name])
            await self.delete(name)
        config = self._without_device(config)
        unknown = sorted(set(config) - CONFIG_KEYS)
        if unknown:
            raise InvalidRequest(
                f"config: unknown key(s) {', '.join(map(repr, unknown))}; the keys are "
                f"{', '.join(sorted(CONFIG_KEYS))}"
            )
        served = await self._admit(name, config, functools.partial(self._build, config),
                                  "invalid config", born=self._logs_births)
        log.info("created model %r: %s", name, _shape_of(served.model))
        return served

    async def import_model(self, name: str, blob: bytes) -> ServedModel:
        """Serve the model of a ``GLN.to_bytes`` blob (an export) as ``name``, on this server's
        device, from its first snapshot on, as :meth:`create` does.

        The model keeps its weights, input statistics and ``examples_seen``; its online
        metrics start afresh. 422 for bytes that are not a valid GLN snapshot, and the same
        409 and 503 as :meth:`create`.
        """
        await self._wait_restored()
        try:
            config = GLN.config_of_bytes(blob)
        except ValueError as exc:
            raise InvalidRequest(f"invalid model bytes: {exc}") from exc
        served = await self._admit(name, config, functools.partial(self._import, blob),
                                  "invalid model bytes")
        log.info("imported model %r: %s, %d examples seen", name, _shape_of(served.model),
                 served.model.examples_seen)
        return served

    async def _admit(
        self, name: str, config: dict[str, Any], build: Callable[[], GLN], invalid: str,
        born: bool = False,
    ) -> ServedModel:
        """Check ``name`` and the room for a model of ``config``, ``build`` it, make it
        durable and start serving it; ``invalid`` prefixes the 422 of a refused one.
        Durable: by its birth in the log (``born``), else by its first snapshot."""
        async with self._names_lock:
            if name in self._failed:
                raise ModelExists(
                    f"model {name!r} is stored but could not be restored "
                    f"({self._failed[name]}); DELETE /v1/models/{name} removes it, or a "
                    "create with replace_unrestored: true replaces it")
            if name in self._models:
                raise ModelExists(f"model {name!r} already exists")
            other = self._name_differing_only_in_case(name)
            if other is not None:
                raise ModelExists(
                    f"model {other!r} exists, and names that differ only in case are refused "
                    f"(on a case-insensitive file system they would share their files)")
            if config.get("side_info") == "given":
                raise InvalidRequest(
                    f"{invalid}: side_info 'given' takes side information with each row "
                    "(gln.density), which the service's requests do not carry; use 'scaled' "
                    "or 'per_row'")
            try:
                # Sized before it is built: an oversized config must never be allocated.
                needed = GLN.estimate_nbytes({**config, "device": self._device})
                if needed > self.settings.max_model_bytes:
                    raise InvalidRequest(
                        f"{invalid}: the model would hold {needed} bytes, more than "
                        f"GLN_MAX_MODEL_BYTES={self.settings.max_model_bytes}"
                    )
                built = await self._run(self._checked_build, config, needed, build,
                                        name if born else None)
            except (ValueError, TypeError) as exc:
                raise InvalidRequest(f"{invalid}: {exc}") from exc
            if isinstance(built, Exception):  # the birth could not be logged
                raise Unavailable(f"the write-ahead log did not take the model's birth "
                                  f"({type(built).__name__}; see the service log): nothing "
                                  "was created") from built
            model, birth = built
            served = self._served(name, model, None)
            if birth is not None:
                served.born(birth)
                self._add(served)
                return served
            try:
                await self._run_store(self._first_snapshot, served)
            except Exception as exc:
                self.families.release(model)
                raise self._snapshot_failed("first snapshot of %r failed", name, exc) from exc
            self._add(served)
            return served

    def _checked_build(self, config: dict[str, Any], needed: int, build: Callable[[], Model],
                       born: str | None = None) -> tuple[Model, str | None] | Exception:
        """(thread) ``build()``, once ``config`` is valid and the server has room, and with
        ``born`` (the model's name) its birth logged: one hop for all (a create pays each hop
        on a busy server). The model and its birth's log entry (None without). What is wrong
        with the config comes before the server's room for it. A birth the log refuses is
        returned (the model released), not raised: it is no fault of the config."""
        GLN.check_config({**config, "device": self._device})
        self._check_room(needed)
        model = build()
        if born is None:
            return model, None
        try:
            self._clear_logs(born)
            return model, self.wal.append_birth(born, {  # type: ignore[union-attr]
                key: value for key, value in model.config.items() if key != "device"})
        except Exception as exc:
            log.warning("logging the birth of model %r failed: %s", born, exc)
            self.families.release(model)
            return exc

    def _clear_logs(self, name: str) -> None:
        """(thread) Nothing of ``name`` left in the logs before a new model of the name: a log
        left by a crash during an earlier delete, in the log this server writes or in the one
        it ignores (which a later start may use)."""
        for opened in (self.wal, self.ignored_log):
            if opened is not None:
                opened.delete(name)

    def _first_snapshot(self, served: ServedModel) -> None:
        """(thread) A new model's first snapshot, once the logs hold nothing of its name."""
        self._clear_logs(served.name)
        served.write_snapshot(self.store, force=True)

    def _without_paths(self, words: str) -> str:
        """``words`` with the server's data directories named by their settings: what a client
        reads (a 404, /readyz) shows no path of the host."""
        for directory, setting in ((self.settings.wal_dir, "GLN_WAL_DIR"),
                                   (self.settings.snapshot_dir, "GLN_SNAPSHOT_DIR")):
            if directory:
                words = words.replace(str(Path(directory).resolve()), setting)
                words = words.replace(str(directory), setting)
        return words

    def _name_differing_only_in_case(self, name: str) -> str | None:
        """The name of a model, served or not restored, that is ``name`` but for case.

        The directory store and the file log keep a model in a directory of its name, and on
        a case-insensitive file system (macOS', Windows' defaults) ``Fraud`` and ``fraud``
        would be one directory: one model's snapshots and log would overwrite the other's.
        The rule holds on every store, so that a name valid on one server is valid on all.
        """
        other = self._by_folded_name.get(name.casefold())
        return None if other == name else other

    async def export(self, name: str) -> memoryview:
        """``GLN.to_bytes()`` of ``name``: every learn request answered before it, included."""
        served = await self.get(name)
        return await served.model_bytes()

    def _without_device(self, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` without its ``device``, which the server chooses (GLN_DEVICE); 422 for
        any other device than the server's (a model's info shows it, and that config sent back
        is accepted)."""
        if "device" not in config:
            return config
        if config["device"] != self._device:
            raise InvalidRequest(
                f"config: 'device' is chosen by the server (GLN_DEVICE={self.settings.device}, "
                f"here {self._device!r}); leave it out"
            )
        return {key: value for key, value in config.items() if key != "device"}

    def _check_room(self, needed: int) -> None:
        """409 if one more model of ``needed`` bytes passes the server's limits."""
        limit = self.settings.max_models
        if len(self._models) + len(self._failed) >= limit:
            held = f"{len(self._models)} model{'s' if len(self._models) != 1 else ''}"
            if self._failed:  # they keep their names and their room until deleted
                held += (f" and {len(self._failed)} that could not be restored "
                         f"({', '.join(sorted(self._failed))}; GET /v1/models/<name> says why)")
            raise LimitExceeded(f"the server holds {held}, GLN_MAX_MODELS={limit}; "
                                "delete one first")
        self._check_bytes(needed, f"the model would hold {needed} bytes")

    def _check_bytes(self, needed: int, what: str, advice: str = "") -> None:
        """409 (saying ``what`` needs ``needed`` bytes, then ``advice``) if the server's memory
        budget lacks room for it.

        Counts what each model may come to hold (a CPU model grows by a copy of its normals
        on its first short call; waiting rows up to their limit once reserved), so what is
        admitted now never pushes the total past the budget later.
        """
        held = self._held_nbytes
        budget, source = self._budget()
        if held + needed > budget:
            _, free = memory.memory(self._device)
            raise LimitExceeded(
                f"{what} and the server's models hold {held}; together more than "
                f"GLN_MAX_TOTAL_MODEL_BYTES={budget}{source} ({free} bytes of the "
                f"{'GPU' if self._device == 'cuda' else 'machine'} free now){advice}"
            )

    def _family_capacity(self, model_nbytes: int) -> int:
        """How many models of ``model_nbytes`` this server could hold: a family's room."""
        return min(self.settings.max_models, self._budget()[0] // max(model_nbytes, 1))

    def _budget(self) -> tuple[int, str]:
        """The bytes all models may hold, and (when derived) where that comes from."""
        if self.settings.max_total_model_bytes is not None:
            return self.settings.max_total_model_bytes, ""
        if self._derived_budget is None:
            budget, source = memory.default_budget(self._device)
            self._derived_budget = budget, f" (unset: {source})"
        return self._derived_budget

    async def _reserve_waiting_room(self, served: ServedModel) -> None:
        """Count room for the model's rows waiting for labels in the server's memory budget,
        at its first prediction with ids; 409 (and nothing predicted) if there is none."""
        if served.waiting_room_reserved:
            return
        async with self._names_lock:
            if served.waiting_room_reserved:
                return
            needed = served.waiting_capacity_nbytes
            self._check_bytes(
                needed,
                f"rows predicted with ids wait for labels in memory: up to "
                f"GLN_MAX_PENDING_LABEL_ROWS={self.settings.max_pending_label_rows} rows of "
                f"model {served.name!r} may hold {needed} bytes",
                "; predict without ids, lower GLN_MAX_PENDING_LABEL_ROWS, or delete a model",
            )
            served.waiting_room_reserved = True
            self._held_nbytes += needed

    def _build(self, config: dict[str, Any], place: bool = True) -> Model:
        """A new model of ``config``; in its family, with ``place`` (see ``families``)."""
        model: Model = GLN(**config, device=self._device)
        if place:
            model = self.families.place(model)
        self._warm_up_once(model)  # so that the first request does not pay for it
        return model

    def _load(self, blob: bytes, place: bool = True) -> Model:
        """The model of a snapshot; in its family, with ``place`` (see ``families``)."""
        model: Model = GLN.from_bytes(blob, self._device)
        if place:
            model = self.families.place(model)
        self._warm_up_once(model)
        return model

    def _warm_up_once(self, model: Model) -> None:
        """Warm up ``model`` unless a CPU model of its configuration was: what a warm-up spares
        the first request is the kernels' loading, once a process, where a CPU model's own
        first call adds only its 16-bit normals (~50 us); at 10,000 restored models that is
        a third of the restore."""
        key = f"{type(model).__name__} {sorted(model.config.items())!r}"  # a family warms apart
        if self._device != "cpu" or key not in self._warmed:
            model.warm_up()
            self._warmed.add(key)

    def _import(self, blob: bytes) -> Model:
        """An import's model, its counters leaving room to learn (``IMPORT_MAX_COUNT``)."""
        model = self._load(blob, place=False)
        counted = max(int(model.examples_seen), int(model.moments.count))
        if counted >= IMPORT_MAX_COUNT:
            raise ValueError(f"the model has counted {counted} examples, which leaves no room "
                             f"to learn: an import must have counted fewer than 2**61")
        placed = self.families.place(model)
        self._warm_up_once(placed)
        return placed

    async def delete(self, name: str) -> None:
        """Finish the model's queued learning, forget it, and remove its snapshots.

        If the store refuses the delete, the model stays loaded and the error is a 503.
        Also removes the snapshots of a stored model that failed to restore.
        """
        await self._wait_restored()
        async with self._names_lock:
            if name in self._failed:
                try:
                    await self._run_store(self.store.delete, name)
                    for opened in (self.wal, self.ignored_log):
                        if opened is not None:
                            await self._run(opened.delete, name)
                except Exception as exc:
                    raise _store_failed("deleting %r failed", name, exc) from exc
                del self._failed[name]
                del self._by_folded_name[name.casefold()]
                return
            served = self._models.pop(name, None)
            if served is None:
                raise ModelNotFound(name)
            await served.close()
            try:
                await served.delete_snapshots(self.store)
            except Exception as exc:
                self._models[name] = served  # nothing changed: keep serving it
                served.start()
                raise _store_failed("deleting %r failed", name, exc) from exc
            if self.ignored_log is not None:  # no entries of an earlier life may outlive it
                try:
                    await self._run(self.ignored_log.delete, name)
                except Exception as exc:
                    log.warning("deleting %r from the log this server ignores failed (a new "
                                "model of the name will be refused until it is): %s", name, exc)
            self.metrics.forget_model(name)
            self.metrics.models_loaded.set(len(self._models))
            del self._by_folded_name[name.casefold()]
            self._held_nbytes -= served.reserved_nbytes
            self.families.release(served.model)
        log.info("deleted model %r, its snapshots and its log", name)

    # -- data --
    async def _check(
        self, served: ServedModel, features: Rows,
        labels: Labels | None = None, *, values_per_row: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Validate a request's rows against the model (width, finiteness, names, labels) and
        the size of its answer (``values_per_row``: num_classes unless given).

        Runs before a request joins the queue, so a bad request never touches the model.
        Converting a big request to arrays takes a while: that happens in a thread.
        """
        limit = self.settings.max_rows_per_request
        if len(features) > limit:
            raise InvalidRequest(
                f"features: {len(features)} rows, more than GLN_MAX_ROWS_PER_REQUEST={limit}"
            )
        per_row = values_per_row or served.model.num_classes
        values_limit = self.settings.max_response_values
        if len(features) * per_row > values_limit:
            fitting = values_limit // per_row
            advice = (f"send at most {fitting} rows a request" if fitting else
                      "not even one row's fits: only a server with a larger limit answers it")
            raise InvalidRequest(
                f"features: the answer to {len(features)} rows would hold "
                f"{len(features) * per_row} numbers ({per_row} a row), more than "
                f"GLN_MAX_RESPONSE_VALUES={values_limit}; {advice}"
            )
        if labels is not None and len(labels) != len(features):
            raise InvalidRequest(
                f"labels: {len(labels)} labels for {len(features)} feature rows; "
                "give one label per row"
            )
        # Strict: a unit model's clients are told of a value outside [0, 1], which learning
        # would clip (rows logged or waiting from before are learned as they are).
        check = functools.partial(served.model.check_input, features, labels, strict=True)
        try:
            if len(features) * len(features[0]) > _INLINE_CHECK_VALUES:
                return await asyncio.to_thread(check)
            return check()
        except (ValueError, TypeError) as exc:
            raise InvalidRequest(str(exc)) from exc

    async def predict(
        self, name: str, features: Rows, ids: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Class probabilities for each row, and its most probable class (by name where the
        model has class names); counts the rows in the metrics.

        With ``ids`` (one per row, unique), each row and its prediction wait for a label
        (:meth:`labels`) for ``label_ttl_s`` seconds.
        """
        served = await self.get(name)
        if ids is not None:
            _check_ids(ids, len(features), "feature rows")
        X, _ = await self._check(served, features)
        if ids is not None:
            await self._reserve_waiting_room(served)
        probs = await served.predict_proba(X, None if ids is None else list(ids))
        self.metrics.observe_predicted(name, len(X))
        if ids is not None:
            await self._expire(served)  # the oldest rows make room
        return {"probabilities": probs, "classes": served.model.class_of(probs)}

    async def labels(
        self, name: str, ids: Sequence[str], labels: Labels
    ) -> tuple[LearnResult | None, list[str]]:
        """Learn the waiting rows of ``ids`` with ``labels``; also the ids not waiting.

        Rows are learned in the order given, scored in the online metrics by the prediction
        made at predict time. Ids that are unknown or expired are returned, not learned. A
        row stops waiting only once its learning is logged: if learning fails the rows still
        wait and the error is raised.
        """
        served = await self.get(name)
        limit = self.settings.max_rows_per_request
        if len(ids) > limit:
            raise InvalidRequest(f"ids: {len(ids)} ids, more than GLN_MAX_ROWS_PER_REQUEST={limit}")
        _check_ids(ids, len(labels), "labels")
        try:  # every label, also those of ids no longer waiting, and named by request index
            indices = served.model.check_labels(labels).tolist()  # names become indices
        except (ValueError, TypeError) as exc:
            raise InvalidRequest(str(exc)) from exc
        rows, missing = served.waiting_rows.waiting(ids, time.time())
        if not rows:
            return None, missing
        wanted = dict(zip(ids, indices, strict=True))
        try:
            result = await self._learn_waiting(served, rows, [wanted[row.id] for row in rows])
        finally:
            self.metrics.show_labels_pending(name, len(served.waiting_rows))
        self.metrics.count_labels_learned(name, result.rows)
        return result, [*missing, *result.stale_ids]

    async def _expire(self, served: ServedModel) -> None:
        """Expire the rows that are due: learn them with the default label, else drop them.

        Either goes through the model's queue and log (the model counts the dropped rows),
        so a row stops waiting only once that is logged, and a restart does not bring it
        back. A failure is logged, not raised: the rows stay due and the next pass retries.
        """
        rows = served.waiting_rows.due(time.time())
        if rows:
            default = served.label_default
            if default is None:
                try:
                    await served.expire(rows)
                except Exception as exc:
                    log.warning("dropping %d expired rows of %r failed (they stay due): %s",
                                len(rows), served.name, exc)
            else:
                learned = await self._learn_default(served, rows, default)
                self.metrics.count_labels_expired(served.name, learned)
        self.metrics.show_labels_pending(served.name, len(served.waiting_rows))

    async def _learn_waiting(
        self, served: ServedModel, rows: list[WaitingRow], labels: list[int]
    ) -> LearnResult:
        """Learn waiting rows with ``labels``, scored by the predictions made at predict time;
        422 (InvalidRequest) for a label out of range, and nothing learned."""
        try:
            X, y = served.model.check_input(np.stack([row.features for row in rows]), labels)
        except (ValueError, TypeError) as exc:
            raise InvalidRequest(str(exc)) from exc
        assert y is not None
        return await served.learn(
            X, y, scored=np.stack([row.prediction for row in rows]), waiting_rows=rows
        )

    async def _learn_default(
        self, served: ServedModel, rows: list[WaitingRow], label: int
    ) -> int:
        """Learn expired rows with the default label; how many were learned (0 on failure)."""
        try:
            result = await self._learn_waiting(served, rows, [label] * len(rows))
        except Exception:
            log.exception("learning %d expired rows of %r with the default label failed",
                          len(rows), served.name)
            return 0
        return result.rows

    def stop_periodic_work(self) -> None:
        """Make the periodic loops end at their next turn. Cancelling them is not enough: a
        loop cancelled while it waits for a learn a pass is carrying out keeps waiting for
        its outcome (``ServedModel.answer`` takes the cancellation back, as a request's
        handler must), and would then go round again."""
        self._stopping = True

    async def expire_labels_periodically(self, interval_s: float) -> None:
        """Every ``interval_s`` seconds, expire the rows that waited too long for a label."""
        await self.wait_restored()
        while not self._stopping:
            await asyncio.sleep(interval_s)
            for served in list(self._models.values()):
                # Only models with rows waiting, or shown as waiting: a sweep over ten
                # thousand tenants would otherwise hold the loop for tens of milliseconds.
                if len(served.waiting_rows) or self.metrics.labels_pending_shown(served.name):
                    await self._expire(served)

    async def learn(
        self, name: str, features: Rows, labels: Labels,
        key: str | None = None,
    ) -> LearnResult:
        """Validate, then queue the rows on the model's single writer and wait for them.

        ``key`` is the request's idempotency key (already checked): a request whose key the
        log holds is answered as a duplicate, not learned twice.
        """
        served = await self.get(name)
        # Checked and queued in arrival order: a large request is checked in a thread, and a
        # later one must not pass it meanwhile (a stream's batches learn in the order sent).
        async with served.admission:
            X, y = await self._check(served, features, labels)
            assert y is not None
            queued = served.queue_learn(X, y, key)
        return await served.answer(queued)

    async def explain(self, name: str, features: Rows) -> np.ndarray:
        """Per-class saliency of each row: (n, num_classes, num_features)."""
        served = await self.get(name)
        model = served.model
        X, _ = await self._check(
            served, features, values_per_row=model.num_classes * model.num_features
        )
        return await served.saliency(X)

    # -- snapshots --
    async def snapshot(self, name: str) -> SnapshotInfo:
        """Make sure ``name``'s latest snapshot holds everything it learned: write one now if it
        changed since its last, and return the latest's info. An unchanged model is not written
        again: a call costs nothing then, whoever makes it (any web page can send this bodiless
        POST to a server without a token)."""
        served = await self.get(name)
        try:
            info = await served.save_snapshot(self.store, force=served.snapshot is None)
            if info is None:
                info = served.snapshot
        except ModelNotFound:
            raise
        except Exception as exc:
            raise self._snapshot_failed("snapshot of %r failed", name, exc) from exc
        assert info is not None
        return info

    async def snapshot_changed(self, within_s: float | None = None) -> bool:
        """Snapshot every model changed since its last snapshot, several at once, those with
        the most learning unsnapshotted first; False if any save failed. ``within_s``: no
        save starts after that many seconds (the log keeps what the others lack)."""
        deadline = None if within_s is None else time.monotonic() + within_s
        left = 0

        async def save(served: ServedModel) -> bool:
            nonlocal left
            if deadline is not None and time.monotonic() > deadline:
                left += 1
                return True
            try:
                await served.save_snapshot(self.store, force=False)
            except ModelNotFound:
                pass  # deleted meanwhile
            except Exception as exc:  # the store is down, typically: say so, once per model
                self._snapshot_failed("snapshot of %r failed", served.name, exc)
                return False
            return True

        changed = sorted((served for served in self._models.values()
                          if served.changed_since_snapshot),
                         key=lambda served: served.unsnapshotted_updates, reverse=True)
        saved = all(await _for_each(changed, save))
        if left:
            log.info("%d of %d changed models snapshotted in %.0f s; the log keeps what the "
                     "other %d learned, and the next start replays it", len(changed) - left,
                     len(changed), within_s, left)
        return saved

    async def snapshot_periodically(self, interval_s: float) -> None:
        """Every ``interval_s`` seconds, snapshot the models that changed (until stopped)."""
        await self.wait_restored()
        while not self._stopping:
            await asyncio.sleep(interval_s)
            await self.snapshot_changed()

    # -- start-up and shutdown --
    async def restore_all(self, retry_s: float = 1.0) -> None:
        """List the stored models, then load each one (``GLN.from_bytes``, never pickle),
        ``PARALLEL_MODELS`` at a time, then mark restored. Once the names are listed the
        service is ready: a request for a model not loaded yet loads it first (``get``).

        While the store is unreachable, or the log's tail is not yet as durable as an
        acknowledged entry (a replica is behind), this retries (backing off to 30 s) and the
        service stays unready: a model never serves entries that a failover could still lose.
        A snapshot that loads but cannot be decoded is recorded in ``failed`` (readiness
        reports it) instead of blocking the other models.
        """
        self._retry_s = retry_s
        async with self._names_lock:
            delay = retry_s
            while True:
                try:
                    names = await self._run_store(self._stored_names)
                    break
                except Exception as exc:
                    log.warning("snapshot store unreachable (%s); retrying in %.0f s", exc, delay)
                    await asyncio.sleep(delay)
                    delay = min(30.0, delay * 2)
            self._unloaded.update(names)
            self._listed.set()
            self.metrics.ready.set(1)
            try:
                await _for_each(names, lambda name: asyncio.shield(self._restore(name)))
            finally:  # cancelled (the service stops): so are the restores a request began
                for loading in list(self._loading.values()):
                    loading.cancel()
            self._restored.set()
        log.info("restored %d model(s); %d failed", len(self._models), len(self._failed))

    def _stored_names(self) -> list[str]:
        """(thread) The names of the store's models, and of those the log holds the birth of
        and the store no snapshot yet."""
        names = set(self.store.names())
        if self._birth_log is not None:
            names.update(self._birth_log.names())
        return sorted(names)

    def _restore(self, name: str) -> asyncio.Future[None]:
        """The restore of the stored model ``name``: the one under way (the background's, or
        an earlier request's), else one begun now; done at once if it is loaded (or failed)."""
        loading = self._loading.get(name)
        if loading is None:
            if name not in self._unloaded:
                loading = asyncio.get_running_loop().create_future()
                loading.set_result(None)
                return loading
            loading = self._loading[name] = asyncio.ensure_future(self._restore_one(name))

            def finished(_: asyncio.Future[None]) -> None:
                self._unloaded.discard(name)
                self._loading.pop(name, None)
                if self._restores_retrying.pop(name, None) and not self._restores_retrying:
                    self.metrics.ready.set(1)

            loading.add_done_callback(finished)
        return loading

    async def _restore_one(self, name: str) -> None:
        delay = self._retry_s
        while True:
            stored = None
            try:
                stored = await self._run_store(self._stored, name)
                if stored is None:
                    return  # deleted by someone else since names()
                info = stored.info
                if self.ignored_log is not None and info is not None:
                    await self._run(self._refuse_an_unapplied_log, name, info)
                served = self._served(name, stored.model, info)
                served.waiting_rows.put_rows(stored.waiting)
                t0 = time.perf_counter()
                replayed = await self._run(served.replay_log)
                # Restored rows are counted, never refused (the budget may be overrun).
                served.waiting_room_reserved = len(served.waiting_rows) > 0
            except Exception as exc:
                if stored is not None:
                    self.families.release(stored.model)
                if isinstance(exc, WalDurabilityError) or not await self.store_reachable():
                    why = exc if isinstance(exc, WalDurabilityError) else "store unreachable"
                    log.warning("restoring %r: %s; retrying in %.0f s", name, why, delay)
                    self._restores_retrying[name] = self._without_paths(str(why))
                    self.metrics.ready.set(0)
                    await asyncio.sleep(delay)
                    delay = min(30.0, delay * 2)
                    continue
                log.exception("cannot restore model %r", name)
                self._failed[name] = self._without_paths(f"{type(exc).__name__}: {exc}")
                self._by_folded_name[name.casefold()] = name
                return
            log.info(
                "restored %r: %s, then %d log entries in %.3f s", name,
                "its birth" if info is None else f"snapshot version {info.version}",
                replayed, time.perf_counter() - t0,
            )
            self._add(served)
            self.metrics.show_labels_pending(name, len(served.waiting_rows))
            return

    def _refuse_an_unapplied_log(self, name: str, info: SnapshotInfo) -> None:
        """(thread) RuntimeError if the ignored log holds entries of ``name`` after its
        snapshot: acknowledged learning that this server would not apply."""
        assert self.ignored_log is not None
        after = info.metadata.get(WAL_ID)
        if next(iter(self.ignored_log.read_after(name, after)), None) is not None:
            raise RuntimeError(
                f"the write-ahead log holds learning of {name!r} that its snapshot lacks, and "
                "GLN_WAL_ENABLED=false ignores the log: start once with the log enabled, which "
                f"applies it, or DELETE /v1/models/{name} to drop the model and its log"
            )

    async def close(self) -> bool:
        """Finish every queued learn request, then snapshot what changed (for at most
        ``GLN_SHUTDOWN_SNAPSHOT_S`` where the log keeps the rest); False on failure."""
        await _for_each(list(self._models.values()), ServedModel.close)
        await self.passes.close()
        within_s = self.settings.shutdown_snapshot_s if self.wal is not None else None
        return await self.snapshot_changed(within_s)
