"""Rows sent on the copy stream arrive whole, in turn, before anything on the current stream
reads them (on a GPU, and on the emulated device, which holds side-stream copies back until
they are waited for)."""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest

import gln.kernels.page_locks as page_locks
import gln.kernels.uploads as uploads
from tests.gln.emulated_cupy import emulated_cupy_installed


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("pieces", [1, 4])
@pytest.mark.parametrize("ahead", [False, True], ids=["in_turn", "staged_ahead"])
def test_sent_chunks_arrive_whole_and_in_turn(cp, threads, pieces, ahead, monkeypatch):
    """Each chunk on the device whole, the one before still whole in the other slot; with
    ``stage_ahead``, each next chunk staged on a thread of its own meanwhile."""
    monkeypatch.setattr(uploads, "STAGING_THREADS", threads)
    monkeypatch.setattr(uploads, "STAGING_BYTES_PER_THREAD", 1)  # every thread, on small chunks
    monkeypatch.setattr(uploads, "STAGING_PIECES", pieces)
    source = np.random.default_rng(0).standard_normal((200, 24)).astype(np.float32)
    lengths = [37, 1, 40, 3, 40, 19]  # more chunks than slots; the longest fills a slot
    starts = np.cumsum([0, *lengths[:-1]])
    # not contiguous: staging copies any layout
    chunks = [source[start:start + n, ::-1] for start, n in zip(starts, lengths, strict=True)]
    sender = uploads.ChunkUploads(max(lengths), 24)
    previous = None
    try:
        for index, rows in enumerate(chunks):
            on_device = sender.send(rows)
            if ahead and index + 1 < len(chunks):
                sender.stage_ahead(chunks[index + 1])
            scaled = on_device * 2  # a launch on the current stream reads the rows
            sender.consumed()
            np.testing.assert_array_equal(scaled.get(), 2 * rows)
            if previous is not None:  # the other slot still holds the chunk before
                np.testing.assert_array_equal(previous[0].get(), previous[1])
            previous = (on_device, rows)
    finally:
        sender.close()


@pytest.mark.parametrize("threads", [1, 3])
def test_a_failed_staging_is_raised_by_the_send(cp, threads, monkeypatch):
    """A staging copy that fails (on the calling thread or a staging thread) is raised by the
    ``send`` of its rows, and the slot serves the next send."""
    monkeypatch.setattr(uploads, "STAGING_THREADS", threads)
    monkeypatch.setattr(uploads, "STAGING_BYTES_PER_THREAD", 1)
    stage = uploads._stage

    def failing(host, rows, copying=None):
        raise MemoryError("staging failed")

    rows = np.ones((4, 6), dtype=np.float32)
    with uploads.ChunkUploads(4, 6) as sender:
        monkeypatch.setattr(uploads, "_stage", failing)
        with pytest.raises(MemoryError, match="staging failed"):
            sender.send(rows)
        monkeypatch.setattr(uploads, "_stage", stage)
        np.testing.assert_array_equal(sender.send(rows + 1).get(), rows + 1)
        sender.consumed()


def test_a_chunk_takes_a_staging_thread_per_share_of_its_bytes_up_to_the_most(monkeypatch):
    monkeypatch.setattr(uploads, "STAGING_THREADS", 4)
    monkeypatch.setattr(uploads, "STAGING_BYTES_PER_THREAD", 1000)
    counts = [uploads.staging_threads(n) for n in (0, 1, 1000, 1001, 2500, 4000, 4001, 10**9)]
    assert counts == [1, 1, 1, 2, 3, 4, 4, 4]
    monkeypatch.setattr(uploads, "STAGING_THREADS", 1)
    assert uploads.staging_threads(10**9) == 1


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.bool_])
def test_integer_chunks_travel_in_their_own_bytes(cp, dtype, monkeypatch):
    """Rows whose every value is a float32 are staged and copied as they are, a quarter or half
    of float32's bytes, and read on the device as the float32 rows of their values."""
    pinned, allocate = [], uploads._pinned

    def recorded(*args):
        pinned.append(allocate(*args))
        return pinned[-1]

    monkeypatch.setattr(uploads, "_pinned", recorded)
    low, high = (0, 2) if dtype == np.bool_ else (np.iinfo(dtype).min, np.iinfo(dtype).max + 1)
    source = np.random.default_rng(2).integers(low, high, (50, 24)).astype(dtype)
    with uploads.ChunkUploads(20, 24, dtype) as sender:
        for start, stop in ((0, 20), (20, 35), (35, 50)):  # the first slot taken again
            on_device = sender.send(source[start:stop])
            assert on_device.dtype == np.float32
            np.testing.assert_array_equal(on_device.get(),
                                          source[start:stop].astype(np.float32))
            sender.consumed()
    assert [host.dtype for host in pinned] == [np.dtype(dtype)] * uploads.SLOTS
    assert uploads.travelling_dtype(np.dtype(dtype)) == dtype
    assert uploads.travelling_dtype(np.dtype(np.float64)) == np.float32
    assert uploads.travelling_dtype(np.dtype(np.int32)) is None  # not every int32 is a float32


def test_staging_ahead_returns_once_its_thread_copies(cp, monkeypatch):
    """The caller goes on only once the staging thread is in its copy (which runs without the
    GIL), so that the copy overlaps what the caller does next; rows other than those staged
    ahead are staged when sent, over them."""
    stage, entered = uploads._stage, []

    def recorded(host, rows, copying=None):
        time.sleep(0.05)  # a staging thread slow to start: the caller must wait for it
        entered.append(copying is not None)
        stage(host, rows, copying)

    monkeypatch.setattr(uploads, "_stage", recorded)
    rows = np.arange(24, dtype=np.float32).reshape(4, 6)
    with uploads.ChunkUploads(4, 6) as sender:
        sender.send(rows)
        sender.consumed()
        entered.clear()
        sender.stage_ahead(rows + 100)
        assert entered == [True]  # in the staging thread's copy already
        np.testing.assert_array_equal(sender.send(rows + 100).get(), rows + 100)
        sender.consumed()
        sender.stage_ahead(rows + 200)
        np.testing.assert_array_equal(sender.send(rows - 100).get(), rows - 100)
        sender.consumed()


def a_model_predicting_in_chunks_of_80(monkeypatch: pytest.MonkeyPatch, dtype: type,
                                       seed: int) -> tuple:
    """A GPU model that learned 100 rows, with 300 pixels of ``dtype`` to predict in chunks
    of 80 rows."""
    import gln.staging  # noqa: PLC0415
    from gln import GLN  # noqa: PLC0415

    monkeypatch.setattr(gln.staging, "PREDICT_CHUNK_ROWS_GPU", 80)
    rng = np.random.default_rng(seed)
    X = rng.integers(0, 256, (300, 12)).astype(dtype)
    model = GLN(num_features=12, num_classes=3, layer_sizes=(8, 1), device="cuda", seed=1)
    model.learn(X[:100].astype(np.float32), rng.integers(0, 3, 100))
    return model, X


@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
def test_long_predictions_staged_ahead_equal_those_staged_in_turn(cp, dtype, monkeypatch):
    """A model's predictions of many chunks are the same bytes with each next chunk of float32
    rows staged on a thread of its own (STAGE_AHEAD) as with every chunk staged when it is
    sent; uint8 rows are staged when sent either way."""
    import gln.staging  # noqa: PLC0415

    model, X = a_model_predicting_in_chunks_of_80(monkeypatch, dtype, seed=3)
    monkeypatch.setattr(uploads, "STAGE_AHEAD", False)
    in_turn = model.predict_proba(X)
    staged, stage_ahead = [], uploads.ChunkUploads.stage_ahead

    def recorded(self, rows):
        staged.append(len(rows))
        stage_ahead(self, rows)

    monkeypatch.setattr(uploads.ChunkUploads, "stage_ahead", recorded)
    monkeypatch.setattr(uploads, "STAGE_AHEAD", True)
    np.testing.assert_array_equal(model.predict_proba(X), in_turn)
    # 300 rows: chunks of 80, 80, 80 and 60; the last, of at most HOST_WIDENED_ROWS, travels
    # widened with the count, not staged; pixels as uint8 are never staged ahead
    assert gln.staging.HOST_WIDENED_ROWS == 64
    assert staged == ([80, 80] if dtype == np.float32 else [])


def test_a_chunk_is_read_only_after_its_copy():
    """The emulated device's guard, bitten (on a GPU the copy may win the race by chance):
    without the current stream's wait for the copy stream, a launch reads the device buffer
    as it was (here: zeros) instead of the rows."""
    rows = np.arange(12, dtype=np.float32).reshape(3, 4) + 1
    with emulated_cupy_installed() as cp:
        sender = uploads.ChunkUploads(3, 4)
        sender._slots[0].device[...] = 0
        current = cp.cuda.get_current_stream()
        waited = []
        current.wait_event = waited.append  # the wait dropped
        try:
            on_device = sender.send(rows)
            assert len(waited) == 1 and (on_device * 1).get().sum() == 0  # before the copy
        finally:
            del current.wait_event
            sender.close()
        np.testing.assert_array_equal(on_device.get(), rows)  # the copy, once synchronised


def test_float64_rows_arrive_rounded_as_check_input_rounds_them(cp):
    """Rounded to nearest float32 as they are staged; a value beyond float32 arrives infinite
    (for the device's check to report), without a warning."""
    rows = np.random.default_rng(1).standard_normal((5, 7))
    rows[3, 2] = -1e39
    sender = uploads.ChunkUploads(5, 7)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            on_device = sender.send(rows).get()
    finally:
        sender.close()
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(on_device, rows.astype(np.float32))
    assert on_device[3, 2] == -np.inf


def page_locking(monkeypatch: pytest.MonkeyPatch, min_bytes: int = 1) -> None:
    """``SEND_REGISTERED`` on for a test, from ``min_bytes`` (small rows lock too)."""
    monkeypatch.setattr(uploads, "SEND_REGISTERED", True)
    monkeypatch.setattr(uploads, "SEND_REGISTERED_MIN_BYTES", min_bytes)


def counted_staging(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows of every staging copy from now on, as they are made."""
    stage, staged = uploads._stage, []

    def counted(host, rows, copying=None):
        staged.append(len(rows))
        stage(host, rows, copying)

    monkeypatch.setattr(uploads, "_stage", counted)
    return staged


@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
def test_chunks_of_a_page_locked_source_are_copied_from_where_they_lie(cp, dtype, monkeypatch):
    """With ``SEND_REGISTERED`` a batch's chunks reach the device whole with nothing staged,
    in turn through both slots (staging ahead is a no-op for them), and the batch's pages are
    unlocked at the close, so that they can be locked again."""
    page_locking(monkeypatch)
    staged = counted_staging(monkeypatch)
    source = np.random.default_rng(5).integers(0, 256, (50, 24)).astype(dtype)
    bounds = ((0, 20), (20, 35), (35, 50))  # the first slot taken again
    with uploads.ChunkUploads(20, 24, dtype, source=source) as sender:
        for index, (start, stop) in enumerate(bounds):
            on_device = sender.send(source[start:stop])
            if index + 1 < len(bounds):
                sender.stage_ahead(source[slice(*bounds[index + 1])])
            doubled = on_device * 2  # a launch on the current stream reads the rows
            sender.consumed()
            np.testing.assert_array_equal(doubled.get(), 2 * source[start:stop].astype(
                np.float32))
        assert sender.registered
    assert staged == []
    first, size = page_locks.pages_of(source)
    cp.cuda.runtime.hostRegister(first, size, 0)  # unlocked: lockable again
    cp.cuda.runtime.hostUnregister(first)


def test_a_source_the_driver_refuses_to_lock_is_staged(cp, monkeypatch):
    """Rows whose pages are locked already (here by the test) cannot be locked again: they are
    staged into pinned memory as without ``SEND_REGISTERED``, and the lock that was there is
    left as it was."""
    page_locking(monkeypatch)
    staged = counted_staging(monkeypatch)
    source = np.random.default_rng(6).standard_normal((30, 8)).astype(np.float32)
    first, size = page_locks.pages_of(source)
    cp.cuda.runtime.hostRegister(first, size, 0)
    try:
        with uploads.ChunkUploads(30, 8, source=source) as sender:
            np.testing.assert_array_equal(sender.send(source).get(), source)
            sender.consumed()
            assert not sender.registered
        assert sum(staged) == 30
    finally:
        cp.cuda.runtime.hostUnregister(first)  # still the test's own lock


def test_only_a_source_that_travels_as_it_lies_is_page_locked(cp, monkeypatch):
    """Rows rounded as they are staged (float64), a source whose rows are not contiguous, one
    below ``SEND_REGISTERED_MIN_BYTES`` or with ``SEND_REGISTERED`` off are staged; so are
    rows from elsewhere than a locked source."""
    page_locking(monkeypatch)
    rng = np.random.default_rng(7)
    wide = rng.standard_normal((12, 8))
    sources = {"float64": wide, "not contiguous": np.asfortranarray(wide, dtype=np.float32)}
    for name, source in sources.items():
        with uploads.ChunkUploads(12, 8, source=source) as sender:
            sender.send(source)
            sender.consumed()
            assert not sender.registered, name
    rows = rng.standard_normal((12, 8)).astype(np.float32)
    for setting, value in (("SEND_REGISTERED_MIN_BYTES", rows.nbytes + 1),
                           ("SEND_REGISTERED", False)):
        with monkeypatch.context() as patched:
            patched.setattr(uploads, setting, value)
            with uploads.ChunkUploads(12, 8, source=rows) as sender:
                sender.send(rows)
                sender.consumed()
                assert not sender.registered, setting
    staged = counted_staging(monkeypatch)
    elsewhere = rows + 1
    with uploads.ChunkUploads(12, 8, source=rows) as sender:
        np.testing.assert_array_equal(sender.send(rows[:6]).get(), rows[:6])
        sender.consumed()
        np.testing.assert_array_equal(sender.send(elsewhere).get(), elsewhere)
        sender.consumed()
        assert sender.registered
    assert sum(staged) == 12  # the rows from elsewhere alone


def rows_of_4000_bytes(rows: int, seed: int) -> np.ndarray:
    """``rows`` float32 rows of 4,000 bytes each from a page's start: chunks of them end and
    begin mid-page."""
    import mmap  # noqa: PLC0415

    batch = np.frombuffer(mmap.mmap(-1, rows * 4000), np.float32).reshape(rows, 1000)
    batch[:] = np.random.default_rng(seed).standard_normal(batch.shape)
    return batch


@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
def test_long_predictions_from_page_locked_rows_equal_those_staged(cp, dtype, monkeypatch):
    """A model's predictions of many chunks are the same bytes with the batch page-locked and
    copied from where it lies (``SEND_REGISTERED``) as staged, and the batch is locked once a
    call and unlocked by its end."""
    model, X = a_model_predicting_in_chunks_of_80(monkeypatch, dtype, seed=8)
    staged_outputs = model.predict_proba(X)
    page_locking(monkeypatch)
    locked, close = [], uploads.ChunkUploads.close

    def closing(self):
        locked.append(self.registered)
        close(self)

    monkeypatch.setattr(uploads.ChunkUploads, "close", closing)
    staged = counted_staging(monkeypatch)
    np.testing.assert_array_equal(model.predict_proba(X), staged_outputs)
    assert locked == [True] and staged == []
    first, size = page_locks.pages_of(X)
    cp.cuda.runtime.hostRegister(first, size, 0)  # unlocked: lockable again
    cp.cuda.runtime.hostUnregister(first)


def test_a_batch_is_locked_in_the_whole_pages_it_lies_in():
    import mmap  # noqa: PLC0415

    rows = np.zeros((3 * mmap.PAGESIZE + 10,), dtype=np.uint8)
    for start, stop in ((0, 1), (5, mmap.PAGESIZE + 7), (mmap.PAGESIZE, 3 * mmap.PAGESIZE)):
        part = rows[start:stop]
        address = part.ctypes.data
        first, size = page_locks.pages_of(part)
        assert first % mmap.PAGESIZE == 0 and size % mmap.PAGESIZE == 0
        assert first <= address < first + mmap.PAGESIZE  # no page before the rows' first
        assert address + part.nbytes <= first + size < address + part.nbytes + mmap.PAGESIZE


def counted_locks(cp, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of every ``hostRegister`` from now on."""
    register, sizes = cp.cuda.runtime.hostRegister, []

    def counted(address, size, flags):
        sizes.append(size)
        return register(address, size, flags)

    monkeypatch.setattr(cp.cuda.runtime, "hostRegister", counted)
    return sizes


def assert_lockable(cp, rows: np.ndarray) -> None:
    """Fails unless the pages ``rows`` lie in are unlocked (the driver locks them again)."""
    first, size = page_locks.pages_of(rows)
    cp.cuda.runtime.hostRegister(first, size, 0)
    cp.cuda.runtime.hostUnregister(first)


@pytest.mark.parametrize("send_registered", [True, False], ids=["", "send_registered_off"])
def test_batches_lying_in_held_pages_are_copied_from_there_with_no_lock_of_their_own(
        cp, send_registered, monkeypatch):
    """Batches lying in pages that ``held`` locked are copied from where they lie, each with no
    lock or unlock of its own (whatever ``SEND_REGISTERED`` says: the caller locked them), the
    pages stay locked between batches, and unlocked once the block ends; rows elsewhere are
    sent as before."""
    page_locking(monkeypatch)
    monkeypatch.setattr(uploads, "SEND_REGISTERED", send_registered)
    staged = counted_staging(monkeypatch)
    data, elsewhere = rows_of_4000_bytes(9, seed=16), rows_of_4000_bytes(3, seed=17)
    with page_locks.held(cp, data) as locked:
        assert locked
        locks = counted_locks(cp, monkeypatch)
        for start in (0, 3, 6):  # batches that begin and end mid-page
            batch = data[start:start + 3]
            with uploads.ChunkUploads(2, 1000, source=batch) as sender:
                for lo, hi in ((0, 2), (2, 3)):
                    doubled = sender.send(batch[lo:hi]) * 2
                    sender.consumed()
                    np.testing.assert_array_equal(doubled.get(), 2 * batch[lo:hi])
                assert sender.registered
        assert staged == [] and locks == []
        with pytest.raises(cp.cuda.runtime.CUDARuntimeError):
            assert_lockable(cp, data[3:6])  # still the block's
        locks.clear()
        first, size = page_locks.pages_of(data)
        assert page_locks.held_range(data[4:6]) == (first, first + size)
        with uploads.ChunkUploads(3, 1000, source=elsewhere) as sender:
            np.testing.assert_array_equal(sender.send(elsewhere).get(), elsewhere)
            sender.consumed()
            assert sender.registered is send_registered
        assert sum(staged) == (0 if send_registered else 3)
        assert locks == ([page_locks.pages_of(elsewhere)[1]] if send_registered else [])
    assert page_locks.held_range(data) is None
    assert_lockable(cp, data)


def test_pages_locked_already_are_not_held(cp):
    """Where the driver refuses (here the test locked the rows' pages), ``held`` yields False,
    holds nothing, and leaves the lock that was there as it was."""
    data = rows_of_4000_bytes(3, seed=18)
    first, size = page_locks.pages_of(data)
    cp.cuda.runtime.hostRegister(first, size, 0)
    try:
        with page_locks.held(cp, data) as locked:
            assert not locked
            assert page_locks.held_range(data) is None
    finally:
        cp.cuda.runtime.hostUnregister(first)  # still the test's own lock


@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
def test_long_predictions_inside_a_page_locked_block_equal_those_outside(cp, dtype,
                                                                          monkeypatch):
    """A model's predictions of slices of an array it holds page-locked are the bytes it
    predicts outside the block; inside, nothing is staged and no call locks pages of its own,
    and once the block ends the array's pages are unlocked."""
    model, X = a_model_predicting_in_chunks_of_80(monkeypatch, dtype, seed=19)
    batches = [(0, 200), (200, 300)]  # 3 chunks, then 2, each call's last widened, not sent
    outside = [model.predict_proba(X[a:b]) for a, b in batches]
    page_locking(monkeypatch, min_bytes=1 << 30)  # no call's own batch would be locked
    staged = counted_staging(monkeypatch)
    with model.page_locked(X) as rows:
        assert rows is X
        locks = counted_locks(cp, monkeypatch)
        inside = [model.predict_proba(rows[a:b]) for a, b in batches]
        with model.page_locked(np.asfortranarray(X)):  # not C-contiguous: not locked
            pass
    for got, expected in zip(inside, outside, strict=True):
        np.testing.assert_array_equal(got, expected)
    assert staged == [] and locks == []
    monkeypatch.undo()
    assert_lockable(cp, X)


def test_a_cpu_model_locks_nothing(monkeypatch):
    """On a CPU model ``page_locked`` yields the rows as they are and locks nothing."""
    from gln import GLN  # noqa: PLC0415

    calls = []
    monkeypatch.setattr(page_locks, "held", lambda *args: calls.append(args))
    model = GLN(num_features=4, num_classes=2, layer_sizes=(4, 1), device="cpu", seed=0)
    for rows in (np.zeros((5, 4), np.float32), np.zeros((4, 5), np.float32).T):
        with model.page_locked(rows) as same:
            assert same is rows
    assert calls == []
