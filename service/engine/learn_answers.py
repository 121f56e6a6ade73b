"""What learn requests are answered: each row's prequential probabilities and log loss, and
for a retried request (same idempotency key) the original answer, which the newest keys keep in
memory (docs/durability.md).

>>> import numpy as np
>>> losses, hits = scored_rows(np.array([[0.9, 0.1], [0.2, 0.8]]), np.array([0, 0]))
>>> losses.round(3).tolist(), hits.tolist()
([0.105, 1.609], [True, False])
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

# A prediction of exactly 0 for the true class would give infinite log loss; GLN clips its
# outputs already (pred_clip), this only keeps the metrics finite whatever the config.
MIN_PROB = 1e-15


def scored_rows(probs: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Log loss (nats) and argmax hit of each row's prediction ``probs`` for label ``y``."""
    p_true = probs[np.arange(len(y)), y]
    return -np.log(np.clip(p_true, MIN_PROB, 1.0)), probs.argmax(axis=1) == y


@dataclass
class LearnResult:
    """What one learn request gets back: its rows' prequential probabilities and losses.

    A retried request (same idempotency key) is not learned again: it gets ``duplicate`` and
    the original answer when this process still holds it (else None for the three fields).
    """

    sequence: int | None  # stream index of the request's first example
    probabilities: np.ndarray | None  # (n, num_classes), each row before its own update
    losses: np.ndarray | None  # (n,) log loss of each row, nats
    rows: int
    duplicate: bool = False
    log_id: str | None = None  # the write-ahead log entry holding the rows
    # Delayed labels: ids whose rows had stopped waiting (learned by another request, expired
    # or replaced) by the time the writer came to learn them; not learned here.
    stale_ids: tuple[str, ...] = ()

    @property
    def mean_loss(self) -> float | None:
        """Mean log loss of the request's rows (nats); equal to ``losses.mean()``."""
        # sum / n rather than ndarray.mean(): a third of the cost on the one-row arrays that
        # single-example requests get, and the same float.
        if self.losses is None:
            return None
        return float(self.losses.sum()) / len(self.losses)


class AnswerCache:
    """The original answers of the newest keyed learn requests, at most ``max_rows`` rows.

    Lets a retry get exactly what the original request got, and (without a log) tells a retry
    from a reused key by the request's digest. Touched only under the model lock (worker
    thread, replay).
    """

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self._answers: OrderedDict[str, tuple[LearnResult, str | None]] = OrderedDict()
        self._rows = 0

    def put(self, key: str, result: LearnResult, digest: str | None) -> None:
        """Keep ``result`` as the answer to ``key``, dropping the oldest answers beyond
        ``max_rows`` rows (an answer longer than that on its own is not kept)."""
        if result.rows > self.max_rows:
            return
        old = self._answers.pop(key, None)
        if old is not None:
            self._rows -= old[0].rows
        self._answers[key] = (result, digest)
        self._rows += result.rows
        while self._rows > self.max_rows:
            _, (dropped, _) = self._answers.popitem(last=False)
            self._rows -= dropped.rows

    def get(self, key: str) -> tuple[LearnResult, str | None] | None:
        """The original answer and its request's digest (None if not known)."""
        return self._answers.get(key)
