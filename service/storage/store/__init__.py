"""Snapshot stores: where the service keeps each model's serialised bytes between restarts.

A snapshot is an opaque blob (the service makes it with ``GLN.to_bytes``; a store never looks
inside and never unpickles anything). Every store gives each save of a model the next version
number, records the blob's length and SHA-256, writes the blob completely *before* switching
the model's pointer ("head") to it in one atomic step, and only then removes older versions.
A reader therefore sees either the old complete snapshot or the new complete one, never a mix,
and a crash mid-save leaves the previous snapshot in place.

Two implementations share the :class:`SnapshotStore` interface (``interface.py``):

* :class:`RedisSnapshotStore` (``redis_store.py``) splits the blob into chunks (Redis refuses
  values over 512 MB; we keep chunks around 16 MiB) and switches a small head hash inside
  MULTI/EXEC.
* :class:`DirectorySnapshotStore` (``directory_store.py``) writes one file per version and
  switches a ``HEAD`` file with temp file + fsync + ``os.replace``.

Both load a snapshot the same way (``loading.py``): the head, then the bytes it points to,
checked against the head's length and SHA-256, starting over when a concurrent save switched
the head meanwhile.

:func:`open_store` picks one from the service settings.

Each save may carry ``metadata`` (string keys and values), returned with the snapshot's
:class:`SnapshotInfo`. The service uses it to record, for instance, the id of the last
write-ahead-log entry the snapshot includes, so a restart knows where to resume replaying.

>>> import tempfile
>>> with tempfile.TemporaryDirectory() as tmp:
...     store = open_store(None, tmp)
...     info = store.save("spam", b"weights", metadata={"log_id": "7-0"})
...     blob, loaded = store.load("spam")
...     (info.version, blob, loaded.metadata, store.names())
(1, b'weights', {'log_id': '7-0'}, ['spam'])
"""

from __future__ import annotations

from service.storage.store.directory_store import DirectorySnapshotStore
from service.storage.store.interface import SnapshotCorruptError, SnapshotInfo, SnapshotStore
from service.storage.store.redis_store import DEFAULT_CHUNK_BYTES, RedisSnapshotStore

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DirectorySnapshotStore",
    "RedisSnapshotStore",
    "SnapshotCorruptError",
    "SnapshotInfo",
    "SnapshotStore",
    "open_store",
]


def open_store(
    redis_url: str | None, snapshot_dir: str, *, key_prefix: str = "gln", keep: int = 3
) -> SnapshotStore:
    """The Redis store when ``redis_url`` is set (non-empty), else the directory store; each
    keeps the newest ``keep`` versions of a model."""
    if redis_url:
        return RedisSnapshotStore(redis_url, key_prefix=key_prefix, keep=keep)
    return DirectorySnapshotStore(snapshot_dir, keep=keep)
