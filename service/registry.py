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
import dataclasses
import enum
import itertools
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from gln import GLN
from service.metrics import ServiceMetrics
from service.pending import PendingPredictions, PendingRow
from service.settings import Settings
from service.store import SnapshotInfo, SnapshotStore
from service.wal import LogEntry, WriteAheadLog

# Snapshot metadata key: id of the last log entry the snapshot's weights include.
WAL_ID = "wal_id"

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
    """Not restored yet, or the snapshot store or the write-ahead log cannot be reached."""

    status_code = 503


class LimitExceeded(RegistryError):
    """Creating the model would pass GLN_MAX_MODELS or GLN_MAX_TOTAL_MODEL_BYTES."""

    status_code = 409


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


def _score(probs: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Log loss (nats) and argmax hit of each row's prediction ``probs`` for label ``y``."""
    p_true = probs[np.arange(len(y)), y]
    return -np.log(np.clip(p_true, _MIN_PROB, 1.0)), probs.argmax(axis=1) == y


def _scored_predictions(jobs: list[_Job], probs: np.ndarray) -> np.ndarray:
    """``probs`` with the rows of jobs that bring their own predictions replaced by those."""
    scored = probs.copy()
    offset = 0
    for job in jobs:
        n = len(job.X)
        if job.scored is not None:
            scored[offset:offset + n] = job.scored
        offset += n
    return scored


# -- one model ----------------------------------------------------------------------------------
@dataclass
class LearnResult:
    """What one learn request gets back: its rows' prequential probabilities and losses.

    A retried request (same idempotency key) is not learned again: it gets ``duplicate`` and
    the original answer when this process still holds it (else None for the three fields).
    """

    sequence: int | None  # stream index of the request's first example
    probabilities: np.ndarray | None  # (n, num_classes), each row before its own update
    losses: np.ndarray | None  # (n,) log loss of each row, nats
    rows: int
    duplicate: bool = False
    log_id: str | None = None  # the write-ahead log entry holding the rows

    @property
    def mean_loss(self) -> float | None:
        """Mean log loss of the request's rows (nats); equal to ``losses.mean()``."""
        # sum / n rather than ndarray.mean(): a third of the cost on the one-row arrays that
        # single-example requests get, and the same float.
        if self.losses is None:
            return None
        return float(self.losses.sum()) / len(self.losses)


class _AnswerCache:
    """The original answers of the newest keyed learn requests, at most ``max_rows`` rows.

    Lets a retry get exactly what the original request got. Touched only under the model
    lock (worker thread, replay).
    """

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self._answers: OrderedDict[str, LearnResult] = OrderedDict()
        self._rows = 0

    def put(self, key: str, result: LearnResult) -> None:
        if result.rows > self.max_rows:
            return
        old = self._answers.pop(key, None)
        if old is not None:
            self._rows -= old.rows
        self._answers[key] = result
        self._rows += result.rows
        while self._rows > self.max_rows:
            _, dropped = self._answers.popitem(last=False)
            self._rows -= dropped.rows

    def get(self, key: str) -> LearnResult | None:
        return self._answers.get(key)


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
    key: str | None = None  # LEARN: idempotency key
    scored: np.ndarray | None = None  # LEARN: predictions to score instead of prequential ones


@dataclass
class _GroupResult:
    """(thread -> loop) The outcome of one run of same-verb jobs."""

    jobs: list[_Job]
    output: np.ndarray | None = None  # PREDICT/EXPLAIN: rows in job order
    error: Exception | None = None
    learned: list[LearnResult] | None = None  # LEARN: one per job
    losses: np.ndarray | None = None  # LEARN: prequential log loss per newly learned row
    correct: np.ndarray | None = None  # LEARN: prequential argmax == label, same rows


class ModelEntry:
    """One model in memory: its request queue and worker, its stats and snapshot info.

    Every request that touches the weights (learn, predict, explain) joins one ordered queue.
    The worker takes everything waiting (up to ``max_chunk_rows`` rows), hands it to a worker
    thread in one go, and there, holding the model lock, serves consecutive requests of the
    same verb with one model call: a run of learns is one ``learn`` on the concatenated rows
    (exactly equal to learning them one by one), a run of predictions one ``predict_proba``.
    So a prediction sees every learn request queued before it and none queued after, never
    half of one; and many small requests cost one thread hop and one model call, not many.

    With a write-ahead log, a learn run is appended to the log (one entry) before it is
    applied, and answered after; ``applied_id`` is the newest entry the weights include, and
    a snapshot records it. Requests whose idempotency key the log already holds are answered
    as duplicates and not learned again. If an append fails, nobody knows whether the entry
    reached the log; the model is then "in doubt" and, before it learns anything else,
    applies whatever the log holds after ``applied_id``, so the weights always equal a
    replay of the log (docs/durability.md).
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
        wal: WriteAheadLog | None = None,
    ) -> None:
        self.name = name
        self.model = model
        self.snapshot = snapshot
        self.wal = wal
        self.applied_id = None if snapshot is None else snapshot.metadata.get(WAL_ID)
        self._log_in_doubt = False
        self._answers = _AnswerCache(settings.idempotency_cache_rows)
        self.pending = PendingPredictions(settings.label_ttl_s, settings.max_pending_label_rows)
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
    async def learn(
        self, X: np.ndarray, y: np.ndarray, key: str | None = None,
        scored: np.ndarray | None = None,
    ) -> LearnResult:
        """Learn validated rows in queue order; their prequential outputs and sequence.

        ``key`` (an idempotency key): if the log already holds a request with this key, the
        rows are not learned again and the answer is marked ``duplicate``. ``scored``: the
        predictions the online metrics score (delayed labels: those made at predict time);
        by default the prequential ones.
        """
        self._pending_learn_rows += len(y)
        return await self._submit(_Verb.LEARN, X, y, key, scored)

    async def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """Class probabilities, after every learn request queued before this one."""
        return await self._submit(_Verb.PREDICT, X, None)

    async def saliency(self, X: np.ndarray) -> np.ndarray:
        """Per-class saliency (n, num_classes, num_features), in queue order like predict."""
        return await self._submit(_Verb.EXPLAIN, X, None)

    async def _submit(
        self, verb: _Verb, X: np.ndarray, y: np.ndarray | None, key: str | None = None,
        scored: np.ndarray | None = None,
    ) -> Any:
        if self._closing:
            if y is not None:
                self._pending_learn_rows -= len(y)
            raise ModelNotFound(self.name)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append(_Job(verb, X, y, future, key, scored))
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
                except RegistryError as exc:  # e.g. the log is down: said, not a bug
                    log.warning("%s failed for model %r: %s", group.jobs[0].verb.value,
                                self.name, exc)
                    group.error = exc
                except Exception as exc:  # answer the group's requests; keep serving others
                    log.exception("%s failed for model %r", group.jobs[0].verb.value, self.name)
                    group.error = exc
        return groups

    def _serve_group(self, group: _GroupResult) -> None:
        jobs = group.jobs
        verb = jobs[0].verb
        if verb is _Verb.LEARN:
            self._learn_group(group)
            return
        X = jobs[0].X if len(jobs) == 1 else np.concatenate([job.X for job in jobs])
        if verb is _Verb.PREDICT:
            group.output = self.model.predict_proba(X)
        else:
            group.output = self.model.saliency(X)

    def _learn_group(self, group: _GroupResult) -> None:
        """(thread, model lock) Log, then learn, a run of learn requests; answer each."""
        jobs = group.jobs
        learned: list[LearnResult | None] = [None] * len(jobs)
        copies: list[tuple[int, int]] = []  # (job, earlier job with the same key in the run)
        fresh = list(range(len(jobs)))
        if self.wal is not None:
            if self._log_in_doubt:
                self._catch_up_or_refuse()
            fresh = self._sort_out_duplicates(jobs, learned, copies)
        if fresh:
            run = [jobs[i] for i in fresh]
            X = run[0].X if len(run) == 1 else np.concatenate([job.X for job in run])
            y = run[0].y if len(run) == 1 else np.concatenate([job.y for job in run])
            assert y is not None
            entry_id = None if self.wal is None else self._append(run, X, y)
            start, probs, losses, correct = self._apply(X, y, entry_id)
            if any(job.scored is not None for job in run):
                losses, correct = _score(_scored_predictions(run, probs), y)
            offset = 0
            for i, job in zip(fresh, run, strict=True):
                n = len(job.X)
                result = LearnResult(
                    start + offset, probs[offset:offset + n], losses[offset:offset + n], n,
                    log_id=entry_id,
                )
                learned[i] = result
                if job.key is not None:
                    self._answers.put(job.key, result)
                offset += n
            group.losses, group.correct = losses, correct
        for i, first in copies:
            original = learned[first]
            assert original is not None
            learned[i] = dataclasses.replace(original, duplicate=True)
        group.learned = [result for result in learned if result is not None]
        assert len(group.learned) == len(jobs)

    def _apply(
        self, X: np.ndarray, y: np.ndarray, entry_id: str | None
    ) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
        """(model lock) Learn rows; their first sequence, probabilities, losses, hits."""
        start = int(self.model.examples_seen)
        probs = np.asarray(self.model.learn(X, y), dtype=np.float64)
        self._updates += 1
        if entry_id is not None:
            self.applied_id = entry_id
        return start, probs, *_score(probs, y)

    def _sort_out_duplicates(
        self, jobs: list[_Job], learned: list[LearnResult | None],
        copies: list[tuple[int, int]],
    ) -> list[int]:
        """(model lock) Indices of jobs to learn; fill in the answers of the retried ones."""
        assert self.wal is not None
        keyed = [i for i, job in enumerate(jobs) if job.key is not None]
        if not keyed:
            return list(range(len(jobs)))
        try:
            logged = self.wal.seen_keys(self.name, [jobs[i].key for i in keyed])
        except Exception as exc:
            raise self._log_unavailable(exc) from exc
        logged_at = dict(zip(keyed, logged, strict=True))
        first_with: dict[str, int] = {}
        fresh = []
        for i, job in enumerate(jobs):
            key = job.key
            if key is None:
                fresh.append(i)
            elif logged_at[i] is not None:
                learned[i] = self._duplicate_answer(key, len(job.X), logged_at[i])
            elif key in first_with:
                copies.append((i, first_with[key]))
            else:
                first_with[key] = i
                fresh.append(i)
        self._metrics.learn_duplicates.inc(len(jobs) - len(fresh))
        return fresh

    def _duplicate_answer(self, key: str, rows: int, log_id: str | None) -> LearnResult:
        original = self._answers.get(key)
        if original is not None and original.log_id == log_id:
            return dataclasses.replace(original, duplicate=True)
        return LearnResult(None, None, None, rows, duplicate=True, log_id=log_id)

    def _append(self, jobs: list[_Job], X: np.ndarray, y: np.ndarray) -> str:
        """(model lock) Log the run as one entry; 503 (Unavailable) if the log fails.

        After a failure the entry may or may not be in the log (the write may have landed and
        only its answer been lost); the model is put in doubt and catches up at once if it
        can, else before its next learn, so it never skips or repeats a logged entry.
        """
        assert self.wal is not None
        t0 = time.perf_counter()
        try:
            entry_id = self.wal.append(
                self.name, X, y, [job.key for job in jobs], [len(job.X) for job in jobs]
            )
        except Exception as exc:
            self._metrics.wal_append_errors.inc()
            self._log_in_doubt = True
            log.warning("log append for %r failed: %s", self.name, exc)
            try:
                self._catch_up()
            except Exception as again:
                log.warning("catching %r up with its log failed too: %s", self.name, again)
            raise Unavailable(
                f"write-ahead log did not confirm the append ({type(exc).__name__}: {exc}); "
                "the request is not acknowledged: retry it with the same Idempotency-Key"
            ) from exc
        self._metrics.wal_append_duration.observe(time.perf_counter() - t0)
        return entry_id

    def _log_unavailable(self, exc: Exception) -> Unavailable:
        """The 503 for a log that could not be read before anything was learned."""
        self._metrics.wal_append_errors.inc()
        return Unavailable(
            f"write-ahead log unavailable ({type(exc).__name__}: {exc}); nothing was "
            "learned: retry it with the same Idempotency-Key"
        )

    def _catch_up_or_refuse(self) -> None:
        """(model lock) :meth:`_catch_up` before new learning; 503 while the log is down."""
        try:
            self._catch_up()
        except Exception as exc:
            raise self._log_unavailable(exc) from exc

    def _catch_up(self) -> int:
        """(model lock) Apply every log entry after ``applied_id``; how many there were.

        At restore this is the replay of the log tail; after a failed append it picks up an
        entry that reached the log although its append raised.
        """
        assert self.wal is not None
        count = 0
        for entry in self.wal.read_after(self.name, self.applied_id):
            self._apply_logged(entry)
            count += 1
        self._log_in_doubt = False
        return count

    def _apply_logged(self, entry: LogEntry) -> None:
        """(model lock) Learn one log entry, and remember its keyed requests' answers."""
        start, probs, losses, _ = self._apply(entry.features, entry.labels, entry.id)
        self._metrics.wal_replayed_entries.inc()
        self._metrics.wal_replayed_examples.inc(len(entry.labels))
        if len(entry.request_rows) != len(entry.idempotency_keys):
            return
        offset = 0
        for key, n in zip(entry.idempotency_keys, entry.request_rows, strict=True):
            if key is not None:
                self._answers.put(key, LearnResult(
                    start + offset, probs[offset:offset + n], losses[offset:offset + n], n,
                    log_id=entry.id,
                ))
            offset += n

    def replay_log(self) -> int:
        """(thread) Bring a restored model up to its log: apply the entries after its snapshot."""
        if self.wal is None:
            return 0
        with self.lock:
            return self._catch_up()

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
            if is_learn:
                assert group.learned is not None
                if group.losses is not None and group.correct is not None:
                    self.stats.add(group.losses, group.correct)
                    self._metrics.observe_learned(
                        self.name, len(group.losses), float(group.losses.sum()),
                        int(group.correct.sum()),
                    )
                for job, result in zip(group.jobs, group.learned, strict=True):
                    if not job.future.done():
                        job.future.set_result(result)
                continue
            assert group.output is not None
            offset = 0
            for job in group.jobs:
                n = len(job.X)
                if not job.future.done():
                    job.future.set_result(group.output[offset:offset + n])
                offset += n

    # -- snapshots --
    async def save_snapshot(self, store: SnapshotStore, *, force: bool) -> SnapshotInfo | None:
        """Write a snapshot (always when ``force``, else only if changed); None if skipped."""
        return await self._run(self._save_snapshot_sync, store, force)

    def _save_snapshot_sync(self, store: SnapshotStore, force: bool) -> SnapshotInfo | None:
        """(thread) Serialise under the model lock, store outside it (learning continues).

        The snapshot records the newest log entry its weights include; once it is the
        current snapshot, the log is trimmed through that entry (a failed trim only leaves
        a longer log, which replays to the same model).
        """
        with self.snapshot_lock:
            if self.deleted:
                raise ModelNotFound(self.name)
            t0 = time.perf_counter()
            with self.lock:
                updates = self._updates
                if not force and updates == self._snapshotted_updates:
                    return None
                applied_id = self.applied_id
                blob = self.model.to_bytes()
            metadata = None if applied_id is None else {WAL_ID: applied_id}
            info = store.save(self.name, blob, metadata=metadata)
            self._snapshotted_updates = updates
            self.snapshot = info
            self._metrics.observe_snapshot(
                self.name, time.perf_counter() - t0, info.nbytes, info.created_at
            )
            if self.wal is not None and applied_id is not None:
                try:
                    self.wal.trim_through(self.name, applied_id)
                except Exception as exc:
                    log.warning("trimming the log of %r failed (kept longer): %s", self.name, exc)
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
            if self.wal is not None:
                # After the snapshots: a crash in between, or a failure here, leaves a log
                # without a model, which restore ignores and the next create of the name clears.
                try:
                    self.wal.delete(self.name)
                except Exception as exc:
                    log.warning("deleting the log of %r failed (left behind): %s", self.name, exc)

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


def _check_ids(ids: Sequence[str], rows: int, against: str) -> None:
    """422 unless there is one id per row and no id twice."""
    if len(ids) != rows:
        raise InvalidRequest(f"ids: {len(ids)} ids for {rows} {against}; give one id per row")
    if len(set(ids)) != len(ids):
        raise InvalidRequest("ids: an id appears twice; give each row its own id")


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
        wal: WriteAheadLog | None = None,
    ) -> None:
        self.store = store
        self.wal = wal
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
            settings=self.settings, snapshot=snapshot, wal=self.wal,
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
        """``ping()`` of the store and of the log, off the event loop."""
        try:
            return bool(await self._run(self._ping))
        except Exception:
            return False

    def _ping(self) -> bool:
        return bool(self.store.ping()) and (self.wal is None or bool(self.wal.ping()))

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
                self._check_room(needed)
                model = await self._run(self._build, config)
            except (ValueError, TypeError) as exc:
                raise InvalidRequest(f"invalid config: {exc}") from exc
            entry = self._entry(name, model, None)
            try:
                if self.wal is not None:  # a log left by a crash during an earlier delete
                    await self._run(self.wal.delete, name)
                await entry.save_snapshot(self.store, force=True)
            except Exception as exc:
                log.exception("first snapshot of %r failed", name)
                raise Unavailable(f"snapshot store unavailable: {exc}") from exc
            self._add(entry)
            return entry

    def _check_room(self, needed: int) -> None:
        """409 if one more model of ``needed`` bytes passes the server's limits."""
        limit = self.settings.max_models
        if len(self._models) + len(self._failed) >= limit:
            raise LimitExceeded(
                f"the server holds {len(self._models)} models, GLN_MAX_MODELS={limit}; "
                "delete one first"
            )
        held = sum(int(entry.model.nbytes) for entry in self._models.values())
        budget = self.settings.max_total_model_bytes
        if held + needed > budget:
            raise LimitExceeded(
                f"the model would hold {needed} bytes and the server's models hold {held}; "
                f"together more than GLN_MAX_TOTAL_MODEL_BYTES={budget}"
            )

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
                    if self.wal is not None:
                        await self._run(self.wal.delete, name)
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

    async def predict(
        self, name: str, features: Sequence[Sequence[float]], ids: Sequence[str] | None = None
    ) -> np.ndarray:
        """Class probabilities for each row; counts the rows in the metrics.

        With ``ids`` (one per row, unique), each row and its prediction wait for a label
        (:meth:`labels`) for ``label_ttl_s`` seconds.
        """
        entry = await self.get(name)
        if ids is not None:
            _check_ids(ids, len(features), "features")
        X, _ = await self._check(entry, features)
        probs = await entry.predict_proba(X)
        self.metrics.observe_predicted(name, len(X))
        if ids is not None:
            pushed_out = entry.pending.put(ids, X, probs, time.time())
            await self._expire(entry, pushed_out)
        return probs

    async def labels(
        self, name: str, ids: Sequence[str], labels: Sequence[int]
    ) -> tuple[LearnResult | None, list[str]]:
        """Learn the waiting rows of ``ids`` with ``labels``; also the ids not waiting.

        Rows are learned in the order given, scored in the online metrics by the prediction
        made at predict time. Ids that are unknown or expired are returned, not learned. If
        learning fails the claimed rows wait again and the error is raised.
        """
        entry = await self.get(name)
        limit = self.settings.max_rows_per_request
        if len(ids) > limit:
            raise InvalidRequest(f"ids: {len(ids)} ids, more than GLN_MAX_ROWS_PER_REQUEST={limit}")
        _check_ids(ids, len(labels), "labels")
        await self._expire(entry, entry.pending.pop_expired(time.time()))
        rows, missing = entry.pending.claim(ids, time.time())
        if not rows:
            return None, missing
        wanted = dict(zip(ids, labels, strict=True))
        try:
            X, y = entry.model.check_input(
                np.stack([row.features for row in rows]), [wanted[row.id] for row in rows]
            )
        except (ValueError, TypeError) as exc:
            entry.pending.give_back(rows)
            raise InvalidRequest(str(exc)) from exc
        assert y is not None
        try:
            result = await entry.learn(X, y, scored=np.stack([row.prediction for row in rows]))
        except BaseException:
            entry.pending.give_back(rows)
            raise
        finally:
            self.metrics.labels_pending.labels(model=name).set(len(entry.pending))
        self.metrics.labels_learned.labels(model=name).inc(len(rows))
        return result, missing

    async def _expire(self, entry: ModelEntry, rows: list[PendingRow]) -> None:
        """Rows whose label did not come: count them, and learn them with the default label."""
        self.metrics.labels_pending.labels(model=entry.name).set(len(entry.pending))
        if not rows:
            return
        self.metrics.labels_expired.labels(model=entry.name).inc(len(rows))
        default = self.settings.label_default
        if default is None:
            return
        try:
            X, y = entry.model.check_input(
                np.stack([row.features for row in rows]), [default] * len(rows)
            )
            assert y is not None
            await entry.learn(X, y, scored=np.stack([row.prediction for row in rows]))
        except Exception:
            log.exception("learning %d expired rows of %r with the default label failed",
                          len(rows), entry.name)

    async def expire_labels_periodically(self, interval_s: float) -> None:
        """Every ``interval_s`` seconds, expire the rows that waited too long for a label."""
        await self.wait_restored()
        while True:
            await asyncio.sleep(interval_s)
            now = time.time()
            for entry in list(self._models.values()):
                await self._expire(entry, entry.pending.pop_expired(now))

    async def learn(
        self, name: str, features: Sequence[Sequence[float]], labels: Sequence[int],
        key: str | None = None,
    ) -> LearnResult:
        """Validate, then queue the rows on the model's single writer and wait for them.

        ``key`` is the request's idempotency key (already checked): a request whose key the
        log holds is answered as a duplicate, not learned twice.
        """
        entry = await self.get(name)
        X, y = await self._check(entry, features, labels)
        assert y is not None
        return await entry.learn(X, y, key)

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
            except Exception as exc:  # the store is down, typically: say so, once per model
                ok = False
                log.warning("snapshot of %r failed: %s: %s", entry.name, type(exc).__name__,
                            exc, exc_info=log.isEnabledFor(logging.DEBUG))
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
                entry = self._entry(name, model, info)
                t0 = time.perf_counter()
                replayed = await self._run(entry.replay_log)
            except Exception as exc:
                if not await self.store_reachable():
                    log.warning("store unreachable restoring %r; retrying in %.0f s", name, delay)
                    await asyncio.sleep(delay)
                    delay = min(30.0, delay * 2)
                    continue
                log.exception("cannot restore model %r", name)
                self._failed[name] = f"{type(exc).__name__}: {exc}"
                return
            log.info(
                "restored %r: snapshot version %d, then %d log entries in %.3f s",
                name, info.version, replayed, time.perf_counter() - t0,
            )
            self._add(entry)
            return

    async def close(self) -> bool:
        """Finish every queued learn request, then snapshot what changed; False on failure."""
        for entry in list(self._models.values()):
            await entry.close()
        return await self.snapshot_changed()
