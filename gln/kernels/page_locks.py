"""Host memory page-locked where it lies (``cudaHostRegister``), so that the device's own DMA
copies it asynchronously with no staging copy, and unlocked again, now or after the call that
locked it has returned.

The driver locks whole pages and refuses a range sharing a page with one locked already (or
with pinned memory), so the ranges here are whole pages (``pages_of``), and a refusal while
earlier ranges are still being unlocked waits for those and asks again. A copy from locked
memory must lie in the one range registered where it starts. ``cudaHostUnregister`` waits for
the device's work (an H200 showed it, docs/gpu.md), so it is done where the device is idle:
at the end of a call, or by a thread of its own after it (``unlock_after_return``), which
holds the memory's owner until then so that the memory outlives the lock. A caller's array
can also be held locked across many calls (``held``): calls whose rows lie in it are copied
from there with no lock or unlock of their own (``held_range``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
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


def page_locked(cp: ModuleType, first: int, size: int, wait: bool = True) -> bool:
    """Whether the driver locked the ``size`` bytes of whole pages from ``first``
    (``cudaHostRegister``); where it refuses (page-locked already, or sharing a page with such)
    while ranges are being unlocked after their calls, once those are, it is asked again
    (with ``wait``; not on the locking thread, which would wait for itself)."""
    for last_try in (False, True) if wait else (True,):
        try:
            cp.cuda.runtime.hostRegister(first, size, 0)
            return True
        except cp.cuda.runtime.CUDARuntimeError:
            if last_try or not wait_for_unlocks():
                return False
    return False


_UNLOCKING: list[concurrent.futures.Future] = []  # unlocks after return, not yet waited for
_UNLOCKING_GUARD = threading.Lock()


def unlock_after_return(cp: ModuleType, first: int, owner: Any) -> None:
    """Unlocks the pages from ``first`` (whose copies have all finished) on the locking thread,
    which holds ``owner``, what the memory belongs to, until then."""
    future = locking_pool().submit(_unlock, cp, first, owner)
    with _UNLOCKING_GUARD:  # those done well are let go; a failed one waits to be raised
        _UNLOCKING[:] = [f for f in _UNLOCKING if not f.done() or f.exception() is not None]
        _UNLOCKING.append(future)


def _unlock(cp: ModuleType, first: int, owner: Any) -> None:
    """``cudaHostUnregister`` of the pages from ``first``; ``owner``, what the memory belongs
    to, is an argument only to live until then."""
    cp.cuda.runtime.hostUnregister(first)


def wait_for_unlocks() -> bool:
    """Returns once every range handed to ``unlock_after_return`` is unlocked, raising what an
    unlock raised; whether there was any."""
    with _UNLOCKING_GUARD:
        pending = list(_UNLOCKING)
        _UNLOCKING.clear()
    for future in pending:
        future.result()
    return bool(pending)


@functools.cache
def locking_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The thread that locks pages ahead and unlocks them after return, one at a time."""
    return concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gln-page-lock")


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
