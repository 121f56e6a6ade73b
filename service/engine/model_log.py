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
import time
from collections.abc import Callable
from typing import Protocol

from service.errors import Unavailable
from service.log_throttle import Throttled
from service.metrics import ServiceMetrics
from service.storage.wal import (
    ANY_END,
    LogEntry,
    WalDivergedError,
    WalDurabilityError,
    WalGapError,
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


class LoggedModel(Protocol):
    """What a model's log applies its entries to (``ServedModel``)."""

    applied_id: str | None  # the newest entry the weights include

    def apply_entry(self, entry: LogEntry) -> None:
        """Learn a logged entry (or put its rows to wait), as when it was logged."""

    def start_again_from_snapshot(self) -> int | None:
        """Go back to the latest snapshot (weights, waiting rows, ``applied_id``); its version,
        or None if there is none."""


class ModelLog:
    """One model's write-ahead log as its single writer uses it: whether the model is in doubt,
    where the log ended when the writer last saw it, and the durability it last fell short
    of. Every method runs in a worker thread holding the model lock, and is given the model
    its entries apply to (not kept: a deleted model is freed at once, with no cycle)."""

    def __init__(self, name: str, wal: WriteAheadLog, metrics: ServiceMetrics) -> None:
        self.name = name
        self.wal = wal
        self._metrics = metrics
        # An append whose outcome is unknown: the model applies what the log holds after its
        # applied_id before it learns anything else.
        self.in_doubt = False
        # Where the log ended when this writer last appended to it or read it (ANY_END: not
        # known yet); each append must follow it, or the log lost entries (a failover).
        self.end: str | None = ANY_END
        # Why the log last fell short of the configured durability for this model (its
        # WalDurabilityError's words) and when (monotonic), or None; and when the log last
        # confirmed an entry of this model. /readyz reports a shortfall until the log confirms
        # an entry of any model after it (this one's included): durability is the log's.
        self.durability_shortfall: tuple[str, float] | None = None
        self.confirmed_at = 0.0

    def logged(self, model: LoggedModel, append: Callable[[str | None], str]) -> str:
        """(model lock) The id of the entry ``append`` logs after the log's end as this
        writer knows it; 503 (Unavailable) if it fails.

        After a failure the entry may or may not be in the log (the write may have landed and
        only its answer been lost); the model is put in doubt and catches up at once if it
        can, else before it next logs, so it never skips or repeats a logged entry. If the
        log no longer ends where this writer left it, entries the model learned are gone
        from it: the model is rebuilt from its snapshot and the log (:meth:`rebuild`).
        """
        t0 = time.perf_counter()
        try:
            entry_id = append(self.end)
        except Exception as exc:
            raise self.append_failed(model, exc) from exc
        return self.appended(entry_id, time.perf_counter() - t0)

    def appended(self, entry_id: str, seconds: float) -> str:
        """(model lock) Note an entry the log took, ``seconds`` after it was asked to; its
        id. The model's appends follow it from now on."""
        self._metrics.wal_append_duration.observe(seconds)
        self.end = entry_id
        self.confirmed_at = time.monotonic()
        return entry_id

    def append_failed(self, model: LoggedModel, exc: Exception) -> Unavailable:
        """(model lock) Deal with an append that failed with ``exc`` (:meth:`logged`); the 503
        to answer its requests with."""
        self._metrics.wal_append_errors.inc()
        if isinstance(exc, WalDivergedError):
            log.warning("%s", exc)
            try:
                self.rebuild(model)
            except Exception as again:
                log.warning("rebuilding %r from its snapshot and log failed: %s", self.name,
                            again)
            return Unavailable(
                f"{exc}; the model was rebuilt from its snapshot and log, and this request "
                "is not acknowledged: retry it with the same Idempotency-Key"
            )
        self.in_doubt = True
        self._note_shortfall(exc)
        throttled.warning(f"append {self.name}", "log append for %r failed: %s",
                          self.name, exc)
        # An entry the replicas did not confirm in time is not confirmed a moment later
        # either: the next request catches up (and waits for them) instead.
        if not isinstance(exc, WalDurabilityError):
            try:
                self.catch_up(model)
            except Exception as again:
                log.warning("catching %r up with its log failed too: %s", self.name, again)
        return Unavailable(
            f"write-ahead log did not confirm the append ({_log_failure(exc)}); "
            "the request is not acknowledged: retry it with the same Idempotency-Key "
            "(a prediction with ids: with the same ids)"
        )

    def _note_shortfall(self, exc: Exception) -> None:
        if isinstance(exc, WalDurabilityError):
            self.durability_shortfall = (str(exc), time.monotonic())

    def unavailable(self, exc: Exception) -> Unavailable:
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

    def catch_up_if_in_doubt(self, model: LoggedModel) -> None:
        """(model lock) :meth:`catch_up` before new learning if an append left the model in
        doubt; 503 while the log is down."""
        if not self.in_doubt:
            return
        try:
            self.catch_up(model)
        except Exception as exc:
            raise self.unavailable(exc) from exc

    def catch_up(self, model: LoggedModel) -> int:
        """(model lock) Apply every log entry after ``applied_id``; how many there were.

        At restore this is the replay of the log tail; after a failed append it picks up an
        entry that reached the log although its append raised. Entries are applied only once
        they are as durable as an acknowledged one (the log's ``wait_durable``: a replica
        has them), else WalDurabilityError and the model stays in doubt: learned but not
        replicated, an entry could be lost in a failover while the model and its snapshots
        kept it. A log that no longer reaches where this writer left it has lost entries
        the model learned: the model is rebuilt.
        """
        known_end = self.end
        if known_end not in (ANY_END, None) and not self.wal.reaches(self.name, known_end):
            log.warning("the log of %r ends at %s, before %s where this writer left it",
                        self.name, self.wal.last_id(self.name), known_end)
            return self.rebuild(model)
        self.wal.wait_durable()
        count = 0
        for entry in self.wal.read_after(self.name, model.applied_id):
            model.apply_entry(entry)
            self._metrics.wal_replayed_entries.inc()
            if not entry.waiting:
                self._metrics.wal_replayed_examples.inc(len(entry.labels))
            count += 1
        applied_id = model.applied_id
        end = self.wal.last_id(self.name)
        behind = applied_id is not None and not self.wal.reaches(self.name, applied_id)
        if end is not None and end != applied_id and not behind:
            raise WalGapError(
                f"the log of {self.name!r} records {end} as its newest entry, but its entries "
                f"end at {applied_id}: entries were removed, and the model is not served "
                "smaller than it was acknowledged (repair the log, or DELETE the model)")
        if behind:
            # The log ends before the model's snapshot: moved to a new directory, or emptied.
            # New entries must follow the snapshot's, or a restore would skip them as learned.
            log.warning("the log of %r ends before its snapshot's entry %s (a new or emptied "
                        "log); its entries continue after that one", self.name, applied_id)
            self.wal.continue_after(self.name, applied_id)
            end = self.wal.last_id(self.name)
        self.end = end
        self.in_doubt = False
        self.confirmed_at = time.monotonic()
        return count

    def rebuild(self, model: LoggedModel) -> int:
        """(model lock) Start again from the model's snapshot and replay its log as they are
        now; the log entries replayed.

        For a log that lost entries the model had learned: a Redis failover promoted a
        replica that had not received them. The model was ahead of anything a restart could
        replay, and a retried request whose entry was lost would be learned a second time;
        rebuilt, it holds what the log holds. What it learned from the lost entries is gone,
        as after a restart (docs/durability.md says which requests can have been acknowledged).
        """
        self.wal.reconnect()  # to the primary the Sentinels name now, as the store does
        version = model.start_again_from_snapshot()
        if version is None:
            raise Unavailable(
                f"the log of {self.name!r} lost entries the model had learned, and there is no "
                "snapshot of it to rebuild it from: delete it and create (or import) it again"
            )
        log.warning("rebuilding %r from its snapshot (version %d) and its log: the log lost "
                    "entries the model had learned", self.name, version)
        self.end = ANY_END
        # In doubt until the replay below is done (it waits until the log is durable first):
        # if it fails, the next request catches up before anything else is learned.
        self.in_doubt = True
        self._metrics.wal_rebuilds.inc()
        return self.catch_up(model)
