"""The file log's older layout, written as it was before one log held every model: one file
per model, ``{directory}/{name}/wal.log``, of records ``[u32 length][u32 CRC-32][payload]``
(little-endian). A payload is a JSON header (``u32`` length first) plus raw array bytes: an
entry's header is the entry encoding of ``service.storage.wal.entries`` plus ``"kind":
"entry"`` and its ``"id"``; after a trim the file starts with a ``"base"`` record (newest id,
trim point, the keys within their TTL as ``[id, time, digest]``) and keeps the later records.

Frozen here so that migration tests read files as that code wrote them (checked byte for byte
against it when the layout changed), whatever the log's own code becomes.
"""

from __future__ import annotations

import json
import struct
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from service.storage.wal import DEFAULT_IDEMPOTENCY_TTL_S
from service.storage.wal.entries import encode_append
from service.storage.wal.interface import LogAppend


def frame(header: dict[str, Any], *parts: bytes) -> bytes:
    """One record: [u32 length][u32 crc32][u32 header length][header JSON][parts...]."""
    head = json.dumps(header, separators=(",", ":")).encode()
    payload = b"".join([struct.pack("<I", len(head)), head, *parts])
    return struct.pack("<II", len(payload), zlib.crc32(payload)) + payload


@dataclass
class _File:
    last_id: int = 0
    records: list[tuple[int, bytes]] = field(default_factory=list)
    keys: dict[str, tuple[int, float, str | None]] = field(default_factory=dict)


class LegacyFileLog:
    """Appends and trims as the older ``FileWriteAheadLog`` made them (no reads)."""

    def __init__(self, directory: Path, ttl_s: float = DEFAULT_IDEMPOTENCY_TTL_S) -> None:
        self.path, self.ttl_s = Path(directory), ttl_s
        self._files: dict[str, _File] = {}

    def file(self, name: str) -> Path:
        return self.path / name / "wal.log"

    def append(self, name: str, features: np.ndarray, labels: np.ndarray,
               idempotency_keys: Sequence[str | None] | None = None,
               request_rows: Sequence[int] | None = None,
               request_digests: Sequence[str | None] | None = None,
               label_ids: Sequence[str] = (), *, start: int | None = None) -> str:
        return self._write(LogAppend(name, features, labels, idempotency_keys, request_rows,
                                     request_digests, label_ids, start=start))

    def append_waiting(self, name: str, ids: Sequence[str], features: np.ndarray,
                       predictions: np.ndarray, expires_at: float,
                       expired_ids: Sequence[str] = ()) -> str:
        return self._write(LogAppend(name, features, label_ids=ids, predictions=predictions,
                                     expires_at=expires_at, expired_ids=expired_ids))

    def _write(self, item: LogAppend) -> str:
        e = encode_append(item)
        state = self._files.setdefault(e.name, _File())
        entry_id = state.last_id + 1
        record = frame({"kind": "entry", "id": entry_id, **e.header}, e.x, e.y)
        self.file(e.name).parent.mkdir(parents=True, exist_ok=True)
        with open(self.file(e.name), "ab") as fh:
            fh.write(record)
        state.records.append((entry_id, record))
        state.last_id = entry_id
        for key, digest in zip(e.keys, e.digests, strict=True):
            found = state.keys.get(key) if key is not None else None
            if key is not None and (found is None or e.now - found[1] >= self.ttl_s):
                state.keys[key] = (entry_id, e.now, digest)
        return str(entry_id)

    def trim_through(self, name: str, entry_id: str) -> None:
        """Rewrite the file: a base record, then the records after ``entry_id``."""
        state, now = self._files[name], time.time()
        cut = min(int(entry_id), state.last_id)
        state.records = [(i, r) for i, r in state.records if i > cut]
        state.keys = {k: v for k, v in state.keys.items() if now - v[1] < self.ttl_s}
        base = frame({"kind": "base", "v": 1, "last_id": state.last_id, "trimmed_through": cut,
                      "keys": state.keys})
        self.file(name).write_bytes(base + b"".join(r for _, r in state.records))
