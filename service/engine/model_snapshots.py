"""A model's snapshots, seen from its entry: the model's bytes between learn runs, a
snapshot that records the log entry its weights include (and the rows waiting for labels),
and the delete after which no snapshot of it is written."""

from __future__ import annotations

import logging
import time

from gln import SnapshotBuffer
from service.engine.snapshot_blob import snapshot_blob
from service.errors import ModelNotFound
from service.storage.store import SnapshotInfo, SnapshotStore

log = logging.getLogger(__name__)


class SnapshotsMixin:
    """The snapshot part of ``service.engine.served_model.ServedModel``: it takes the entry's locks
    (``lock`` for the model's arrays, ``snapshot_lock`` for the store's writes of it) and keeps
    ``snapshot``, the latest snapshot's info, and the count of updates it holds."""

    async def model_bytes(self) -> memoryview:
        """``GLN.to_bytes()`` between learn runs: every learn request answered so far is in it."""
        return await self._run(self._model_bytes_sync)

    def _model_bytes_sync(self) -> memoryview:
        """(thread) The model's bytes, holding the model lock for a copy of its arrays only."""
        buffer = SnapshotBuffer(self.model)
        with self.lock:
            buffer.capture(self.model)
        return buffer.seal()

    async def save_snapshot(self, store: SnapshotStore, *, force: bool) -> SnapshotInfo | None:
        """Write a snapshot (always when ``force``, else only if changed); None if skipped."""
        return await self._run(self._save_snapshot_sync, store, force)

    def _save_snapshot_sync(self, store: SnapshotStore, force: bool) -> SnapshotInfo | None:
        """(thread) Copy the model's arrays under the model lock; checksum and store the copy
        outside it (learning continues).

        The snapshot records the newest log entry its weights include, and after the
        model's bytes the rows waiting for labels at that point; once it is the current
        snapshot, the log is trimmed through that entry (a failed trim only leaves a longer
        log, which replays to the same model).
        """
        with self.snapshot_lock:
            if self.deleted:
                raise ModelNotFound(self.name)
            if not force and not self.changed_since_snapshot:
                return None  # before the buffer: most intervals of an idle model end here
            t0 = time.perf_counter()
            buffer = SnapshotBuffer(self.model)  # allocated while the model learns on
            with self.lock:
                updates = self._updates
                if not force and updates == self._snapshotted_updates:
                    return None
                applied_id = self.applied_id
                buffer.capture(self.model)
                waiting = self.waiting_rows.rows()
            blob, metadata = snapshot_blob(buffer.seal(), applied_id, waiting)
            info = store.save(self.name, blob, metadata=metadata or None)
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
