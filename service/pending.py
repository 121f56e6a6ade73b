"""Predictions waiting for their labels (delayed labels).

In many online problems the label of an example arrives long after the prediction was needed:
a transaction is predicted now and found fraudulent days later. A predict request may name its
rows with ids; the service then keeps each row's features and the prediction it made, and a
later ``POST /v1/models/{name}/labels`` learns those rows from their ids. The online metrics
score the prediction made at predict time, which is what the user acted on.

Rows wait at most ``ttl_s`` seconds and at most ``max_rows`` of them per model (the oldest
make room first). Rows that leave without a label are *expired*: counted, then dropped, or
learned with a default label if the server has one. They live in memory only: a restart
forgets them, and their labels then get "unknown id".

Only the event loop touches a :class:`PendingPredictions`, so it needs no lock.

>>> import numpy as np
>>> pending = PendingPredictions(ttl_s=60.0, max_rows=2)
>>> pending.put(["a", "b"], np.zeros((2, 3), np.float32), np.full((2, 2), 0.5), now=0.0)
[]
>>> [row.id for row in pending.put(["c"], np.ones((1, 3), np.float32), np.full((1, 2), 0.5),
...                                now=1.0)]
['a']
>>> found, missing = pending.claim(["b", "zz"], now=2.0)
>>> [row.id for row in found], missing
(['b'], ['zz'])
>>> [row.id for row in pending.pop_expired(now=61.5)]
['c']
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PendingRow:
    """One predicted row waiting for its label."""

    id: str
    features: np.ndarray  # (num_features,)
    prediction: np.ndarray  # (num_classes,) probabilities given at predict time
    expires_at: float


class PendingPredictions:
    """A model's rows waiting for labels, oldest first, bounded in time and count."""

    def __init__(self, ttl_s: float, max_rows: int) -> None:
        self.ttl_s = ttl_s
        self.max_rows = max_rows
        self._rows: OrderedDict[str, PendingRow] = OrderedDict()

    def __len__(self) -> int:
        return len(self._rows)

    def put(
        self, ids: Sequence[str], features: np.ndarray, predictions: np.ndarray, now: float
    ) -> list[PendingRow]:
        """Keep rows under their ids (an id already waiting is replaced by the new row).

        Returns the oldest rows pushed out to stay within ``max_rows``: they expire early.
        """
        expires_at = now + self.ttl_s
        for i, row_id in enumerate(ids):
            self._rows.pop(row_id, None)
            self._rows[row_id] = PendingRow(row_id, features[i], predictions[i], expires_at)
        pushed_out = []
        while len(self._rows) > self.max_rows:
            pushed_out.append(self._rows.popitem(last=False)[1])
        return pushed_out

    def claim(self, ids: Sequence[str], now: float) -> tuple[list[PendingRow], list[str]]:
        """Take the rows of ``ids`` still waiting; also the ids that are not (unknown/expired).

        Claimed rows leave the store; :meth:`give_back` returns them if learning fails.
        """
        found, missing = [], []
        for row_id in ids:
            row = self._rows.get(row_id)
            if row is None or row.expires_at <= now:
                missing.append(row_id)
            else:
                found.append(self._rows.pop(row_id))
        return found, missing

    def give_back(self, rows: Sequence[PendingRow]) -> None:
        """Put claimed rows back (their learning failed), unless newer rows took their ids."""
        for row in rows:
            self._rows.setdefault(row.id, row)

    def pop_expired(self, now: float) -> list[PendingRow]:
        """Remove and return the rows whose time is up, oldest first.

        Rows are kept in order of arrival, and all wait the same ``ttl_s``, so this stops at
        the first row still waiting (a row given back after a failed learn may expire a
        little late; :meth:`claim` refuses it on time all the same).
        """
        expired = []
        while self._rows:
            row = next(iter(self._rows.values()))
            if row.expires_at > now:
                break
            expired.append(self._rows.popitem(last=False)[1])
        return expired
