"""Full garbage collections that stay short however many models the engine holds.

CPython's cyclic collector walks every container object on a full (generation 2) pass. Ten
thousand small models hold about 400,000 of them, and under load such a pass came every few
seconds and took 165-400 ms: a pause that every request in flight waited out. While
``FrozenSurvivors`` is installed, what survives a full pass is moved out of the collector's
reach (``gc.freeze``), so the next pass walks only what is newer (a few thousand objects: at
most 24 ms at 10,000 models). Frozen objects are still freed when their last reference goes
(a deleted model's are: it leaves no reference cycle); only cycles among them wait, until
the hourly pass that walks everything once (``refresh_s``).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from typing import Any

REFRESH_S = 3600.0  # a full pass over everything, for cycles that were frozen, this often


class FrozenSurvivors:
    """Freezes what survives each full collection while installed (once per process, however
    many engines install it); thaws everything for one full pass every ``refresh_s`` (by
    ``clock``) since the last such pass."""

    def __init__(self, refresh_s: float = REFRESH_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.refresh_s = refresh_s
        self._clock = clock
        self._installs = 0
        self._lock = threading.Lock()
        self._walked_all_at = clock()  # the last full pass that walked everything
        self._thawed = False

    def install(self) -> None:
        """Start freezing (what exists now at once: a restore's models, before any pass)."""
        with self._lock:
            self._installs += 1
            if self._installs == 1:
                gc.callbacks.append(self._after_collection)
                self._walked_all_at = self._clock()
                gc.freeze()

    def uninstall(self) -> None:
        """Stop once every install is undone, and give the collector everything back."""
        with self._lock:
            self._installs -= 1
            if self._installs == 0:
                gc.callbacks.remove(self._after_collection)
                gc.unfreeze()

    def freeze_now(self) -> None:
        """Freeze what exists now (after a restore made many models at once)."""
        with self._lock:
            if self._installs:
                gc.freeze()

    def _after_collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase != "stop" or info["generation"] != 2:
            return
        if self._thawed:  # this pass walked everything
            self._walked_all_at = self._clock()
            self._thawed = False
        elif self._clock() - self._walked_all_at >= self.refresh_s:
            gc.unfreeze()  # the next full pass walks everything once
            self._thawed = True
            return
        gc.freeze()


frozen_survivors = FrozenSurvivors()
