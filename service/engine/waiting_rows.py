"""Predictions waiting for their labels (delayed labels).

In many online problems the label of an example arrives long after the prediction was needed:
a transaction is predicted now and found fraudulent days later. A predict request may name its
rows with ids; the service then keeps each row's features and the prediction it made, and a
later ``POST /v1/models/{name}/labels`` learns those rows from their ids. The online metrics
score the prediction made at predict time, which is what the user acted on.

Rows wait at most ``ttl_s`` seconds and at most ``max_rows`` of them per model (beyond that
the oldest are *due* at once). Due rows are *expired*: counted, then dropped, or learned with
a default label if the server has one. Waiting rows survive restarts: the model's writer logs
every row it puts here (a ``wait`` entry of the write-ahead log, which also names the rows
that expire as it comes, :meth:`WaitingRows.expiring_with`), every row it learns from
here (the learn entry names their ids) and every row it drops, and each snapshot carries the
rows waiting at its point (:func:`encode_rows`), so a restore rebuilds exactly this store.

Rows are put, learned and dropped only by the model's writer, under the model lock, in the
order of its log; request handlers look rows up (and find the due ones) from the event loop.
A lock of the store's own keeps those apart.

>>> import numpy as np
>>> waiting = WaitingRows(ttl_s=60.0, max_rows=2)
>>> waiting.put(["a", "b"], np.zeros((2, 3), np.float32), np.full((2, 2), 0.5), 60.0)
>>> waiting.put(["c"], np.ones((1, 3), np.float32), np.full((1, 2), 0.5), 61.0)
>>> [row.id for row in waiting.due(now=2.0)]  # one row too many: the oldest is due
['a']
>>> found, missing = waiting.waiting(["b", "zz"], now=2.0)
>>> [row.id for row in found], missing
(['b'], ['zz'])
>>> waiting.remove_rows(found)
1
>>> [row.id for row in waiting.due(now=61.5)]
['a', 'c']
"""

from __future__ import annotations

import struct
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import orjson

__all__ = ["WaitingRows", "WaitingRow", "decode_rows", "encode_rows"]


@dataclass(frozen=True, eq=False, slots=True)
class WaitingRow:
    """One predicted row waiting for its label (compared by identity: one put, one row).

    Its arrays are its own, not views of the request's: a row that waits long must not keep
    its whole request's rows in memory after the others were learned.
    """

    id: str
    features: np.ndarray  # (num_features,)
    prediction: np.ndarray  # (num_classes,) probabilities given at predict time
    expires_at: float  # wall-clock time (time.time()) when its wait ends


# Bytes of Python objects around one waiting row's arrays (the row, its two arrays, its id of
# up to 200 characters, its place in the store); measured, rounded up.
_ROW_OVERHEAD_NBYTES = 600


class WaitingRows:
    """A model's rows waiting for labels, oldest first, bounded in time and count."""

    def __init__(self, ttl_s: float, max_rows: int) -> None:
        self.ttl_s = ttl_s
        self.max_rows = max_rows
        self._rows: OrderedDict[str, WaitingRow] = OrderedDict()
        # True while the rows' deadlines grow in arrival order (one TTL throughout): then the
        # ended waits are a prefix and finding them stops at the first row still waiting.
        self._in_deadline_order = True
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._rows)

    def capacity_nbytes(self, num_features: int, num_classes: int) -> int:
        """Memory ``max_rows`` rows of a model of these sizes may hold (an upper bound), so
        that a host can count it before the rows come."""
        return self.max_rows * (4 * num_features + 8 * num_classes + _ROW_OVERHEAD_NBYTES)

    def put(
        self, ids: Sequence[str], features: np.ndarray, predictions: np.ndarray,
        expires_at: float,
    ) -> None:
        """Keep rows under their ids; an id already waiting is replaced by the new row.

        More than ``max_rows`` rows may wait for a moment: the oldest are then :meth:`due`.
        """
        self.put_rows(_own_row(row_id, features[i], predictions[i], expires_at)
                      for i, row_id in enumerate(ids))

    def put_rows(self, rows: Iterable[WaitingRow]) -> None:
        """Keep rows as they are (a restore), after those already waiting; a row replaces
        the one waiting under its id."""
        with self._lock:
            for row in rows:
                self._rows.pop(row.id, None)
                if self._rows and row.expires_at < next(reversed(self._rows.values())).expires_at:
                    self._in_deadline_order = False  # e.g. a restart under a shorter TTL
                self._rows[row.id] = row

    def waiting(self, ids: Sequence[str], now: float) -> tuple[list[WaitingRow], list[str]]:
        """The rows of ``ids`` still waiting at ``now``, and the ids that are not.

        Nothing leaves the store: the writer learns the rows and then :meth:`remove_rows`
        them, so a row is only gone once its learning is logged.
        """
        found, missing = [], []
        with self._lock:
            for row_id in ids:
                row = self._rows.get(row_id)
                if row is None or row.expires_at <= now:
                    missing.append(row_id)
                else:
                    found.append(row)
        return found, missing

    def is_waiting(self, row: WaitingRow) -> bool:
        """True while ``row`` itself (not a newer row under its id) waits."""
        return self._rows.get(row.id) is row

    def remove_rows(self, rows: Iterable[WaitingRow]) -> int:
        """Remove these very rows (a newer row under the same id stays); how many left."""
        removed = 0
        with self._lock:
            for row in rows:
                if self.is_waiting(row):
                    del self._rows[row.id]
                    removed += 1
        return removed

    def clear(self) -> None:
        """Drop every waiting row (before the rows of a snapshot are put back)."""
        with self._lock:
            self._rows.clear()
            self._in_deadline_order = True

    def remove_ids(self, ids: Iterable[str]) -> None:
        """Remove whatever waits under ``ids`` (replaying a logged learn of them)."""
        with self._lock:
            for row_id in ids:
                self._rows.pop(row_id, None)
            self._in_deadline_order |= not self._rows

    def due(self, now: float) -> list[WaitingRow]:
        """The rows to expire now, oldest first: the oldest beyond ``max_rows`` and every row
        whose wait ended. They stay until removed.
        """
        with self._lock:
            return self._due_among(self._rows.values(), len(self._rows) - self.max_rows, now)

    def _due_among(self, rows: Iterable[WaitingRow], excess: int, now: float) -> list[WaitingRow]:
        """(lock held) Those of ``rows`` (oldest first) among the first ``excess`` or whose
        wait ended at ``now``; stops at the first other while deadlines are in arrival order."""
        due = []
        for i, row in enumerate(rows):
            if i < excess or row.expires_at <= now:
                due.append(row)
            elif self._in_deadline_order:
                break
        return due

    def expiring_with(self, ids: Sequence[str], now: float) -> list[str]:
        """The ids to expire at ``now`` once rows under ``ids`` are put: those whose wait
        ended, then the oldest beyond ``max_rows``, counting the new rows (which come last,
        in put order, and replace any row under their ids).

        The writer logs them with the put, so that a replay expires them too.
        """
        order = list(dict.fromkeys(reversed(ids)))[::-1]  # an id put twice: where it ends up
        new = set(order)
        with self._lock:
            staying = len(self._rows) - sum(row_id in self._rows for row_id in new)
            excess = staying + len(new) - self.max_rows
            # A replaced row is not expired: its id moves to the end with the new row.
            old = self._due_among(
                (row for row in self._rows.values() if row.id not in new), excess, now)
        return [row.id for row in old] + order[:max(0, excess - staying)]

    def rows(self) -> list[WaitingRow]:
        """Every waiting row, oldest first (for a snapshot)."""
        with self._lock:
            return list(self._rows.values())


# -- the rows in a snapshot -------------------------------------------------------------------

_MAGIC = b"GLNWAIT1"
_HEADER_LENGTH = struct.Struct("<I")


def encode_rows(rows: Sequence[WaitingRow]) -> bytes:
    """Waiting rows as bytes: a JSON header (ids, dtypes, shapes), then the raw arrays."""
    features = np.stack([row.features for row in rows]).astype("<f4", copy=False)
    predictions = np.stack([row.prediction for row in rows]).astype("<f8", copy=False)
    expires_at = np.array([row.expires_at for row in rows], dtype="<f8")
    header = orjson.dumps({
        "ids": [row.id for row in rows],
        "features": list(features.shape),
        "predictions": list(predictions.shape),
    })
    return b"".join((
        _MAGIC, _HEADER_LENGTH.pack(len(header)), header,
        features.tobytes(), predictions.tobytes(), expires_at.tobytes(),
    ))


def decode_rows(blob: bytes | memoryview) -> list[WaitingRow]:
    """The rows :func:`encode_rows` wrote; ValueError if the bytes do not fit together."""
    view = memoryview(blob)
    if bytes(view[:len(_MAGIC)]) != _MAGIC:
        raise ValueError("waiting rows: not a block of waiting rows")
    start = len(_MAGIC) + _HEADER_LENGTH.size
    (length,) = _HEADER_LENGTH.unpack_from(view, len(_MAGIC))
    header = orjson.loads(view[start:start + length])
    ids = [str(i) for i in header["ids"]]
    f_shape, p_shape = tuple(header["features"]), tuple(header["predictions"])
    n = len(ids)
    if f_shape[0] != n or p_shape[0] != n:
        raise ValueError(f"waiting rows: {n} ids, shapes {f_shape} and {p_shape}")
    offset = start + length
    arrays = []
    for dtype, shape in (("<f4", f_shape), ("<f8", p_shape), ("<f8", (n,))):
        size = np.dtype(dtype).itemsize * int(np.prod(shape))
        if offset + size > len(view):
            raise ValueError("waiting rows: truncated")
        arrays.append(np.frombuffer(view[offset:offset + size], dtype=dtype).reshape(shape))
        offset += size
    if offset != len(view):
        raise ValueError("waiting rows: bytes left over")
    features, predictions, expires_at = arrays
    return [_own_row(ids[i], features[i], predictions[i], float(expires_at[i]))
            for i in range(n)]


def _own_row(row_id: str, features: np.ndarray, prediction: np.ndarray,
             expires_at: float) -> WaitingRow:
    """A row holding copies of its arrays, in the native byte order."""
    return WaitingRow(row_id, np.array(features, dtype=np.float32),
                      np.array(prediction, dtype=np.float64), expires_at)
