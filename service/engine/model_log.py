"""A model's write-ahead log, seen from its single writer: appends that either confirm or
leave the model in doubt, catching up with what the log holds, and rebuilding from the
snapshot when the log lost entries the model had learned (docs/durability.md).

The weights always equal a replay of the log: every learn run is logged before it is applied,
an append whose outcome is unknown puts the model in doubt until it has applied whatever the
log holds after ``applied_id``, and entries are applied only once they are as durable as an
acknowledged one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from gln import GLN
from service.engine.learn_answers import AnswerCache, LearnResult
from service.engine.snapshot_blob import WAL_ID
from service.engine.waiting_rows import WaitingRows
from service.errors import Unavailable
from service.log_throttle import Throttled
from service.metrics import ServiceMetrics
from service.storage.store import SnapshotInfo
from service.storage.wal import (
    ANY_END,
    LogEntry,
    WalDivergedError,
    WalDurabilityError,
    WriteAheadLog,
)

log = logging.getLogger(__name__)
# Failures that repeat with every request while the log is down.
throttled = Throttled(log)


def _log_failure(exc: Exception) -> str:
    """What a client is told of a failed log call: a durability shortfall in full (it says
    what the log lacks), anything else by its type (a connection error's message names the
    server's address; the service log has it)."""
    if isinstance(exc, WalDurabilityError):
        return f"{type(exc).__name__}: {exc}"
    return f"{type(exc).__name__}; see the service log"


class LoggedWriterMixin:
    """The log part of ``service.engine.served_model.ServedModel``: its appends, catch-up and
    rebuild (an entry is applied by the entry's own ``_apply`` and ``_wait``, as a request's run
    is). Every method runs in a worker thread holding the model lock, except ``replay_log``, which
    takes it."""

    name: str
    model: GLN
    snapshot: SnapshotInfo | None
    wal: WriteAheadLog | None
    applied_id: str | None
    waiting_rows: WaitingRows
    lock: threading.Lock
    durability_shortfall: tuple[str, float] | None
    log_confirmed_at: float
    _log_in_doubt: bool
    _log_end: str | None
    _answers: AnswerCache
    _metrics: ServiceMetrics
    _load_snapshot: Callable[[], Any] | None  # -> service.engine.served_model.StoredModel | None

    def _logged(self, append: Callable[[str | None], str]) -> str:
        """(model lock) The id of the entry ``append`` logs after the log's end as this
        writer knows it; 503 (Unavailable) if it fails.

        After a failure the entry may or may not be in the log (the write may have landed and
        only its answer been lost); the model is put in doubt and catches up at once if it
        can, else before it next logs, so it never skips or repeats a logged entry. If the
        log no longer ends where this writer left it, entries the model learned are gone
        from it: the model is rebuilt from its snapshot and the log (:meth:`_rebuild`).
        """
        t0 = time.perf_counter()
        try:
            entry_id = append(self._log_end)
        except WalDivergedError as exc:
            self._metrics.wal_append_errors.inc()
            log.warning("%s", exc)
            try:
                self._rebuild()
            except Exception as again:
                log.warning("rebuilding %r from its snapshot and log failed: %s", self.name,
                            again)
            raise Unavailable(
                f"{exc}; the model was rebuilt from its snapshot and log, and this request "
                "is not acknowledged: retry it with the same Idempotency-Key"
            ) from exc
        except Exception as exc:
            self._metrics.wal_append_errors.inc()
            self._log_in_doubt = True
            self._note_shortfall(exc)
            throttled.warning(f"append {self.name}", "log append for %r failed: %s",
                              self.name, exc)
            # An entry the replicas did not confirm in time is not confirmed a moment later
            # either: the next request catches up (and waits for them) instead.
            if not isinstance(exc, WalDurabilityError):
                try:
                    self._catch_up()
                except Exception as again:
                    log.warning("catching %r up with its log failed too: %s", self.name, again)
            raise Unavailable(
                f"write-ahead log did not confirm the append ({_log_failure(exc)}); "
                "the request is not acknowledged: retry it with the same Idempotency-Key "
                "(a prediction with ids: with the same ids)"
            ) from exc
        self._metrics.wal_append_duration.observe(time.perf_counter() - t0)
        self._log_end = entry_id
        self.log_confirmed_at = time.monotonic()
        return entry_id

    def _note_shortfall(self, exc: Exception) -> None:
        if isinstance(exc, WalDurabilityError):
            self.durability_shortfall = (str(exc), time.monotonic())

    def _log_unavailable(self, exc: Exception) -> Unavailable:
        """The 503 for a log that could not be read before anything was learned (the cause
        logged here: the client is told only its type)."""
        self._metrics.wal_append_errors.inc()
        self._note_shortfall(exc)
        throttled.warning(f"read {self.name}", "reading the log of %r failed: %s: %s",
                          self.name, type(exc).__name__, exc)
        return Unavailable(
            f"write-ahead log unavailable ({_log_failure(exc)}); nothing was "
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
        entry that reached the log although its append raised. Entries are applied only once
        they are as durable as an acknowledged one (the log's ``wait_durable``: a replica
        has them), else WalDurabilityError and the model stays in doubt: learned but not
        replicated, an entry could be lost in a failover while the model and its snapshots
        kept it. A log that no longer reaches where this writer left it has lost entries
        the model learned: the model is rebuilt.
        """
        assert self.wal is not None
        known_end = self._log_end
        if known_end not in (ANY_END, None) and not self.wal.reaches(self.name, known_end):
            log.warning("the log of %r ends at %s, before %s where this writer left it",
                        self.name, self.wal.last_id(self.name), known_end)
            return self._rebuild()
        self.wal.wait_durable()
        count = 0
        for entry in self.wal.read_after(self.name, self.applied_id):
            self._apply_logged(entry)
            count += 1
        if self.applied_id is not None and not self.wal.reaches(self.name, self.applied_id):
            # The log ends before the model's snapshot: moved to a new directory, or emptied.
            # New entries must follow the snapshot's, or a restore would skip them as learned.
            log.warning("the log of %r ends before its snapshot's entry %s (a new or emptied "
                        "log); its entries continue after that one", self.name, self.applied_id)
            self.wal.continue_after(self.name, self.applied_id)
        self._log_end = self.wal.last_id(self.name)
        self._log_in_doubt = False
        self.log_confirmed_at = time.monotonic()
        return count

    def _rebuild(self) -> int:
        """(model lock) Start again from the model's snapshot and replay its log as they are
        now; the log entries replayed.

        For a log that lost entries the model had learned: a Redis failover promoted a
        replica that had not received them. The model was ahead of anything a restart could
        replay, and a retried request whose entry was lost would be learned a second time;
        rebuilt, it holds what the log holds. What it learned from the lost entries is gone,
        as after a restart (docs/durability.md says which requests can have been acknowledged).
        """
        assert self.wal is not None
        self.wal.reconnect()  # to the primary the Sentinels name now, as the store does
        stored = None if self._load_snapshot is None else self._load_snapshot()
        if stored is None:
            raise Unavailable(
                f"the log of {self.name!r} lost entries the model had learned, and there is no "
                "snapshot of it to rebuild it from: delete it and create (or import) it again"
            )
        log.warning("rebuilding %r from its snapshot (version %d) and its log: the log lost "
                    "entries the model had learned", self.name, stored.info.version)
        self.model, self.snapshot = stored.model, stored.info
        self.applied_id = stored.info.metadata.get(WAL_ID)
        self.waiting_rows.clear()
        self.waiting_rows.put_rows(stored.waiting)
        self._answers = AnswerCache(self._answers.max_rows)
        self._log_end = ANY_END
        # In doubt until the replay below is done (it waits until the log is durable first):
        # if it fails, the next request catches up before anything else is learned.
        self._log_in_doubt = True
        self._metrics.wal_rebuilds.inc()
        return self._catch_up()

    def _apply_logged(self, entry: LogEntry) -> None:
        """(model lock) Learn one log entry, and remember its keyed requests' answers.

        A wait entry puts its rows to wait for labels instead; a learn entry's waiting rows
        stop waiting, as they did when it was logged.
        """
        if entry.waiting:
            assert entry.predictions is not None
            self._wait(entry.label_ids, entry.features, entry.predictions, entry.expires_at,
                       entry.expired_ids, entry.id)
            self._metrics.wal_replayed_entries.inc()
            return
        start, probs, losses, _ = self._apply(entry.features, entry.labels, entry.id)
        self.waiting_rows.remove_ids(entry.label_ids)
        self._metrics.wal_replayed_entries.inc()
        self._metrics.wal_replayed_examples.inc(len(entry.labels))
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

    def replay_log(self) -> int:
        """(thread) Bring a restored model up to its log: apply the entries after its snapshot,
        once they are as durable as an acknowledged entry (WalDurabilityError until then)."""
        if self.wal is None:
            return 0
        with self.lock:
            return self._catch_up()
