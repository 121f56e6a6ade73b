"""A model's snapshots: the latest one's info, and the writes of new ones, ordered so that
none lands after the model's delete. A snapshot records the log entry its weights include
(and the rows waiting for labels at that point); once stored, the log is trimmed through it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Protocol

from gln import SnapshotBuffer
from service.engine.snapshot_blob import WAL_ID, snapshot_blob
from service.engine.waiting_rows import WaitingRow
from service.errors import ModelNotFound
from service.metrics import ServiceMetrics
from service.storage.store import SnapshotInfo, SnapshotStore
from service.storage.wal import WriteAheadLog

log = logging.getLogger(__name__)


class SnapshotSource(Protocol):
    """What a snapshot is taken of (``ServedModel``)."""

    updates: int  # learn runs and waiting-row puts so far

    def capture(self) -> tuple[SnapshotBuffer, int, str | None, Sequence[WaitingRow]]:
        """(thread) The model's arrays copied between learn runs, with the updates, the log
        entry and the waiting rows they hold."""


class ModelSnapshots:
    """One model's snapshots in a store: ``latest`` is the newest one's info."""

    def __init__(self, name: str, wal: WriteAheadLog | None, metrics: ServiceMetrics,
                 latest: SnapshotInfo | None = None) -> None:
        self.name = name
        self.latest = latest
        self._wal = wal
        self._metrics = metrics
        self._writes = threading.Lock()  # orders the store's writes: none after the delete
        self._deleted = False
        self._saved_updates = 0  # the source's updates that the latest snapshot holds

    def changed(self, updates: int) -> bool:
        """Whether a source at ``updates`` holds learning the latest snapshot lacks (or there
        is no snapshot yet: a model born in the log)."""
        return updates != self._saved_updates or self.latest is None

    def updates_since(self, updates: int) -> int:
        """How many of a source's ``updates`` the latest snapshot lacks."""
        return updates - self._saved_updates

    def save(self, source: SnapshotSource, store: SnapshotStore,
             force: bool) -> SnapshotInfo | None:
        """(thread) Write a snapshot (always when ``force``, else only if changed); None if
        skipped. The arrays are copied under the model's lock; checksummed and stored outside
        it, while learning continues. A failed trim of the log only leaves a longer log, which
        replays to the same model."""
        with self._writes:
            if self._deleted:
                raise ModelNotFound(self.name)
            if not force and not self.changed(source.updates):
                return None  # before the copy: most intervals of an idle model end here
            t0 = time.perf_counter()
            buffer, updates, applied_id, waiting = source.capture()
            if not force and not self.changed(updates):
                return None
            blob, metadata = snapshot_blob(buffer.seal(), applied_id, waiting)
            info = store.save(self.name, blob, metadata=metadata or None)
            self._saved_updates = updates
            self.latest = info
            self._metrics.observe_snapshot(
                self.name, time.perf_counter() - t0, info.nbytes, info.created_at
            )
            if self._wal is not None and applied_id is not None:
                try:
                    # Only past the oldest version kept: a restore may fall back to it, and
                    # replays the log from its entry.
                    oldest = next(iter(store.kept(self.name)), info)
                    through = oldest.metadata.get(WAL_ID)
                    if through is not None:
                        self._wal.trim_through(self.name, through)
                except Exception as exc:
                    log.warning("trimming the log of %r failed (kept longer): %s", self.name, exc)
            return info

    def delete(self, store: SnapshotStore) -> None:
        """(thread) Remove the model's snapshots, then its log; no snapshot of it is written
        afterwards."""
        with self._writes:
            self._deleted = True
            try:
                store.delete(self.name)
            except BaseException:
                self._deleted = False
                raise
            if self._wal is not None:
                # After the snapshots: a crash in between, or a failure here, leaves a log
                # without a model, which restore ignores and the next create of the name clears.
                try:
                    self._wal.delete(self.name)
                except Exception as exc:
                    log.warning("deleting the log of %r failed (left behind): %s", self.name, exc)
