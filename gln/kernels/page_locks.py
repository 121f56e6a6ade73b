"""Host memory page-locked where it lies (``cudaHostRegister``), so that the device's own DMA
copies it asynchronously with no staging copy, and unlocked again at the end of the call that
locked it.

The driver locks whole pages and refuses a range sharing a page with one locked already (or
with pinned memory), so the ranges here are whole pages (``pages_of``). A copy from locked
memory must lie in the one range registered where it starts. ``cudaHostUnregister`` waits for
the device's work (an H200 showed it, docs/gpu.md), so it is done where the device is idle: at
the end of a call. A caller's array can also be held locked across many calls (``held``):
calls whose rows lie in it are copied from there with no lock or unlock of their own
(``held_range``).
"""

from __future__ import annotations

import contextlib
import mmap
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import Any


def pages_of(rows: Any) -> tuple[int, int]:
    """The address of the first page that ``rows`` (contiguous) lie in, and the bytes of the
    whole pages they lie in."""
    start = rows.__array_interface__["data"][0]
    first = start // mmap.PAGESIZE * mmap.PAGESIZE
    return first, -(-(start + rows.nbytes - first) // mmap.PAGESIZE) * mmap.PAGESIZE


def page_locked(cp: ModuleType, first: int, size: int) -> bool:
    """Whether the driver locked the ``size`` bytes of whole pages from ``first``
    (``cudaHostRegister``); it refuses pages locked already, or sharing a page with such."""
    try:
        cp.cuda.runtime.hostRegister(first, size, 0)
        return True
    except cp.cuda.runtime.CUDARuntimeError:
        return False


_HELD: dict[int, int] = {}  # pages locked by ``held``, until its block ends: first -> end
_HELD_GUARD = threading.Lock()


@contextlib.contextmanager
def held(cp: ModuleType, rows: Any) -> Iterator[bool]:
    """The whole pages that ``rows`` (a contiguous NumPy array, which the block holds) lie in,
    locked until the block ends, for the calls in it whose rows lie there to copy from; yields
    whether they are (not where the driver refuses: pages locked already, by another block or
    another caller)."""
    first, size = pages_of(rows)
    locked = page_locked(cp, first, size)
    if locked:
        with _HELD_GUARD:
            _HELD[first] = first + size
    try:
        yield locked
    finally:
        if locked:
            with _HELD_GUARD:
                del _HELD[first]
            cp.cuda.runtime.hostUnregister(first)  # the calls in the block have returned


def held_range(rows: Any) -> tuple[int, int] | None:
    """The range of pages locked by ``held`` that ``rows`` (contiguous) lie in, as (first
    address, end), or None."""
    start = rows.__array_interface__["data"][0]
    with _HELD_GUARD:
        for first, end in _HELD.items():
            if first <= start and start + rows.nbytes <= end:
                return first, end
    return None
