"""Warnings that repeat while a dependency is down, said once per interval with a count.

While Redis is down every learn request fails the same way: eight clients learning made
about 800 identical warnings a second, burying the first one (the one that says what broke).
A :class:`Throttled` logger says the first at once, then at most one per ``interval_s`` per
key, with how many it left out in between.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any


class Throttled:
    """``warning(key, msg, *args)``: logged the first time and then once per ``interval_s``
    for each ``key`` (say, the model and what failed), with the count of the ones left out."""

    def __init__(self, log: logging.Logger, interval_s: float = 10.0) -> None:
        self._log = log
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._last: dict[str, tuple[float, int]] = {}  # key -> (time logged, left out since)

    def warning(self, key: str, msg: str, *args: object, **kwargs: Any) -> None:
        """Log ``msg % args`` as a warning (``kwargs`` as ``Logger.warning``'s) unless ``key``
        was logged less than an interval ago (then count it for the next one)."""
        now = time.monotonic()
        with self._lock:
            logged_at, left_out = self._last.get(key, (-float("inf"), 0))
            if now - logged_at < self._interval_s:
                self._last[key] = (logged_at, left_out + 1)
                return
            self._last[key] = (now, 0)
        if left_out:
            msg += f" (and {left_out} more like it in the last {self._interval_s:g} s)"
        self._log.warning(msg, *args, **kwargs)
