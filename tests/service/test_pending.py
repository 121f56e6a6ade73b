"""The store of rows waiting for labels, and their encoding in snapshots."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from service.engine.waiting_rows import WaitingRows, decode_rows, encode_rows


def _rows(n: int, seed: int = 0) -> tuple[list[str], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.ones(3), n)
    return [f"id-{seed}-{i}" for i in range(n)], rng.standard_normal((n, 4), np.float32), probs


def test_rows_due_are_those_whose_wait_ended_then_those_beyond_the_limit() -> None:
    pending = WaitingRows(ttl_s=10.0, max_rows=3)
    for t in range(5):
        ids, X, p = _rows(1, seed=t)
        pending.put(ids, X, p, expires_at=10.0 + t)
    assert [row.id for row in pending.due(now=0.0)] == ["id-0-0", "id-1-0"]  # 5 > 3
    assert [row.id for row in pending.due(now=12.0)] == ["id-0-0", "id-1-0", "id-2-0"]
    assert len(pending) == 5  # due rows stay until removed
    pending.remove_rows(pending.due(now=0.0))
    assert pending.due(now=0.0) == []


def test_a_row_is_removed_only_while_it_is_the_one_waiting_under_its_id() -> None:
    pending = WaitingRows(ttl_s=10.0, max_rows=10)
    ids, X, p = _rows(2)
    pending.put(ids, X, p, expires_at=10.0)
    (old,), _ = pending.waiting([ids[0]], now=0.0)
    pending.put(ids[:1], X[1:], p[1:], expires_at=11.0)  # predicted again under the same id
    assert not pending.is_waiting(old)
    assert pending.remove_rows([old]) == 0
    found, missing = pending.waiting(ids, now=0.0)
    assert found[0].features.tobytes() == X[1].tobytes() and missing == []
    pending.remove_ids([ids[0]])
    assert [row.id for row in pending.rows()] == [ids[1]]


def test_rows_whose_wait_ended_are_due_behind_rows_that_still_wait() -> None:
    """A restart under a shorter TTL puts rows with earlier deadlines after later ones."""
    pending = WaitingRows(ttl_s=10.0, max_rows=10)
    for i, deadline in enumerate([100.0, 5.0, 200.0, 6.0]):
        ids, X, p = _rows(1, seed=i)
        pending.put(ids, X, p, expires_at=deadline)
    assert [row.id for row in pending.due(now=10.0)] == ["id-1-0", "id-3-0"]
    assert [row.id for row in pending.due(now=150.0)] == ["id-0-0", "id-1-0", "id-3-0"]


@pytest.mark.parametrize("deadlines", ["in order", "shuffled"])
@pytest.mark.parametrize("seed", range(20))
def test_the_ids_expiring_with_a_put_are_those_due_right_after_it(
    seed: int, deadlines: str
) -> None:
    """What the writer logs with a put (before putting) is what :meth:`due` finds after it:
    the oldest beyond the limit and the ended waits; replaced ids are not expired."""
    rng = np.random.default_rng(seed)
    max_rows = int(rng.integers(1, 6))
    pending = WaitingRows(ttl_s=10.0, max_rows=max_rows)
    for t in range(int(rng.integers(0, 8))):
        row_id = f"id-{rng.integers(0, 6)}"
        deadline = 10.0 + (t if deadlines == "in order" else rng.uniform(0, 8))
        pending.put([row_id], np.zeros((1, 4), np.float32), np.full((1, 3), 1 / 3), deadline)
    ids = [f"id-{i}" for i in rng.integers(0, 9, size=int(rng.integers(0, 7)))]  # repeats too
    now = float(rng.uniform(5.0, 20.0))

    expiring = pending.expiring_with(ids, now)
    pending.put(ids, np.zeros((len(ids), 4), np.float32), np.full((len(ids), 3), 1 / 3),
                now + 10.0)
    assert expiring == [row.id for row in pending.due(now)]


def test_waiting_rows_hold_no_more_memory_than_their_capacity_counts() -> None:
    """The bound the server reserves in its budget holds for the longest ids."""
    pending = WaitingRows(ttl_s=10.0, max_rows=2000)
    ids = [f"{i:0200d}" for i in range(2000)]
    X = np.ones((2000, 50), np.float32)
    probs = np.full((2000, 10), 0.1)
    tracemalloc.start()
    try:
        pending.put(ids, X, probs, expires_at=10.0)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(pending) == 2000
    assert 2000 * (4 * 50 + 8 * 10) < held <= pending.capacity_nbytes(50, 10)


def test_a_waiting_row_does_not_keep_its_requests_other_rows_in_memory() -> None:
    pending = WaitingRows(ttl_s=10.0, max_rows=2000)
    ids = [str(i) for i in range(1000)]
    tracemalloc.start()
    try:
        X = np.ones((1000, 1000), np.float32)  # 4 MB
        pending.put(ids, X, np.full((1000, 2), 0.5), expires_at=10.0)
        pending.remove_ids(ids[1:])  # all but one learned
        del X
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [row.id for row in pending.rows()] == ["0"]
    assert held < 100_000


def test_rows_whose_wait_ended_are_not_found() -> None:
    pending = WaitingRows(ttl_s=10.0, max_rows=10)
    ids, X, p = _rows(2)
    pending.put(ids, X, p, expires_at=10.0)
    assert pending.waiting(ids, now=10.0) == ([], ids)


def test_rows_round_trip_through_their_encoding_in_order() -> None:
    pending = WaitingRows(ttl_s=10.0, max_rows=10)
    for seed in range(3):
        ids, X, p = _rows(2 + seed, seed)
        pending.put(ids, X, p, expires_at=100.0 + seed / 3)
    rows = pending.rows()
    back = decode_rows(encode_rows(rows))
    assert [row.id for row in back] == [row.id for row in rows]
    for a, b in zip(rows, back, strict=True):
        assert b.features.dtype == np.float32 and b.features.tobytes() == a.features.tobytes()
        assert b.prediction.tobytes() == np.asarray(a.prediction, np.float64).tobytes()
        assert b.expires_at == a.expires_at
    restored = WaitingRows(ttl_s=10.0, max_rows=10)
    restored.put_rows(back)
    assert [row.id for row in restored.due(now=100.5)] == [row.id for row in rows[:5]]


@pytest.mark.parametrize("damage", ["magic", "truncated", "extra"])
def test_damaged_encodings_are_refused(damage: str) -> None:
    ids, X, p = _rows(2)
    pending = WaitingRows(ttl_s=10.0, max_rows=10)
    pending.put(ids, X, p, expires_at=1.0)
    blob = encode_rows(pending.rows())
    damaged = {"magic": b"X" + blob[1:], "truncated": blob[:-1], "extra": blob + b"\0"}[damage]
    with pytest.raises(ValueError, match="waiting rows"):
        decode_rows(damaged)
