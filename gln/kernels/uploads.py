"""A long batch's rows sent to the GPU on a stream of their own, so that each chunk's copy
overlaps the device's work on the chunk before instead of queueing behind it.

``cupy.asarray`` stages host rows in pinned memory and copies them on the current stream: a
chunk's copy starts only once every launch of the chunk before has finished, and the device
waits, idle, for the host to stage the first chunk whole. Here a chunk is staged in pieces
(by up to ``STAGING_THREADS`` host threads, as many as the chunk's bytes are worth:
``staging_threads``; NumPy's copy releases the GIL), each piece's copy is
issued on the copy stream as soon as the piece is staged, and events order the rest:

* the current stream waits for a chunk's copies before anything reads its rows (``send``);
* a pinned buffer is staged again only once its copy has finished (the host waits for it);
* a device buffer is written again only once the current stream has read it (``consumed``).

With ``STAGE_AHEAD`` the next chunk is staged by a thread of its own (``stage_ahead``) while
the caller launches the work of the chunk before: a float32 chunk's copy into pinned memory
(about 1.7 ms for 2,048 MNIST rows on an H200's host) then overlaps those launches (about
0.9 ms) instead of following them while the device waits for the rows. The caller waits until
that thread is inside NumPy's copy, which runs without the GIL: a thread that needs the GIL to
start gets it from a caller busy in Python (as launching is) only once the interpreter's
switch interval (5 ms) has passed, by when the launches are over and nothing overlaps.

With ``SEND_REGISTERED`` nothing is staged where the batch's rows travel as they lie: its pages
are locked for the call (``cudaHostRegister``) and the device copies each chunk from there, until
``close`` unlocks them. A batch lying in pages that the caller holds locked
(``page_locks.held``, ``GLN.page_locked``) is copied from there and left locked.

Two slots (a pinned buffer and a device buffer each) take turns, so one chunk is staged and
copied while the device works on the other, and a batch of any length holds two chunks' rows
on the device.

Rows travel as float32, or, where every value of their dtype is a float32 as it is
(``gln.checks.EXACT_IN_FLOAT32``: pixels as uint8), in their own bytes, which the device widens
to the same float32 in one launch: a quarter of the bytes to stage and copy for pixels.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from gln.backend import import_cupy, side_stream
from gln.checks import EXACT_IN_FLOAT32
from gln.kernels import page_locks
from gln.kernels.page_locks import pages_of

STAGING_THREADS = 4  # host threads that stage a float32 chunk into pinned memory (1: the caller)
STAGING_BYTES_PER_THREAD = 2 << 20  # below it a thread's hand-off costs more than it saves
STAGING_PIECES = 4  # a chunk's first piece is copied while the host stages the rest
SLOTS = 2  # one chunk staged and copied while the device works on the other
STAGE_AHEAD = True  # float32 rows: each next chunk staged while the caller launches the one before
# Rows that travel as they lie, page-locked for the call and copied by the device's own DMA.
SEND_REGISTERED = True
SEND_REGISTERED_MIN_BYTES = 1 << 20  # smaller batches are staged
SEND_REGISTERED_MAX_BYTES = 256 << 20  # the most a call holds page-locked


@dataclass
class _Slot:
    """One chunk's room: pinned host rows, device rows, and the events that free them."""

    host: np.ndarray
    device: Any
    copied: Any = None  # on the copy stream, after the slot's last copy
    consumed: Any = None  # on the reading stream, after the last launch that read the slot


def travelling_dtype(dtype: np.dtype) -> np.dtype | None:
    """The dtype rows of ``dtype`` travel in: their own where each value is a float32 as it is,
    float32 for float64 rows (rounded as they are staged), None for others (the host converts
    them)."""
    if dtype in EXACT_IN_FLOAT32 or dtype == np.float32:
        return np.dtype(dtype)
    return np.dtype(np.float32) if dtype == np.float64 else None


class ChunkUploads:
    """Chunks of at most ``max_rows`` rows of ``num_features`` values, sent in turn as
    ``dtype`` (float32, or one of ``EXACT_IN_FLOAT32``) and read on the device as float32.

    ``source``: the batch that the rows sent are chunks of, whose pages are locked from the first
    send from it (``SEND_REGISTERED``) until ``close``, so that its chunks are copied from where
    they lie (``registered`` says whether they are).

    >>> with ChunkUploads(2048, 784) as uploads:           # doctest: +SKIP
    ...     rows32 = uploads.send(X[:2048]); launch(rows32); uploads.consumed()
    """

    def __init__(self, max_rows: int, num_features: int, dtype: Any = np.float32,
                 source: np.ndarray | None = None) -> None:
        cp = import_cupy()
        self._cp = cp
        self._dtype = np.dtype(dtype)
        self._source_to_lock = source  # until the first send from it tries to lock it
        self._source: np.ndarray | None = None  # page-locked, until close unlocks it, in ...
        self._lock: tuple[int, int] | None = None  # ... these pages: (first's address, end)
        self._borrowed = False  # whether those pages are the caller's to unlock (held)
        self._stream = side_stream(cp, cp.cuda.Device().id, "copy")
        self._slots = [_Slot(_pinned(cp, (max_rows, num_features), self._dtype),
                             cp.empty((max_rows, num_features), dtype=self._dtype))
                       for _ in range(SLOTS)]
        self._sent = 0
        self._ahead: tuple[np.ndarray, concurrent.futures.Future] | None = None

    def send(self, rows: np.ndarray) -> Any:
        """``rows`` (n, d) on the device as float32 (rounded to nearest as they are staged as
        float32, which leaves float32 rows as they are; widened there from any other dtype
        they travel in), ready for the current stream's next launches; the view stays valid
        until ``consumed`` after the next-but-one ``send``. Rows given to ``stage_ahead``
        just before (the same array object) are copied as they were staged there."""
        slot = self._slots[self._sent % SLOTS]
        self._sent += 1
        n = len(rows)
        locked = self._in_locked_source(rows)
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead[1].result()  # staged (or raises), after the slot's last copy had finished
        elif slot.copied is not None and not locked:
            slot.copied.synchronize()
        if slot.consumed is not None:
            self._stream.wait_event(slot.consumed)
        host, device = slot.host[:n], slot.device[:n]
        if locked:  # the device copies them from where they lie
            device.set(rows, stream=self._stream)
        elif ahead is not None and ahead[0] is rows:
            device.set(host, stream=self._stream)
        else:
            for start, stop in _staged_pieces(rows, host):
                device[start:stop].set(host[start:stop], stream=self._stream)
        slot.copied = self._stream.record()
        self._cp.cuda.get_current_stream().wait_event(slot.copied)
        return device if self._dtype == np.float32 else device.astype(self._cp.float32)

    def stage_ahead(self, rows: np.ndarray) -> None:
        """Stage ``rows``, the next chunk to ``send``, on a thread of its own into the pinned
        buffer of the slot they will take (once that slot's last copy has finished); returns
        once that thread is copying."""
        slot = self._slots[self._sent % SLOTS]
        if (self._ahead is not None or len(rows) > len(slot.host)
                or self._source is not None and _lies_in(rows, self._source)):
            return  # (rows of the locked source are sent from where they lie, or staged then)
        copying = threading.Event()
        self._ahead = (rows, _ahead_pool().submit(_stage_after, slot, rows, copying))
        copying.wait()

    def consumed(self) -> None:
        """The current stream's launches so far are the last to read the rows sent last (a
        later call, after chunks sent otherwise, only makes their slot wait longer)."""
        self._slots[(self._sent - 1) % SLOTS].consumed = self._cp.cuda.get_current_stream().record()

    @property
    def registered(self) -> bool:
        """Whether the source's pages are locked (from its first send until the close)."""
        return self._lock is not None

    def _in_locked_source(self, rows: np.ndarray) -> bool:
        """Whether ``rows`` lie in the page-locked pages of the source, locking it first where
        this is the first send from it (``SEND_REGISTERED``): the device then copies them from
        there."""
        source = self._source_to_lock
        if source is not None and _lies_in(rows, source):
            self._source_to_lock = None
            held = page_locks.held_range(source) if source.dtype == self._dtype else None
            if held is not None:  # locked by the caller, for as long as it holds it
                self._source, self._lock, self._borrowed = source, held, True
            elif _lockable(source, self._dtype):
                first, size = pages_of(source)
                if page_locks.page_locked(self._cp, first, size):
                    self._source, self._lock = source, (first, first + size)
        return self._source is not None and _lies_in(rows, self._source)

    def close(self) -> None:
        """Waits for the staging and the copies still running, so the pinned buffers can go back
        to the pool and the source's pages be unlocked."""
        try:
            if self._ahead is not None:
                concurrent.futures.wait([self._ahead[1]])
                self._ahead = None
            for slot in self._slots:
                if slot.copied is not None:
                    slot.copied.synchronize()
        finally:
            lock, borrowed = self._lock, self._borrowed
            self._source = self._source_to_lock = self._lock = None
            self._borrowed = False
            if lock is not None and not borrowed:  # no copy reads them any more
                self._cp.cuda.runtime.hostUnregister(lock[0])

    def __enter__(self) -> ChunkUploads:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _piece_bounds(rows: int, pieces: int) -> list[tuple[int, int]]:
    """``rows`` cut into at most ``pieces`` row ranges of nearly equal lengths."""
    bounds = np.linspace(0, rows, min(pieces, rows) + 1).astype(int)
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True))


def _staged_pieces(rows: np.ndarray, host: np.ndarray) -> Iterator[tuple[int, int]]:
    """Copies ``rows`` into ``host`` in ``STAGING_PIECES`` row ranges, yielding each range, in
    order, once it is staged; every copy has finished when the generator is closed."""
    pieces = _piece_bounds(len(rows), STAGING_PIECES)
    threads = staging_threads(host.nbytes)
    if threads <= 1:
        for start, stop in pieces:
            _stage(host[start:stop], rows[start:stop])
            yield start, stop
        return
    futures = [_staging_pool(threads).submit(_stage, host[start:stop], rows[start:stop])
               for start, stop in pieces]
    try:
        for (start, stop), future in zip(pieces, futures, strict=True):
            future.result()
            yield start, stop
    finally:
        concurrent.futures.wait(futures)


def staging_threads(nbytes: int) -> int:
    """How many host threads stage a chunk of ``nbytes`` staged bytes: ``STAGING_THREADS`` at
    most, one per ``STAGING_BYTES_PER_THREAD`` begun."""
    return max(1, min(STAGING_THREADS, -(-nbytes // STAGING_BYTES_PER_THREAD)))


def _stage(host: np.ndarray, rows: np.ndarray, copying: threading.Event | None = None) -> None:
    """``rows`` into ``host``, rounded to float32 silently where they are wider: a value beyond
    float32 becomes infinite, which the caller's check on the device reports (NumPy's error
    state is per thread, so it is set here, in the thread that stages). ``copying`` is set
    just before the copy, which releases the GIL."""
    with np.errstate(over="ignore"):
        if copying is not None:
            copying.set()
        np.copyto(host, rows)


def _stage_after(slot: _Slot, rows: np.ndarray, copying: threading.Event) -> None:
    """``rows`` into ``slot``'s pinned buffer once the copy that last read it has finished;
    ``copying`` set when the copy starts, or when it failed to."""
    try:
        if slot.copied is not None:
            slot.copied.synchronize()
        _stage(slot.host[:len(rows)], rows, copying)
    finally:
        copying.set()


def _lies_in(rows: np.ndarray, source: np.ndarray) -> bool:
    """Whether ``rows`` are contiguous bytes of ``source``'s, of the same dtype."""
    start = source.__array_interface__["data"][0]
    first = rows.__array_interface__["data"][0]
    return (rows.dtype == source.dtype and rows.flags.c_contiguous
            and start <= first and first + rows.nbytes <= start + source.nbytes)


def _lockable(source: np.ndarray, dtype: np.dtype) -> bool:
    """Whether ``source``'s pages are to be locked (``SEND_REGISTERED``): it travels as it lies
    (``dtype``, C-contiguous) and is ``SEND_REGISTERED_MIN_BYTES`` to
    ``SEND_REGISTERED_MAX_BYTES`` long."""
    return (SEND_REGISTERED and source.dtype == dtype and source.flags.c_contiguous
            and SEND_REGISTERED_MIN_BYTES <= source.nbytes <= SEND_REGISTERED_MAX_BYTES)


def _pinned(cp: ModuleType, shape: tuple[int, int], dtype: np.dtype) -> np.ndarray:
    """A host array in page-locked memory from CuPy's pinned pool."""
    memory = cp.cuda.alloc_pinned_memory(shape[0] * shape[1] * dtype.itemsize)
    return np.frombuffer(memory, dtype, shape[0] * shape[1]).reshape(shape)


@functools.cache
def _staging_pool(threads: int) -> concurrent.futures.ThreadPoolExecutor:
    """The staging threads, one pool per count, so that a changed ``STAGING_THREADS`` takes
    effect at the next chunk."""
    return concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="gln-stage")


@functools.cache
def _ahead_pool() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gln-stage-ahead")
