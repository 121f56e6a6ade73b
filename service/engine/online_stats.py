"""Prequential log loss and accuracy of one model, over a recent window and in total."""

from __future__ import annotations

import time
from typing import Any

import numpy as np


class OnlineStats:
    """Prequential log loss and accuracy, over a recent window and since counting began.

    The window is a ring buffer of the last ``window`` examples, so its means are exact (not
    exponentially decayed) and cheap to update a chunk at a time. Updated only from the event
    loop, so it needs no lock.
    """

    def __init__(self, window: int) -> None:
        self.window = window
        self._loss = np.zeros(window, dtype=np.float64)
        self._correct = np.zeros(window, dtype=np.bool_)
        self._next = 0  # ring position of the next example
        self._filled = 0
        self.examples = 0
        self.log_loss_sum = 0.0
        self.correct_sum = 0
        self.since = time.time()

    def add(self, losses: np.ndarray, correct: np.ndarray) -> tuple[float, int]:
        """Count a chunk of examples, in stream order; their summed loss and correct count."""
        n = len(losses)
        loss_sum, hits = float(losses.sum()), int(correct.sum())
        self.examples += n
        self.log_loss_sum += loss_sum
        self.correct_sum += hits
        if n >= self.window:  # only the newest `window` examples survive
            losses, correct, n = losses[-self.window:], correct[-self.window:], self.window
        start = self._next
        if start + n <= self.window:  # no wrap: slices, cheaper than an index array
            self._loss[start:start + n] = losses
            self._correct[start:start + n] = correct
        else:
            idx = (start + np.arange(n)) % self.window
            self._loss[idx] = losses
            self._correct[idx] = correct
        self._next = (start + n) % self.window
        self._filled = min(self.window, self._filled + n)
        return loss_sum, hits

    def summary(self) -> dict[str, Any]:
        """Means over the window and in total (None before the first example)."""
        k = self._filled
        recent_loss = float(self._loss[:k].sum() / k) if k else None
        recent_acc = float(self._correct[:k].sum() / k) if k else None
        n = self.examples
        return {
            "window_size": self.window,
            "recent": {"examples": k, "log_loss": recent_loss, "accuracy": recent_acc},
            "total": {
                "examples": n,
                "log_loss": self.log_loss_sum / n if n else None,
                "accuracy": self.correct_sum / n if n else None,
                "since": self.since,
            },
        }
