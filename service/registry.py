"""Models in memory, one writer per model, and their snapshots.

The learn path is a queue, and the queue is the batcher (docs/DESIGN.md): each model owns one
ordered queue of requests and one worker task. The worker takes everything waiting (up to
``max_chunk_rows`` rows) and serves it in a worker thread, one model call per run of
consecutive requests of the same verb: a run of learn requests becomes one ``model.learn`` on
the concatenated rows, which equals learning them one by one, so coalescing changes nothing
but the speed, and queue order is update order. Every learned example gets a sequence number
(its 0-based index in the model's stream); a learn response carries its first example's.

Predictions and saliency ride the same queue, so they see every learn request queued before
them and none after, never half of one; serialisation takes the model lock, which the worker
holds while it serves a batch. All model and store calls run on the app's thread pool, so the
event loop only moves bytes.

Errors the HTTP layer should show to the client are :class:`RegistryError` subclasses that
carry their status code; routes never translate exceptions themselves."""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from gln import GLN
from service.metrics import ServiceMetrics
from service.settings import Settings
from service.store import SnapshotInfo, SnapshotStore

log = logging.getLogger(__name__)

T = TypeVar("T")

# A prediction of exactly 0 for the true class would give infinite log loss; GLN clips its
# outputs already (pred_clip), this only keeps the metrics finite whatever the config.
_MIN_PROB = 1e-15

# Requests with more numbers than this are converted and checked in a thread, not the loop.
_INLINE_CHECK_VALUES = 20_000


# -- errors shown to clients ------------------------------------------------------------------
class RegistryError(Exception):
    """An error with an HTTP status; ``str(error)`` is the client-facing message."""

    status_code = 500


class ModelNotFound(RegistryError):
    status_code = 404

    def __init__(self, name: str) -> None:
        super().__init__(f"model {name!r} not found")


class ModelExists(RegistryError):
    status_code = 409


class InvalidRequest(RegistryError):
    """Bad config or bad data: wrong width, NaN/inf, labels out of range, too many rows."""

    status_code = 422


class Unavailable(RegistryError):
    """Not restored yet, or the snapshot store cannot be reached."""

    status_code = 503


# -- online metrics -----------------------------------------------------------------------------
class OnlineStats:
    """Prequential log loss and accuracy, over a recent window and since counting began.

    The window is a ring buffer of the last ``window`` examples, so its means are exact (not
    exponentially decayed) and cheap to update a chunk at a time. Updated only from the event
    loop, so it needs no lock.
    """

    def __init__(self, window: int) -> None:
        self.window = window
        self._loss = np.zeros(window, dtype=np.float64)
        self._correct = np.zeros(window, dtype=np.bool_)
        self._next = 0  # ring position of the next example
        self._filled = 0
        self.examples = 0
        self.log_loss_sum = 0.0
        self.correct_sum = 0
        self.since = time.time()

    def add(self, losses: np.ndarray, correct: np.ndarray) -> None:
        """Count a chunk of examples, in stream order."""
        n = len(losses)
        self.examples += n
        self.log_loss_sum += float(losses.sum())
        self.correct_sum += int(correct.sum())
        if n >= self.window:  # only the newest `window` examples survive
            losses, correct, n = losses[-self.window:], correct[-self.window:], self.window
        idx = (self._next + np.arange(n)) % self.window
        self._loss[idx] = losses
        self._correct[idx] = correct
        self._next = (self._next + n) % self.window
        self._filled = min(self.window, self._filled + n)

    def summary(self) -> dict[str, Any]:
        """Means over the window and in total (None before the first example)."""
        k = self._filled
        recent_loss = float(self._loss[:k].sum() / k) if k else None
        recent_acc = float(self._correct[:k].sum() / k) if k else None
        n = self.examples
        return {
            "window_size": self.window,
            "recent": {"examples": k, "log_loss": recent_loss, "accuracy": recent_acc},
            "total": {
                "examples": n,
                "log_loss": self.log_loss_sum / n if n else None,
                "accuracy": self.correct_sum / n if n else None,
                "since": self.since,
            },
        }


# -- one model ----------------------------------------------------------------------------------
@dataclass
class LearnResult:
    """What one learn request gets back: its rows' prequential probabilities and losses."""

    sequence: int  # stream index of the request's first example
    probabilities: np.ndarray  # (n, num_classes), each row predicted before its own update
    losses: np.ndarray  # (n,) log loss of each row, nats

    @property
    def mean_loss(self) -> float:
        """Mean log loss of the request's rows (nats); equal to ``losses.mean()``."""
        # sum / n rather than ndarray.mean(): a third of the cost on the one-row arrays that
        # single-example requests get, and the same float.
        return float(self.losses.sum()) / len(self.losses)


class _Verb(enum.Enum):
    LEARN = "learn"
    PREDICT = "predict"
    EXPLAIN = "explain"


@dataclass
class _Job:
    verb: _Verb
    X: np.ndarray
    y: np.ndarray | None  # labels, for LEARN only
    future: asyncio.Future[Any]


@dataclass
class _GroupResult:
    """(thread -> loop) The outcome of one run of same-verb jobs."""

    jobs: list[_Job]
    output: np.ndarray | None = None  # probabilities or saliency, rows in job order
    error: Exception | None = None
    start: int = 0  # LEARN: stream index of the group's first example
    losses: np.ndarray | None = None  # LEARN: prequential log loss per row
    correct: np.ndarray | None = None  # LEARN: prequential argmax == label per row


class ModelEntry:
    """One model in memory: its request queue and worker, its stats and snapshot info.

    Every request that touches the weights (learn, predict, explain) joins one ordered queue.
    The worker takes everything waiting (up to ``max_chunk_rows`` rows), hands it to a worker
    thread in one go, and there, holding the model lock, serves consecutive requests of the
    same verb with one model call: a run of learns is one ``learn`` on the concatenated rows
    (exactly equal to learning them one by one), a run of predictions one ``predict_proba``.
    So a prediction sees every learn request queued before it and none queued after, never
    half of one; and many small requests cost one thread hop and one model call, not many.
    """

    def __init__(
        self,
        name: str,
        model: GLN,
        *,
        executor: Executor,
        metrics: ServiceMetrics,
        settings: Settings,
        snapshot: SnapshotInfo | None = None,
    ) -> None:
        self.name = name
        self.model = model
        self.snapshot = snapshot
        self.stats = OnlineStats(settings.recent_window)
        # `lock` guards the model's arrays: the worker holds it while it serves a batch, and
        # serialisation (to_bytes) takes it, so a snapshot never catches half a learn chunk.
        self.lock = threading.Lock()
        # `snapshot_lock` orders store writes of this model: a save never lands after delete.
        self.snapshot_lock = threading.Lock()
        self.deleted = False
        self._updates = 0  # learn calls applied; compared with the snapshotted count
        self._snapshotted_updates = 0
        self._executor = executor
        self._metrics = metrics
        self._max_chunk_rows = settings.max_chunk_rows
        self._pending: deque[_Job] = deque()
        self._pending_learn_rows = 0
        self._wake = asyncio.Event()
        self._closing = False
        self._worker: asyncio.Task[None] | None = None

    # -- lifecycle --
    def start(self) -> None:
        """Start the worker (on the running event loop)."""
        self._closing = False
        self._worker = asyncio.create_task(self._work(), name=f"gln-model-{self.name}")

    async def close(self) -> None:
        """Stop taking requests, finish every queued one, then stop the worker."""
        self._closing = True
        self._wake.set()
        if self._worker is not None:
            await self._worker
            self._worker = None

    @property
    def changed_since_snapshot(self) -> bool:
        """True when learning happened after the latest snapshot was taken."""
        return self._updates != self._snapshotted_updates

    @property
    def pending_examples(self) -> int:
        """Examples queued for learning and not applied yet."""
        return self._pending_learn_rows

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # -- the queue --
    async def learn(self, X: np.ndarray, y: np.ndarray) -> LearnResult:
        """Learn validated rows in queue order; their prequential outputs and sequence."""
        self._pending_learn_rows += len(y)
        return await self._submit(_Verb.LEARN, X, y)

    async def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """Class probabilities, after every learn request queued before this one."""
        return await self._submit(_Verb.PREDICT, X, None)

    async def saliency(self, X: np.ndarray) -> np.ndarray:
        """Per-class saliency (n, num_classes, num_features), in queue order like predict."""
        return await self._submit(_Verb.EXPLAIN, X, None)

    async def _submit(self, verb: _Verb, X: np.ndarray, y: np.ndarray | None) -> Any:
        if self._closing:
            if y is not None:
                self._pending_learn_rows -= len(y)
            raise ModelNotFound(self.name)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append(_Job(verb, X, y, future))
        self._wake.set()
        # Once queued, a request is carried out even if its client goes away: shield the
        # future so a cancelled handler does not cancel it (its answer is simply dropped).
        return await asyncio.shield(future)

    async def _work(self) -> None:
        """The single writer: serve queued requests batch by batch, in arrival order."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                batch = self._take_batch()
                try:
                    groups = await self._run(self._serve_batch, batch)
                except Exception as exc:  # e.g. the thread pool is gone: nobody may hang
                    groups = [_GroupResult([job], error=exc) for job in batch]
                self._answer(groups)
            if self._closing:
                return

    def _take_batch(self) -> list[_Job]:
        """Everything waiting, up to max_chunk_rows rows (always at least one request)."""
        jobs = [self._pending.popleft()]
        rows = len(jobs[0].X)
        while self._pending and rows + len(self._pending[0].X) <= self._max_chunk_rows:
            job = self._pending.popleft()
            jobs.append(job)
            rows += len(job.X)
        return jobs

    def _serve_batch(self, jobs: list[_Job]) -> list[_GroupResult]:
        """(thread) Under the lock, one model call per run of consecutive same-verb jobs."""
        groups = [_GroupResult(list(run)) for _, run in itertools.groupby(jobs, lambda j: j.verb)]
        with self.lock:
            for group in groups:
                try:
                    self._serve_group(group)
                except Exception as exc:  # answer the group's requests; keep serving others
                    log.exception("%s failed for model %r", group.jobs[0].verb.value, self.name)
                    group.error = exc
        return groups

    def _serve_group(self, group: _GroupResult) -> None:
        jobs = group.jobs
        X = jobs[0].X if len(jobs) == 1 else np.concatenate([job.X for job in jobs])
        verb = jobs[0].verb
        if verb is _Verb.PREDICT:
            group.output = self.model.predict_proba(X)
        elif verb is _Verb.EXPLAIN:
            group.output = self.model.saliency(X)
        else:
            y = jobs[0].y if len(jobs) == 1 else np.concatenate([job.y for job in jobs])
            assert y is not None
            group.start = int(self.model.examples_seen)
            probs = np.asarray(self.model.learn(X, y), dtype=np.float64)
            self._updates += 1
            p_true = probs[np.arange(len(y)), y]
            group.output = probs
            group.losses = -np.log(np.clip(p_true, _MIN_PROB, 1.0))
            group.correct = probs.argmax(axis=1) == y

    def _answer(self, groups: list[_GroupResult]) -> None:
        """(loop) Give every request its slice; count learned examples in stats and metrics."""
        for group in groups:
            is_learn = group.jobs[0].verb is _Verb.LEARN
            if is_learn:
                self._pending_learn_rows -= sum(len(job.X) for job in group.jobs)
            if group.error is not None:
                for job in group.jobs:
                    if not job.future.done():
                        job.future.set_exception(group.error)
                continue
            assert group.output is not None
            if is_learn:
                assert group.losses is not None and group.correct is not None
                self.stats.add(group.losses, group.correct)
                self._metrics.observe_learned(
                    self.name, len(group.losses), float(group.losses.sum()),
                    int(group.correct.sum()),
                )
            offset = 0
            for job in group.jobs:
                n = len(job.X)
                if not job.future.done():
                    if is_learn:
                        assert group.losses is not None
                        job.future.set_result(LearnResult(
                            group.start + offset, group.output[offset:offset + n],
                            group.losses[offset:offset + n],
                        ))
                    else:
                        job.future.set_result(group.output[offset:offset + n])
                offset += n

    # -- snapshots --
    async def save_snapshot(self, store: SnapshotStore, *, force: bool) -> SnapshotInfo | None:
        """Write a snapshot (always when ``force``, else only if changed); None if skipped."""
        return await self._run(self._save_snapshot_sync, store, force)

    def _save_snapshot_sync(self, store: SnapshotStore, force: bool) -> SnapshotInfo | None:
        """(thread) Serialise under the model lock, store outside it (learning continues)."""
        with self.snapshot_lock:
            if self.deleted:
                raise ModelNotFound(self.name)
            t0 = time.perf_counter()
            with self.lock:
                updates = self._updates
                if not force and updates == self._snapshotted_updates:
                    return None
                blob = self.model.to_bytes()
            info = store.save(self.name, blob)
            self._snapshotted_updates = updates
            self.snapshot = info
            self._metrics.observe_snapshot(
                self.name, time.perf_counter() - t0, info.nbytes, info.created_at
            )
            return info

    async def delete_snapshots(self, store: SnapshotStore) -> None:
        """Remove the model's snapshots; no snapshot of it can be written afterwards."""
        await self._run(self._delete_snapshots_sync, store)

    def _delete_snapshots_sync(self, store: SnapshotStore) -> None:
        """(thread) Remove the model's snapshots; no snapshot of it is written afterwards."""
        with self.snapshot_lock:
            self.deleted = True
            try:
                store.delete(self.name)
            except BaseException:
                self.deleted = False
                raise

    def describe(self) -> dict[str, Any]:
        """The model's public info: config, progress, online metrics, latest snapshot."""
        snap = self.snapshot
        return {
            "name": self.name,
            "config": self.model.config,
            "examples_seen": int(self.model.examples_seen),
            "pending_examples": self._pending_learn_rows,
            "nbytes": int(self.model.nbytes),
            "metrics": self.stats.summary(),
            "snapshot": None if snap is None else {
                "version": snap.version,
                "created_at": snap.created_at,
                "nbytes": snap.nbytes,
                "sha256": snap.sha256,
            },
        }


# -- all models -------------------------------------------------------------------------------
class ModelRegistry:
    """The models of one app: create, find, delete, restore and snapshot them.

    Name-level changes (create, delete, start-up restore) are serialised by one asyncio lock,
    so a name never has two lives at once. Until :meth:`restore_all` has finished, lookups of
    names not loaded yet and creates wait for it (up to ``restore_wait_s``, then 503) rather
    than answer a misleading 404 or create a second model of a stored name.
    """

    def __init__(
        self,
        store: SnapshotStore,
        settings: Settings,
        metrics: ServiceMetrics,
        executor: Executor,
    ) -> None:
        self.store = store
        self.settings = settings
        self.metrics = metrics
        self.executor = executor
        self._models: dict[str, ModelEntry] = {}
        self._failed: dict[str, str] = {}  # stored names that could not be restored -> why
        self._names_lock = asyncio.Lock()
        self._restored = asyncio.Event()

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def _entry(self, name: str, model: GLN, snapshot: SnapshotInfo | None) -> ModelEntry:
        return ModelEntry(
            name, model, executor=self.executor, metrics=self.metrics,
            settings=self.settings, snapshot=snapshot,
        )

    def _add(self, entry: ModelEntry) -> None:
        self._models[entry.name] = entry
        entry.start()
        self.metrics.add_model(entry.name, int(entry.model.nbytes))
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

    async def store_reachable(self) -> bool:
        """``store.ping()`` off the event loop."""
        try:
            return bool(await self._run(self.store.ping))
        except Exception:
            return False

    # -- lookups --
    async def _wait_restored(self) -> None:
        """Wait (a bounded time) for start-up restore; 503 if it is still not done."""
        if self.restored:
            return
        try:
            await asyncio.wait_for(self._restored.wait(), self.settings.restore_wait_s)
        except TimeoutError:
            raise Unavailable(
                "models are still being restored from snapshots; retry shortly"
            ) from None

    async def get(self, name: str) -> ModelEntry:
        """The model called ``name``; 404 if unknown (after start-up restore has finished)."""
        entry = self._models.get(name)
        if entry is None:
            await self._wait_restored()  # it may be a stored model not loaded yet
            entry = self._models.get(name)
        if entry is None:
            raise ModelNotFound(name)
        return entry

    def models(self) -> list[ModelEntry]:
        """Every loaded model, by name."""
        return [self._models[name] for name in sorted(self._models)]

    # -- create / delete --
    async def create(self, name: str, config: dict[str, Any]) -> ModelEntry:
        """Build a model from ``config``, store its first snapshot, and start serving it.

        The first snapshot makes a model durable from birth: a restart brings it back even if
        it never learned. 409 if the name exists, 422 for a config GLN rejects, 503 if the
        store cannot take the snapshot (then nothing is created).
        """
        await self._wait_restored()
        if "device" in config:
            raise InvalidRequest(
                "config: 'device' is chosen by the server (GLN_DEVICE), leave it out"
            )
        async with self._names_lock:
            if name in self._models or name in self._failed:
                raise ModelExists(f"model {name!r} already exists")
            try:
                # Sized before it is built: an oversized config must never be allocated.
                needed = GLN.estimate_nbytes(config)
                if needed > self.settings.max_model_bytes:
                    raise InvalidRequest(
                        f"invalid config: the model would hold {needed} bytes, more than "
                        f"GLN_MAX_MODEL_BYTES={self.settings.max_model_bytes}"
                    )
                model = await self._run(self._build, config)
            except (ValueError, TypeError) as exc:
                raise InvalidRequest(f"invalid config: {exc}") from exc
            entry = self._entry(name, model, None)
            try:
                await entry.save_snapshot(self.store, force=True)
            except Exception as exc:
                log.exception("first snapshot of %r failed", name)
                raise Unavailable(f"snapshot store unavailable: {exc}") from exc
            self._add(entry)
            return entry

    def _build(self, config: dict[str, Any]) -> GLN:
        return GLN(**config, device=self.settings.device)

    async def delete(self, name: str) -> None:
        """Finish the model's queued learning, forget it, and remove its snapshots.

        If the store refuses the delete, the model stays loaded and the error is a 503.
        Also removes the snapshots of a stored model that failed to restore.
        """
        await self._wait_restored()
        async with self._names_lock:
            if name in self._failed:
                try:
                    await self._run(self.store.delete, name)
                except Exception as exc:
                    raise Unavailable(f"snapshot store unavailable: {exc}") from exc
                del self._failed[name]
                return
            entry = self._models.pop(name, None)
            if entry is None:
                raise ModelNotFound(name)
            await entry.close()
            try:
                await entry.delete_snapshots(self.store)
            except Exception as exc:
                self._models[name] = entry  # nothing changed: keep serving it
                entry.start()
                raise Unavailable(f"snapshot store unavailable: {exc}") from exc
            self.metrics.forget_model(name)
            self.metrics.models_loaded.set(len(self._models))

    # -- data --
    async def _check(
        self, entry: ModelEntry, features: Sequence[Sequence[float]],
        labels: Sequence[int] | None = None,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Validate a request's rows against the model (width, finiteness, label range).

        Runs before a request joins the queue, so a bad request never touches the model.
        Converting a big request to arrays takes a while: that happens in a thread.
        """
        limit = self.settings.max_rows_per_request
        if len(features) > limit:
            raise InvalidRequest(
                f"features: {len(features)} rows, more than GLN_MAX_ROWS_PER_REQUEST={limit}"
            )
        if labels is not None and len(labels) != len(features):
            raise InvalidRequest(
                f"labels: {len(labels)} labels for {len(features)} feature rows; "
                "give one label per row"
            )
        try:
            if len(features) * len(features[0]) > _INLINE_CHECK_VALUES:
                return await asyncio.to_thread(entry.model.check_input, features, labels)
            return entry.model.check_input(features, labels)
        except (ValueError, TypeError) as exc:
            raise InvalidRequest(str(exc)) from exc

    async def predict(self, name: str, features: Sequence[Sequence[float]]) -> np.ndarray:
        """Class probabilities for each row; counts the rows in the metrics."""
        entry = await self.get(name)
        X, _ = await self._check(entry, features)
        probs = await entry.predict_proba(X)
        self.metrics.observe_predicted(name, len(X))
        return probs

    async def learn(
        self, name: str, features: Sequence[Sequence[float]], labels: Sequence[int]
    ) -> LearnResult:
        """Validate, then queue the rows on the model's single writer and wait for them."""
        entry = await self.get(name)
        X, y = await self._check(entry, features, labels)
        assert y is not None
        return await entry.learn(X, y)

    async def explain(self, name: str, features: Sequence[Sequence[float]]) -> np.ndarray:
        """Per-class saliency of each row: (n, num_classes, num_features)."""
        entry = await self.get(name)
        X, _ = await self._check(entry, features)
        return await entry.saliency(X)

    # -- snapshots --
    async def snapshot(self, name: str) -> SnapshotInfo:
        """Write a snapshot of ``name`` now (even if unchanged) and return its info."""
        entry = await self.get(name)
        try:
            info = await entry.save_snapshot(self.store, force=True)
        except ModelNotFound:
            raise
        except Exception as exc:
            log.exception("snapshot of %r failed", name)
            raise Unavailable(f"snapshot store unavailable: {exc}") from exc
        assert info is not None
        return info

    async def snapshot_changed(self) -> bool:
        """Snapshot every model changed since its last snapshot; False if any save failed."""
        ok = True
        for entry in list(self._models.values()):
            if not entry.changed_since_snapshot:
                continue
            try:
                await entry.save_snapshot(self.store, force=False)
            except ModelNotFound:
                pass  # deleted meanwhile
            except Exception:
                ok = False
                log.exception("snapshot of %r failed", entry.name)
        return ok

    async def snapshot_periodically(self, interval_s: float) -> None:
        """Every ``interval_s`` seconds, snapshot the models that changed (until cancelled)."""
        await self.wait_restored()
        while True:
            await asyncio.sleep(interval_s)
            await self.snapshot_changed()

    # -- start-up and shutdown --
    async def restore_all(self, retry_s: float = 1.0) -> None:
        """Load every stored model (``GLN.from_bytes``, never pickle), then mark restored.

        While the store is unreachable this retries (backing off to 30 s) and the service
        stays unready. A snapshot that loads but cannot be decoded is recorded in ``failed``
        (readiness reports it) instead of blocking the other models.
        """
        async with self._names_lock:
            delay = retry_s
            while True:
                try:
                    names = await self._run(self.store.names)
                    break
                except Exception as exc:
                    log.warning("snapshot store unreachable (%s); retrying in %.0f s", exc, delay)
                    await asyncio.sleep(delay)
                    delay = min(30.0, delay * 2)
            for name in names:
                await self._restore_one(name, retry_s)
            self._restored.set()
        log.info("restored %d model(s); %d failed", len(self._models), len(self._failed))

    async def _restore_one(self, name: str, retry_s: float) -> None:
        delay = retry_s
        while True:
            try:
                loaded = await self._run(self.store.load, name)
                if loaded is None:
                    return  # deleted by someone else since names()
                blob, info = loaded
                model = await self._run(GLN.from_bytes, blob, self.settings.device)
            except Exception as exc:
                if not await self.store_reachable():
                    log.warning("store unreachable restoring %r; retrying in %.0f s", name, delay)
                    await asyncio.sleep(delay)
                    delay = min(30.0, delay * 2)
                    continue
                log.exception("cannot restore model %r", name)
                self._failed[name] = f"{type(exc).__name__}: {exc}"
                return
            self._add(self._entry(name, model, info))
            return

    async def close(self) -> bool:
        """Finish every queued learn request, then snapshot what changed; False on failure."""
        for entry in list(self._models.values()):
            await entry.close()
        return await self.snapshot_changed()
