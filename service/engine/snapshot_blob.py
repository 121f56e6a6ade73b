"""A model's snapshot as the service stores it: the model's bytes (``GLN.to_bytes``), then the
rows waiting for labels at the same point, and metadata that says where those rows start and
which log entry the weights include last (docs/durability.md).

>>> blob, metadata = snapshot_blob(b"model bytes", applied_id="7-0", waiting=[])
>>> blob, metadata
(b'model bytes', {'wal_id': '7-0'})
>>> split_snapshot(blob, metadata)
(b'model bytes', [])
"""

from __future__ import annotations

from collections.abc import Sequence

from service.engine.waiting_rows import WaitingRow, decode_rows, encode_rows

# Snapshot metadata key: id of the last log entry the snapshot's weights include.
WAL_ID = "wal_id"
# Snapshot metadata key: where the rows waiting for labels start in the blob (absent: none).
WAITING_ROWS_AT = "waiting_rows_at"


def snapshot_blob(
    model_bytes: bytes | memoryview, applied_id: str | None, waiting: Sequence[WaitingRow]
) -> tuple[bytes | memoryview, dict[str, str]]:
    """The blob and metadata to store for a model's bytes, the newest log entry they include
    (None without a log) and the rows waiting for labels; :func:`split_snapshot` reverses it."""
    metadata = {} if applied_id is None else {WAL_ID: applied_id}
    if not waiting:
        return model_bytes, metadata
    metadata[WAITING_ROWS_AT] = str(len(model_bytes))
    return b"".join((model_bytes, encode_rows(waiting))), metadata


def split_snapshot(
    blob: bytes | memoryview, metadata: dict[str, str]
) -> tuple[bytes | memoryview, list[WaitingRow]]:
    """A snapshot blob's model bytes (for ``GLN.from_bytes``) and its rows waiting for labels.

    ValueError if the waiting rows are unreadable (the store has checked the blob's SHA-256,
    so that means a writer bug, not a torn write).
    """
    at = metadata.get(WAITING_ROWS_AT)
    if at is None:
        return blob, []
    view = memoryview(blob)
    return view[:int(at)], decode_rows(view[int(at):])
