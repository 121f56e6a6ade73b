"""One model in memory: its ordered request queue, its single writer, its log and snapshots.

The learn path is a queue, and the queue is the batcher: each model owns one
ordered queue of requests, and the engine's passes (:mod:`service.engine.passes`) serve it,
a batch at a time, beside the batches of other models waiting at the same moment. A batch is
everything waiting (up to ``max_chunk_rows`` rows), served in a worker thread, one model call
per run of
consecutive requests of the same verb: a run of learn requests becomes one ``model.learn`` on
the concatenated rows, which equals learning them one by one, so coalescing changes nothing
but the speed, and queue order is update order. Every learned example gets a sequence number
(its 0-based index in the model's stream); a learn response carries its first example's.

Predictions and saliency ride the same queue, so they see every learn request queued before
them and none after, never half of one; serialisation takes the model lock, which is held
while a batch is served. All model and store calls run on the app's thread pool, so the
event loop only moves bytes. With a write-ahead log, each learn run is logged before it is
applied and answered (docs/durability.md).

Rows waiting for delayed labels (:mod:`service.engine.waiting_rows`) change only here too: a run of
predictions with ids is logged as one wait entry and then put to wait, naming the rows that
expire with it (their wait ended, or too many wait); a learn of waiting rows names their ids
in its entry and removes them once applied; rows whose wait ended without a put are dropped
through the queue as well (:meth:`ServedModel.expire`, a wait entry of no rows). A snapshot
carries the rows waiting at its point (after the model's bytes,
:mod:`service.engine.snapshot_blob`).
So the log's order is the order of every change, and a restore gets the same rows back.

A served model owns two parts: its view of the log (appends, doubt, catch-up, rebuild:
:class:`~service.engine.model_log.ModelLog`, which applies entries back through
:meth:`ServedModel.apply_entry`) and its snapshots
(:class:`~service.engine.model_snapshots.ModelSnapshots`, which copies the arrays through
:meth:`ServedModel.capture`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, TypeVar

import numpy as np

from gln import GLN, FamilyMember, SnapshotBuffer
from service.engine.learn_answers import AnswerCache, LearnResult, scored_rows
from service.engine.model_log import ModelLog
from service.engine.model_snapshots import ModelSnapshots
from service.engine.online_stats import OnlineStats
from service.engine.snapshot_blob import WAL_ID
from service.engine.threads import in_thread
from service.engine.waiting_rows import WaitingRow, WaitingRows
from service.errors import (
    IdempotencyKeyReused,
    ModelNotFound,
    RegistryError,
    RequestWithdrawn,
)
from service.log_throttle import Throttled
from service.metrics import ServiceMetrics
from service.settings import Settings
from service.storage.store import SnapshotInfo, SnapshotStore
from service.storage.wal import (
    LogAppend,
    LogEntry,
    WalGapError,
    WriteAheadLog,
    request_digest,
)
from service.storage.wal.interface import append_one

log = logging.getLogger(__name__)
# Failures that repeat with every request while the log or the store is down.
throttled = Throttled(log)


T = TypeVar("T")


class Scheduler(Protocol):
    """What serves a model's queue (:class:`service.engine.passes.Passes`): told when the
    model has work, it takes batches with :meth:`ServedModel.take_batch`, serves them with
    :meth:`ServedModel.serve_batch` and answers them with :meth:`ServedModel.deliver`."""

    def ready(self, served: ServedModel) -> None: ...


class StoredModel(NamedTuple):
    """A model as its latest snapshot holds it: what a restore, or a rebuild after the log
    lost entries, starts from (then the log is replayed on it)."""

    model: GLN | FamilyMember
    info: SnapshotInfo | None  # None: a model of no snapshot yet, as its birth in the log made it
    waiting: list[WaitingRow]


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


@dataclass(eq=False)
class _LearnPlan:
    """(thread) A run of learn requests between ``plan_learn`` and ``finish_learn``."""

    group: _GroupResult
    learned: list[LearnResult | RegistryError | None]  # one per job, as it is answered
    copies: list[tuple[int, int]] = field(default_factory=list)  # (job, earlier same key)
    stale: dict[int, tuple[str, ...]] = field(default_factory=dict)  # job -> ids left out
    fresh: list[int] = field(default_factory=list)  # the jobs whose rows are learned
    run: list[_Job] = field(default_factory=list)  # those jobs
    X: np.ndarray | None = None  # their rows, None if there are none
    y: np.ndarray | None = None
    waiting_rows: list[WaitingRow] = field(default_factory=list)
    entry_id: str | None = None  # the log entry that holds them
    log_append: LogAppend | None = None  # that entry, until it is logged (plan_learn)


class _Verb(enum.Enum):
    LEARN = "learn"
    PREDICT = "predict"
    PREDICT_FOR_LABELS = "predict for labels"  # predict, then the rows wait for labels
    EXPLAIN = "explain"
    EXPIRE = "expire waiting rows"  # drop rows whose label never came (waiting_rows; X empty)


# Verbs that read the model and write nothing, to the log or anywhere.
_READS = frozenset({_Verb.PREDICT, _Verb.EXPLAIN})


@dataclass(eq=False)  # a job is itself: compared by identity (its queue withdraws it)
class _Job:
    verb: _Verb
    X: np.ndarray
    y: np.ndarray | None  # labels, for LEARN only
    future: asyncio.Future[Any]
    key: str | None = None  # LEARN: idempotency key
    scored: np.ndarray | None = None  # LEARN: predictions to score instead of prequential ones
    digest: str | None = None  # LEARN with a key: request_digest(X, y), set by the worker
    # LEARN of waiting rows (one per row of X), which stop waiting once learned; EXPIRE:
    # the rows to drop. PREDICT_FOR_LABELS: the rows' ids.
    waiting_rows: list[WaitingRow] | None = None
    ids: list[str] | None = None
    queued_rows: int = 0  # rows when queued (X may lose stale waiting rows later)

    def __post_init__(self) -> None:
        self.queued_rows = len(self.X)


@dataclass
class _GroupResult:
    """(thread -> loop) The outcome of one run of same-verb jobs."""

    jobs: list[_Job]
    output: np.ndarray | None = None  # PREDICT/EXPLAIN: rows in job order
    expired: int = 0  # EXPIRE: rows dropped
    error: Exception | None = None
    learned: list[LearnResult | RegistryError] | None = None  # LEARN: one per job
    losses: np.ndarray | None = None  # LEARN: prequential log loss per newly learned row
    correct: np.ndarray | None = None  # LEARN: prequential argmax == label, same rows


class ServedModel:
    """One model in memory: its request queue, its stats and snapshot info.

    Every request that touches the weights (learn, predict, explain) joins one ordered queue.
    A pass (:mod:`service.engine.passes`) takes everything waiting (up to ``max_chunk_rows``
    rows), hands it to a worker thread in one go (with other models' batches), and there,
    holding the model lock, serves consecutive requests of the
    same verb with one model call: a run of learns is one ``learn`` on the concatenated rows
    (exactly equal to learning them one by one), a run of predictions one ``predict_proba``.
    So a prediction sees every learn request queued before it and none queued after, never
    half of one; and many small requests cost one thread hop and one model call, not many.

    With a write-ahead log, a learn run is appended to the log (one entry) before it is
    applied, and answered after; ``applied_id`` is the newest entry the weights include, and
    a snapshot records it. Requests whose idempotency key the log already holds are answered
    as duplicates and not learned again. If an append fails, nobody knows whether the entry
    reached the log; the model is then "in doubt" and, before it learns anything else,
    applies whatever the log holds after ``applied_id`` once it is as durable as an
    acknowledged entry, so the weights always equal a replay of the log (docs/durability.md).
    A log that lost entries the model had learned (a Redis failover) is noticed at the next
    append or catch-up, and the model is rebuilt from its snapshot and the log.
    """

    def __init__(
        self,
        name: str,
        model: GLN | FamilyMember,
        *,
        executor: Executor,
        store_executor: Executor | None = None,
        metrics: ServiceMetrics,
        settings: Settings,
        snapshot: SnapshotInfo | None = None,
        wal: WriteAheadLog | None = None,
        load_snapshot: Callable[[], StoredModel | None] | None = None,
        passes: Scheduler,
    ) -> None:
        self.name = name
        self.model = model
        self.wal = wal
        self.applied_id = None if snapshot is None else snapshot.metadata.get(WAL_ID)
        # The model's view of the log (appends, doubt, catch-up, rebuild), None without one.
        self.log = None if wal is None else ModelLog(name, wal, metrics)
        self.snapshots = ModelSnapshots(name, wal, metrics, snapshot)
        self._load_snapshot = load_snapshot
        self._answers = AnswerCache(settings.idempotency_cache_rows)
        # Predicted rows waiting for their label (not the request queue, ``_queue``).
        self.waiting_rows = WaitingRows(settings.label_ttl_s,
                                                  settings.max_pending_label_rows)
        # The label learned for rows whose label never came (GLN_LABEL_DEFAULT), where it is
        # one of this model's classes; else None, and such rows are dropped: the writer drops
        # those that expire as it puts new ones (with a default, the registry learns them).
        default = settings.label_default
        fits = default is not None and default < model.num_classes
        self.label_default = default if fits else None
        if default is not None and not fits:
            log.warning("model %r has %d classes: GLN_LABEL_DEFAULT=%d is none of them, so its "
                        "rows whose label never comes are dropped", name, model.num_classes,
                        default)
        # Set once the server has counted room for this model's waiting rows in its memory
        # budget (the registry, at its first prediction with ids or a restore of waiting rows).
        self.waiting_room_reserved = False
        # What the model may come to hold: its configuration's, which no learning changes.
        self._model_nbytes = GLN.estimate_nbytes(model.config_for_estimate())
        self.stats = OnlineStats(settings.recent_window)
        # `lock` guards the model's arrays: the worker holds it while it serves a batch, and
        # serialisation (to_bytes) takes it, so a snapshot never catches half a learn chunk.
        self.lock = threading.Lock()
        self.updates = 0  # learn calls and waiting-row puts; compared with the snapshotted count
        self._executor = executor
        self._store_executor = store_executor or executor  # the store's calls, apart
        self._metrics = metrics
        self._max_chunk_rows = settings.max_chunk_rows
        self._queue: deque[_Job] = deque()
        self._queued_learn_rows = 0
        self._passes = passes
        # True from the moment the model has queued work until its batch is answered: it is
        # then lined up for a pass, or in one (service.engine.passes); ``idle`` is set
        # otherwise, which a close waits for.
        self.scheduled = False
        self.idle = asyncio.Event()
        self.idle.set()
        self._closing = False
        # Held while a request is checked and queued, so that requests queue in the order
        # they arrived even when a large one is checked in a thread (the registry takes it).
        self.admission = asyncio.Lock()

    # -- lifecycle --
    def start(self) -> None:
        """Take requests (again)."""
        self._closing = False

    async def close(self) -> None:
        """Stop taking requests, and return once every queued one is answered. (A cancelled
        caller, a DELETE a shutdown stopped waiting for, stops only its own wait: the passes
        serving the model's batches go on, and answer their requests.)"""
        self._closing = True
        await self.idle.wait()

    @property
    def changed_since_snapshot(self) -> bool:
        """True when learning (or rows put to wait) happened after the latest snapshot."""
        return self.snapshots.changed(self.updates)

    @property
    def unsnapshotted_updates(self) -> int:
        """Learn runs and waiting-row puts since the latest snapshot: what a restore without
        a newer one replays from the log."""
        return self.snapshots.updates_since(self.updates)

    @property
    def snapshot(self) -> SnapshotInfo | None:
        """The latest snapshot's info."""
        return self.snapshots.latest

    # -- snapshots and bytes --
    async def model_bytes(self) -> memoryview:
        """``GLN.to_bytes()`` between learn runs: every learn request answered so far is in it."""
        return await self._run(self._model_bytes_sync)

    def _model_bytes_sync(self) -> memoryview:
        """(thread) The model's bytes, holding the model lock for a copy of its arrays only."""
        buffer, *_ = self.capture()
        return buffer.seal()

    async def save_snapshot(self, store: SnapshotStore, *, force: bool) -> SnapshotInfo | None:
        """Write a snapshot (always when ``force``, else only if changed); None if skipped."""
        return await in_thread(self._store_executor, self.write_snapshot, store, force)

    def write_snapshot(self, store: SnapshotStore, force: bool) -> SnapshotInfo | None:
        """(store thread) :meth:`save_snapshot` in this thread."""
        return self.snapshots.save(self, store, force)

    async def delete_snapshots(self, store: SnapshotStore) -> None:
        """Remove the model's snapshots and log; no snapshot of it can be written afterwards."""
        await in_thread(self._store_executor, self.snapshots.delete, store)

    def capture(self) -> tuple[SnapshotBuffer, int, str | None, list[WaitingRow]]:
        """(thread) The arrays copied under the model lock, with what they hold: the updates,
        the newest log entry and the rows waiting for labels (``ModelSnapshots.save``)."""
        buffer = SnapshotBuffer(self.model)  # allocated while the model learns on
        with self.lock:
            buffer.capture(self.model)
            return buffer, self.updates, self.applied_id, self.waiting_rows.rows()

    # -- the log --
    def replay_log(self) -> int:
        """(thread) Bring a restored model up to its log: apply the entries after its snapshot,
        once they are as durable as an acknowledged entry (WalDurabilityError until then)."""
        if self.log is None:
            return 0
        with self.lock:
            return self.log.catch_up(self)

    def born(self, entry_id: str | None) -> None:
        """A new model whose birth is the log's entry ``entry_id`` (and the log's end)."""
        self.applied_id = entry_id
        if self.log is not None:
            self.log.end = entry_id

    def apply_entry(self, entry: LogEntry) -> None:
        """(model lock) Learn one log entry, and remember its keyed requests' answers.

        A wait entry puts its rows to wait for labels instead; a learn entry's waiting rows
        stop waiting, as they did when it was logged; a birth (the model as it was created,
        which a restore built it from) holds nothing to learn.
        """
        if entry.birth:
            self.applied_id = entry.id
            return
        if entry.waiting:
            assert entry.predictions is not None
            self._wait(entry.label_ids, entry.features, entry.predictions, entry.expires_at,
                       entry.expired_ids, entry.id)
            return
        if entry.start is not None and entry.start != self.model.examples_seen:
            raise WalGapError(
                f"the log of {self.name!r} lost entries: entry {entry.id} follows example "
                f"{entry.start}, but the snapshot and the entries before it hold "
                f"{int(self.model.examples_seen)}; the model is not served smaller than it was "
                "acknowledged (repair or restore the log, or DELETE the model)")
        start, probs, losses, _ = self._apply(entry.features, entry.labels, entry.id)
        self.waiting_rows.remove_ids(entry.label_ids)
        if len(entry.request_rows) != len(entry.idempotency_keys):
            return
        digests = entry.request_digests or (None,) * len(entry.idempotency_keys)
        offset = 0
        for key, n, digest in zip(entry.idempotency_keys, entry.request_rows, digests,
                                  strict=True):
            if key is not None:
                self._answers.put(key, LearnResult(
                    start + offset, probs[offset:offset + n], losses[offset:offset + n], n,
                    log_id=entry.id,
                ), digest)
            offset += n

    def start_again_from_snapshot(self) -> int | None:
        """(model lock) The weights, waiting rows and applied entry of the latest snapshot, in
        place of this model's (the log lost entries it had learned); the snapshot's version
        (0: the model as its birth in the log made it), or None if there is neither."""
        stored = None if self._load_snapshot is None else self._load_snapshot()
        if stored is None:
            return None
        if isinstance(self.model, FamilyMember):
            self.model.set(stored.model)  # into its own room of its family
        else:
            self.model = stored.model
        self.snapshots.latest = stored.info
        self.applied_id = None if stored.info is None else stored.info.metadata.get(WAL_ID)
        self.waiting_rows.clear()
        self.waiting_rows.put_rows(stored.waiting)
        self._answers = AnswerCache(self._answers.max_rows)
        return 0 if stored.info is None else stored.info.version

    @property
    def waiting_capacity_nbytes(self) -> int:
        """Memory the rows waiting for labels may come to hold (``GLN_MAX_PENDING_LABEL_ROWS``
        rows of this model's sizes)."""
        return self.waiting_rows.capacity_nbytes(self.model.num_features, self.model.num_classes)

    @property
    def reserved_nbytes(self) -> int:
        """What the server counts for this model in its memory budget: what the model may come
        to hold, and its waiting rows' capacity once reserved."""
        return self._model_nbytes + (
            self.waiting_capacity_nbytes if self.waiting_room_reserved else 0)

    @property
    def pending_examples(self) -> int:
        """Examples queued for learning and not applied yet."""
        return self._queued_learn_rows

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await in_thread(self._executor, fn, *args)

    # -- the queue --
    async def learn(
        self, X: np.ndarray, y: np.ndarray, key: str | None = None,
        scored: np.ndarray | None = None, waiting_rows: list[WaitingRow] | None = None,
    ) -> LearnResult:
        """Learn validated rows in queue order; their prequential outputs and sequence.

        ``key`` (an idempotency key): if the log already holds a request with this key, the
        rows are not learned again and the answer is marked ``duplicate``. ``scored``: the
        predictions the online metrics score (delayed labels: those made at predict time);
        by default the prequential ones. ``waiting_rows``: the waiting rows that ``X`` holds,
        one per row (delayed labels); those still waiting when the writer comes to them are
        learned and stop waiting, the others are left out (the answer's ``stale_ids``).
        """
        return await self.answer(self.queue_learn(X, y, key, scored, waiting_rows))

    def queue_learn(
        self, X: np.ndarray, y: np.ndarray, key: str | None = None,
        scored: np.ndarray | None = None, waiting_rows: list[WaitingRow] | None = None,
    ) -> _Job:
        """:meth:`learn`'s rows queued now, at once; :meth:`answer` waits for their result
        (so a caller can queue in an order of its own, then wait outside it)."""
        self._queued_learn_rows += len(y)
        return self._queue_job(_Verb.LEARN, X, y, key=key, scored=scored,
                               waiting_rows=waiting_rows)

    async def predict_proba(self, X: np.ndarray, ids: list[str] | None = None) -> np.ndarray:
        """Class probabilities of checked rows (``check_input``'s), after every learn request
        queued before this one.

        With ``ids`` (one per row), the rows and their predictions then wait for labels
        (:mod:`service.engine.waiting_rows`), logged first: a prediction answered is a row that
        waits.
        """
        if ids is None:
            return await self._submit(_Verb.PREDICT, X, None)
        return await self._submit(_Verb.PREDICT_FOR_LABELS, X, None, ids=ids)

    async def saliency(self, X: np.ndarray) -> np.ndarray:
        """Per-class saliency (n, num_classes, num_features), in queue order like predict."""
        return await self._submit(_Verb.EXPLAIN, X, None)

    async def expire(self, rows: list[WaitingRow]) -> int:
        """Drop waiting rows whose label never came (logged first); how many were dropped.

        Rows that stopped waiting meanwhile (learned, replaced, dropped) are left alone.
        """
        none = np.empty((0, self.model.num_features), np.float32)
        return await self._submit(_Verb.EXPIRE, none, None, waiting_rows=rows)

    async def _submit(
        self, verb: _Verb, X: np.ndarray, y: np.ndarray | None, **fields: Any
    ) -> Any:
        return await self.answer(self._queue_job(verb, X, y, **fields))

    def _queue_job(self, verb: _Verb, X: np.ndarray, y: np.ndarray | None, **fields: Any) -> _Job:
        if self._closing:
            if y is not None:
                self._queued_learn_rows -= len(y)
            raise ModelNotFound(self.name)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        job = _Job(verb, X, y, future, **fields)
        self._queue.append(job)
        if not self.scheduled:
            self.idle.clear()
            self._passes.ready(self)
        return job

    async def answer(self, job: _Job) -> Any:
        """The result of a queued request, once the writer has served it."""
        future = job.future
        # A client that goes away does not cancel its handler: its request is carried out
        # and the answer dropped. A handler is cancelled when a shutdown stops waiting for
        # it: a request still queued is then withdrawn (and answered 503), while one the
        # worker is carrying out is waited for, so that its client learns the outcome
        # (shield: the worker's run must not be cancelled halfway).
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            if self._withdraw(job):
                raise RequestWithdrawn() from None
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            return await asyncio.shield(future)

    def _withdraw(self, job: _Job) -> bool:
        """Take ``job`` out of the queue; False if the worker has taken it already."""
        try:
            self._queue.remove(job)
        except ValueError:
            return False
        if job.verb is _Verb.LEARN:
            self._queued_learn_rows -= job.queued_rows
        job.future.cancel()
        return True

    # -- served by the passes (service.engine.passes) --
    @property
    def has_queued_work(self) -> bool:
        return bool(self._queue)

    def take_batch(self) -> list[_Job]:
        """(loop) Everything waiting, up to max_chunk_rows rows (always at least one request)."""
        jobs = [self._queue.popleft()]
        rows = len(jobs[0].X)
        while self._queue and rows + len(self._queue[0].X) <= self._max_chunk_rows:
            job = self._queue.popleft()
            jobs.append(job)
            rows += len(job.X)
        return jobs

    @staticmethod
    def reads_only(jobs: list[_Job]) -> bool:
        """Whether a batch only reads the model (it never touches the log)."""
        return all(job.verb in _READS for job in jobs)

    def put_in_doubt(self) -> None:
        """(model lock or none held) The log may lack what the model learned last: catch up
        with it (or rebuild) before learning again."""
        if self.log is not None:
            self.log.in_doubt = True

    @staticmethod
    def failed_batch(jobs: list[_Job], error: Exception) -> list[_GroupResult]:
        """The outcome of a batch that could not be served at all: every request, ``error``."""
        return [_GroupResult([job], error=error) for job in jobs]

    def serve_batch(self, jobs: list[_Job]) -> list[_GroupResult]:
        """(thread) Under the lock, one model call per run of consecutive same-verb jobs."""
        groups = [_GroupResult(list(run)) for _, run in itertools.groupby(jobs, lambda j: j.verb)]
        with self.lock:
            for group in groups:
                try:
                    self._serve_group(group)
                except Exception as exc:
                    self._group_failed(group, exc)
        return groups

    def _group_failed(self, group: _GroupResult, exc: Exception) -> None:
        """(thread) Answer the group's requests with ``exc``; the model serves on."""
        verb = group.jobs[0].verb.value
        if isinstance(exc, RegistryError):  # e.g. the log is down: said, not a bug
            throttled.warning(f"{verb} {self.name}", "%s failed for model %r: %s",
                              verb, self.name, exc)
        else:
            log.error("%s failed for model %r", verb, self.name, exc_info=exc)
        group.error = exc

    def learns_in_family(self, jobs: list[_Job]) -> bool:
        """Whether ``jobs`` are learn requests only, of a model that is a family's member: a
        pass may learn them with other members' (``serve_batches``)."""
        return isinstance(self.model, FamilyMember) and all(
            job.verb is _Verb.LEARN for job in jobs)

    def _serve_group(self, group: _GroupResult) -> None:
        jobs = group.jobs
        verb = jobs[0].verb
        if verb is _Verb.LEARN:
            self._learn_group(group)
            return
        if verb is _Verb.EXPIRE:
            group.expired = self._expire_group(jobs)
            return
        X = jobs[0].X if len(jobs) == 1 else np.concatenate([job.X for job in jobs])
        if verb is _Verb.EXPLAIN:
            group.output = self.model.saliency(X)
            return
        if verb is _Verb.PREDICT_FOR_LABELS and self.log is not None:
            self.log.catch_up_if_in_doubt(self)
        group.output = self.model.predict_proba(X, checked=True)  # the registry checked them
        if verb is _Verb.PREDICT_FOR_LABELS:
            self._put_to_wait(jobs, X, group.output)

    def _put_to_wait(self, jobs: list[_Job], X: np.ndarray, probs: np.ndarray) -> None:
        """(model lock) Log the predicted rows as one wait entry, with the rows that expire as
        they come (without a default label), then let them wait and drop those."""
        ids = [row_id for job in jobs for row_id in job.ids or ()]
        now = time.time()
        expires_at = now + self.waiting_rows.ttl_s
        expired = self.waiting_rows.expiring_with(ids, now) if self.label_default is None else []
        probs = np.asarray(probs, dtype=np.float64)
        wal = self.wal
        entry_id = None if self.log is None or wal is None else self.log.logged(
            self, lambda follows: wal.append_waiting(self.name, ids, X, probs, expires_at,
                                                     expired, follows=follows)
        )
        self._wait(ids, X, probs, expires_at, expired, entry_id)
        self._count_expired(len(expired))

    def _expire_group(self, jobs: list[_Job]) -> int:
        """(model lock) Log, then drop, the rows of a run of expire jobs still waiting."""
        if self.log is not None:
            self.log.catch_up_if_in_doubt(self)
        ids = list(dict.fromkeys(row.id for job in jobs for row in job.waiting_rows or ()
                                 if self.waiting_rows.is_waiting(row)))
        if not ids:
            return 0
        none = np.empty((0, self.model.num_features), np.float32)
        no_predictions = np.empty((0, self.model.num_classes), np.float64)
        wal = self.wal
        entry_id = None if self.log is None or wal is None else self.log.logged(
            self, lambda follows: wal.append_waiting(self.name, [], none, no_predictions, 0.0,
                                                     ids, follows=follows)
        )
        self._wait([], none, no_predictions, 0.0, ids, entry_id)
        self._count_expired(len(ids))
        return len(ids)

    def _wait(
        self, ids: Sequence[str], X: np.ndarray, probs: np.ndarray, expires_at: float,
        expired_ids: Sequence[str], entry_id: str | None,
    ) -> None:
        """(model lock) Let rows wait for labels and drop the expired ones (live or replayed),
        as :meth:`_apply` learns."""
        self.waiting_rows.put(ids, X, probs, expires_at)
        self.waiting_rows.remove_ids(expired_ids)
        self.updates += 1
        if entry_id is not None:
            self.applied_id = entry_id

    def _count_expired(self, rows: int) -> None:
        """Count rows dropped live (a replay drops them again without counting)."""
        if rows:
            self._metrics.count_labels_expired(self.name, rows)

    def _learn_group(self, group: _GroupResult) -> None:
        """(thread, model lock) Log, then learn, a run of learn requests; answer each."""
        plan = self.plan_learn(group)
        if plan.X is not None:
            start = int(self.model.examples_seen)
            self.finish_learn(plan, start, self.model.learn(plan.X, plan.y, checked=True))
        else:
            self.finish_learn(plan)

    def plan_learn(self, group: _GroupResult, log_now: bool = True) -> _LearnPlan:
        """(thread, model lock) What a run of learn requests learns, once logged: the log
        caught up with, waiting rows no longer waiting and retried requests sorted out, the
        rest appended to the log as one entry (with ``log_now`` false, only made ready:
        ``plan.log_append``, for ``logged_together``). ``finish_learn`` answers them, once
        the rows are learned (by this model, or in one call with other members of its
        family)."""
        jobs = group.jobs
        plan = _LearnPlan(group, [None] * len(jobs))
        if self.log is not None:
            self.log.catch_up_if_in_doubt(self)
        plan.stale = self._drop_stale_label_rows(jobs, plan.learned)
        plan.fresh = self._sort_out_duplicates(jobs, plan.learned, plan.copies)
        if plan.fresh:
            run = plan.run = [jobs[i] for i in plan.fresh]
            plan.X = run[0].X if len(run) == 1 else np.concatenate([job.X for job in run])
            plan.y = run[0].y if len(run) == 1 else np.concatenate([job.y for job in run])
            assert plan.y is not None
            plan.waiting_rows = [row for job in run for row in job.waiting_rows or ()]
            if self.wal is not None:
                item = self._log_append(run, plan.X, plan.y, plan.waiting_rows)
                if log_now:
                    plan.entry_id = self._append(item)
                else:
                    plan.log_append = item
        return plan

    def finish_learn(self, plan: _LearnPlan, start: int = 0, learned: Any = None,
                     scored: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """(thread, model lock) Answer each request of ``plan``, whose rows (if any) were
        learned from example ``start`` on with the prequential probabilities ``learned``
        (``scored``: their losses and hits, where the caller has them already)."""
        group, jobs = plan.group, plan.group.jobs
        if plan.X is not None:
            assert plan.y is not None
            probs, losses, correct = self._applied(learned, plan.y, plan.entry_id, scored)
            self.waiting_rows.remove_rows(plan.waiting_rows)
            if any(job.scored is not None for job in plan.run):
                losses, correct = scored_rows(_scored_predictions(plan.run, probs), plan.y)
            offset = 0
            for i, job in zip(plan.fresh, plan.run, strict=True):
                n = len(job.X)
                result = LearnResult(
                    start + offset, probs[offset:offset + n], losses[offset:offset + n], n,
                    log_id=plan.entry_id, stale_ids=plan.stale.get(i, ()),
                )
                plan.learned[i] = result
                if job.key is not None:
                    self._answers.put(job.key, result, job.digest)
                offset += n
            group.losses, group.correct = losses, correct
        for i, first in plan.copies:
            original = plan.learned[first]
            assert isinstance(original, LearnResult)
            plan.learned[i] = dataclasses.replace(original, duplicate=True)
        group.learned = [result for result in plan.learned if result is not None]
        assert len(group.learned) == len(jobs)

    def _apply(
        self, X: np.ndarray, y: np.ndarray, entry_id: str | None
    ) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
        """(model lock) Learn rows read back from the log (checked as any others); their
        first sequence, probabilities, losses, hits."""
        start = int(self.model.examples_seen)
        return start, *self._applied(self.model.learn(X, y), y, entry_id)

    def _applied(
        self, learned: Any, y: np.ndarray, entry_id: str | None,
        scored: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(model lock) Count rows learned with the probabilities ``learned``, up to the log
        entry ``entry_id``: their probabilities, losses and hits (``scored``, if given)."""
        probs = np.asarray(learned, dtype=np.float64)
        self.updates += 1
        if entry_id is not None:
            self.applied_id = entry_id
        return probs, *(scored_rows(probs, y) if scored is None else scored)

    def _drop_stale_label_rows(
        self, jobs: list[_Job], learned: list[LearnResult | RegistryError | None]
    ) -> dict[int, tuple[str, ...]]:
        """(model lock) Leave out the waiting rows that stopped waiting since they were looked
        up (another request learned them, they were dropped as expired, a new prediction
        replaced them), and those an earlier request of the run learns.

        Returns the left-out ids per job; a job left with no rows is answered here.
        """
        stale: dict[int, tuple[str, ...]] = {}
        taken: set[str] = set()
        for i, job in enumerate(jobs):
            if job.waiting_rows is None:
                continue
            keep = [row.id not in taken and self.waiting_rows.is_waiting(row)
                    for row in job.waiting_rows]
            taken.update(row.id for row in job.waiting_rows)
            if all(keep):
                continue
            stale[i] = tuple(row.id for row, k in zip(job.waiting_rows, keep, strict=True) if not k)
            kept = np.flatnonzero(keep)
            job.waiting_rows = [job.waiting_rows[k] for k in kept]
            job.X, job.y = job.X[kept], None if job.y is None else job.y[kept]
            job.scored = None if job.scored is None else job.scored[kept]
            if not len(kept):
                learned[i] = LearnResult(None, None, None, 0, stale_ids=stale[i])
        return stale

    def _sort_out_duplicates(
        self, jobs: list[_Job], learned: list[LearnResult | RegistryError | None],
        copies: list[tuple[int, int]],
    ) -> list[int]:
        """(model lock) Indices of jobs to learn; answer the retried ones and refuse reused keys.

        A keyed request whose key is known is a retry when its rows and labels have the
        digest the key was logged with: it gets the original answer, marked duplicate. With
        other rows or labels it is refused (422) and nothing of it is learned. The log knows
        every key within its TTL. Without a log, only the keys whose answers are still in
        memory are recognised (and a restart forgets them).
        """
        keyed = [i for i, job in enumerate(jobs) if job.key is not None]
        if not keyed:
            return [i for i in range(len(jobs)) if learned[i] is None]
        for i in keyed:
            jobs[i].digest = request_digest(jobs[i].X, jobs[i].y)
        known: dict[int, LearnResult | RegistryError] = {}
        if self.wal is not None:
            try:
                logged = self.wal.logged_requests(self.name, [jobs[i].key for i in keyed])
            except Exception as exc:
                assert self.log is not None
                raise self.log.unavailable(exc) from exc
            for i, found in zip(keyed, logged, strict=True):
                if found is not None:
                    known[i] = self._answer_to_retry(jobs[i], found.entry_id, found.digest)
        else:
            for i in keyed:
                cached = self._answers.get(jobs[i].key)
                if cached is not None:
                    original, digest = cached
                    known[i] = self._answer_to_retry(jobs[i], original.log_id, digest)
        first_with: dict[str, int] = {}
        fresh = []
        for i, job in enumerate(jobs):
            key = job.key
            if learned[i] is not None:  # waiting rows that all stopped waiting
                continue
            if key is None:
                fresh.append(i)
            elif i in known:
                learned[i] = known[i]
            elif key in first_with:
                first = jobs[first_with[key]]
                if first.digest == job.digest:
                    copies.append((i, first_with[key]))
                else:
                    learned[i] = IdempotencyKeyReused(key)
            else:
                first_with[key] = i
                fresh.append(i)
        retries = sum(isinstance(answer, LearnResult) and answer.duplicate for answer in learned)
        self._metrics.learn_duplicates.inc(retries + len(copies))
        return fresh

    def _answer_to_retry(
        self, job: _Job, log_id: str | None, digest: str | None
    ) -> LearnResult | RegistryError:
        """The duplicate answer for a known key, or the refusal when its data differ.

        A key logged without a digest (an older log) is taken as a retry, as it was then.
        """
        assert job.key is not None
        if digest is not None and digest != job.digest:
            return IdempotencyKeyReused(job.key)
        cached = self._answers.get(job.key)
        if cached is not None and cached[0].log_id == log_id:
            return dataclasses.replace(cached[0], duplicate=True)
        return LearnResult(None, None, None, len(job.X), duplicate=True, log_id=log_id)

    def _log_append(
        self, jobs: list[_Job], X: np.ndarray, y: np.ndarray, waiting_rows: list[WaitingRow]
    ) -> LogAppend:
        """(model lock) The run as one log entry (naming the waiting rows it learns), to
        follow the log's end as this writer knows it."""
        assert self.log is not None
        return LogAppend(
            self.name, X, y, [job.key for job in jobs], [len(job.X) for job in jobs],
            [job.digest for job in jobs], [row.id for row in waiting_rows],
            follows=self.log.end, start=int(self.model.examples_seen))

    def _append(self, item: LogAppend) -> str:
        """(model lock) Log ``item``, made under this lock hold (so it follows the end that
        ``logged`` knows); its id."""
        wal, model_log = self.wal, self.log
        assert wal is not None and model_log is not None
        return model_log.logged(self, lambda follows: append_one(wal, item))

    def deliver(self, groups: list[_GroupResult]) -> None:
        """(loop) Give every request its slice; count learned examples in stats and metrics."""
        for group in groups:
            is_learn = group.jobs[0].verb is _Verb.LEARN
            if is_learn:
                self._queued_learn_rows -= sum(job.queued_rows for job in group.jobs)
            if group.error is not None:
                for job in group.jobs:
                    if not job.future.done():
                        job.future.set_exception(group.error)
                continue
            if is_learn:
                assert group.learned is not None
                if group.losses is not None and group.correct is not None:
                    loss_sum, hits = self.stats.add(group.losses, group.correct)
                    self._metrics.observe_learned(self.name, len(group.losses), loss_sum, hits)
                for job, result in zip(group.jobs, group.learned, strict=True):
                    if job.future.done():
                        continue
                    if isinstance(result, RegistryError):
                        job.future.set_exception(result)
                    else:
                        job.future.set_result(result)
                continue
            if group.jobs[0].verb is _Verb.EXPIRE:
                for job in group.jobs:
                    if not job.future.done():
                        job.future.set_result(group.expired)
                continue
            assert group.output is not None
            offset = 0
            for job in group.jobs:
                n = len(job.X)
                if not job.future.done():
                    job.future.set_result(group.output[offset:offset + n])
                offset += n

    def describe(self) -> dict[str, Any]:
        """The model's public info: config, progress, online metrics, latest snapshot."""
        snap = self.snapshot
        return {
            "name": self.name,
            "config": self.model.config,
            "examples_seen": int(self.model.examples_seen),
            "pending_examples": self._queued_learn_rows,
            "waiting_for_labels": len(self.waiting_rows),
            "nbytes": int(self.model.nbytes),
            "metrics": self.stats.summary(),
            "snapshot": None if snap is None else {
                "version": snap.version,
                "created_at": snap.created_at,
                "nbytes": snap.nbytes,
                "sha256": snap.sha256,
            },
        }


def serve_batches(batches: list[tuple[ServedModel, list[_Job]]]) -> list[list[_GroupResult]]:
    """(thread) Serve the batches of a pass (``passes``), each model's as ``serve_batch``
    does, except that learn batches of two or more members of one family are learned in one
    ``GLNFamily.learn``: each member learns its rows in their order, exactly as on its own,
    and the family's fixed cost of a call is paid once for all of them."""
    outcomes: list[list[_GroupResult] | None] = [None] * len(batches)
    families: dict[int, list[int]] = {}
    for i, (served, jobs) in enumerate(batches):
        if served.learns_in_family(jobs):
            member = served.model
            assert isinstance(member, FamilyMember)
            families.setdefault(id(member.family), []).append(i)
    for indices in families.values():
        if len(indices) > 1:
            together = _learn_in_family([batches[i] for i in indices])
            for i, groups in zip(indices, together, strict=True):
                outcomes[i] = groups
    return [outcome if outcome is not None else served.serve_batch(jobs)
            for outcome, (served, jobs) in zip(outcomes, batches, strict=True)]


def _learn_in_family(batches: list[tuple[ServedModel, list[_Job]]]) -> list[list[_GroupResult]]:
    """(thread) Learn batches of members of one family (each a run of learn requests) in one
    family call, under every member's lock (a pass holds models no other pass holds, so no
    two threads ever wait for each other's)."""
    first = batches[0][0].model
    assert isinstance(first, FamilyMember)
    groups = [_GroupResult(list(jobs)) for _, jobs in batches]
    with contextlib.ExitStack() as locks:
        for served, _ in batches:
            locks.enter_context(served.lock)
        planned: list[tuple[ServedModel, _LearnPlan]] = []
        for (served, _), group in zip(batches, groups, strict=True):
            try:
                planned.append((served, served.plan_learn(group, log_now=False)))
            except Exception as exc:
                served._group_failed(group, exc)
        planned = logged_together(planned)
        learning = [(served, plan) for served, plan in planned if plan.X is not None]
        if learning:
            X = np.concatenate([plan.X for _, plan in learning])
            y = np.concatenate([plan.y for _, plan in learning])
            members = np.concatenate([
                np.full(len(plan.X), served.model.index, dtype=np.int64)
                for served, plan in learning])
            starts = [int(served.model.examples_seen) for served, _ in learning]
            try:
                probs = np.asarray(first.family.learn(X, y, members, checked=True),
                                   dtype=np.float64)
            except Exception as exc:  # logged, not learned: each catches up with its log
                for served, plan in learning:
                    served.put_in_doubt()
                    served._group_failed(plan.group, exc)
                learning = []
            else:  # scored in one go: per member, numpy's fixed costs were most of it
                losses, correct = scored_rows(probs, y)
            offset = 0
            for (served, plan), start in zip(learning, starts, strict=True):
                rows = slice(offset, offset + len(plan.X))
                served.finish_learn(plan, start, probs[rows], (losses[rows], correct[rows]))
                offset = rows.stop
        for served, plan in planned:
            if plan.X is None:
                served.finish_learn(plan)
    return [[group] for group in groups]


def logged_together(
    planned: list[tuple[ServedModel, _LearnPlan]]
) -> list[tuple[ServedModel, _LearnPlan]]:
    """(thread, every model's lock) Log the entries the plans made ready in one
    ``append_many`` (one write, and the pass's one sync, on the file log); the plans that may
    go on: each whose entry failed is answered as its own append would have been
    (``ModelLog.append_failed``: a 503, the model in doubt or rebuilt)."""
    ready = [(served, plan) for served, plan in planned if plan.log_append is not None]
    if not ready:
        return planned
    wal = ready[0][0].wal
    assert wal is not None
    t0 = time.perf_counter()
    try:
        results: list[str | Exception] = wal.append_many(
            [plan.log_append for _, plan in ready])  # type: ignore[misc]
    except Exception as exc:  # the call as a whole: each entry's outcome is unknown
        results = [exc] * len(ready)
    seconds = time.perf_counter() - t0
    for (served, plan), result in zip(ready, results, strict=True):
        assert served.log is not None
        plan.log_append = None
        if isinstance(result, Exception):
            answer = served.log.append_failed(served, result)
            answer.__cause__ = result
            served._group_failed(plan.group, answer)
        else:
            plan.entry_id = served.log.appended(result, seconds)
    return [(served, plan) for served, plan in planned if plan.group.error is None]
