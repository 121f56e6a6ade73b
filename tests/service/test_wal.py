"""Contract tests for the write-ahead logs, run against a real Redis, a real directory and a
real NATS server (JetStream).

The first part runs once per log (``backend`` is parametrised); a small ``Backend`` helper per
log knows how to list what it keeps underneath (Redis keys, files). The tests check what the
service will rely on: what was appended comes back exactly, in order, once; trims drop exactly
the entries asked for; idempotency keys name the entry they were logged with; a crash's torn
last record is ignored while real corruption is refused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis

from service.settings import Settings
from service.storage.common import parse_nats_url
from service.storage.wal import (
    FileWriteAheadLog,
    LogAppend,
    LogEntry,
    LoggedRequest,
    ModelListing,
    RedisWriteAheadLog,
    WalCorruptError,
    WalDivergedError,
    WalDurabilityError,
    WalGapError,
    WriteAheadLog,
    open_wal,
    request_digest,
)
from service.storage.wal.nats_log import NatsWriteAheadLog, WalTimeoutError
from service.storage.wal.redis_log import _next_redis_id
from tests.support.legacy_file_log import frame
from tests.support.nats_process import NatsProcess, nats_subjects
from tests.support.redis_process import RedisProcess, find_waitaof_server, free_port


class Backend:
    """A log under test plus a way to list what it keeps underneath."""

    kind: str

    def make(self, **options: object) -> WriteAheadLog:
        raise NotImplementedError

    def traces(self) -> list[str]:
        """Every key or file the log keeps (for 'nothing left behind' checks)."""
        raise NotImplementedError


class RedisBackend(Backend):
    kind = "redis"

    def __init__(self, url: str, prefix: str) -> None:
        self.url, self.prefix = url, prefix
        self.client = redis.Redis.from_url(url)

    def make(self, **options: object) -> WriteAheadLog:
        return RedisWriteAheadLog(self.url, key_prefix=self.prefix, **options)  # type: ignore[arg-type]

    def traces(self) -> list[str]:
        return sorted(k.decode() for k in self.client.scan_iter(match=f"{self.prefix}*"))


class FileBackend(Backend):
    kind = "file"

    def __init__(self, root: Path) -> None:
        self.root = root

    def make(self, **options: object) -> WriteAheadLog:
        return FileWriteAheadLog(self.root, **options)  # type: ignore[arg-type]

    def traces(self) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*"))


class NatsBackend(Backend):
    kind = "nats"

    def __init__(self, url: str, prefix: str) -> None:
        self.url, self.prefix = url, prefix

    def make(self, **options: object) -> WriteAheadLog:
        return NatsWriteAheadLog(self.url, key_prefix=self.prefix, **options)  # type: ignore[arg-type]

    def traces(self) -> list[str]:
        """The subjects that hold messages in the log's three streams."""
        return nats_subjects(self.url, [f"{self.prefix}-wal", f"{self.prefix}-wal-keys",
                                        f"{self.prefix}-wal-meta"])


@pytest.fixture(params=["redis", "file", "nats"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """One Backend per log kind; Redis keys live under a per-test prefix, and so do the NATS
    log's streams."""
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        prefix = request.getfixturevalue("redis_key_prefix")
        yield RedisBackend(url, prefix)
    elif request.param == "nats":
        yield NatsBackend(request.getfixturevalue("nats_url"),
                          request.getfixturevalue("nats_prefix"))
    else:
        yield FileBackend(tmp_path / "wal")


@pytest.fixture
def wal(backend: Backend) -> Iterator[WriteAheadLog]:
    log = backend.make()
    yield log
    log.close()


def chunk(n: int, d: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d)).astype(np.float32), rng.integers(0, 10, n)


def tagged(tag: int, n: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """A chunk whose labels say which append it came from."""
    return np.full((n, 2), tag, np.float32), np.full(n, tag, np.int64)


def tags(entries: Iterator[LogEntry]) -> list[int]:
    return [int(e.labels[0]) for e in entries]


def assert_same(entry: LogEntry, features: np.ndarray, labels: np.ndarray) -> None:
    assert entry.features.dtype == features.dtype and entry.features.shape == features.shape
    assert entry.labels.dtype == labels.dtype and entry.labels.shape == labels.shape
    assert entry.features.tobytes() == features.tobytes()  # bit-exact, NaNs included
    assert entry.labels.tobytes() == labels.tobytes()


# -- the contract, for both logs ----------------------------------------------------------------


def test_round_trip_is_exact(wal: WriteAheadLog) -> None:
    assert isinstance(wal, WriteAheadLog)
    X, y = chunk(7)
    X[0, 0], X[1, 1], X[2, 2] = np.nan, -0.0, np.finfo(np.float32).tiny
    before = time.time()
    entry_id = wal.append("m", X, y, ["k1", None])
    assert isinstance(entry_id, str)
    (entry,) = wal.read_after("m", None)
    assert entry.id == entry_id and y.dtype == np.int64
    assert_same(entry, X, y)
    assert entry.idempotency_keys == ("k1", None)
    assert before - 1 <= entry.created_at <= time.time() + 1
    assert wal.last_id("m") == entry_id


def test_wait_entries_and_learned_label_ids_round_trip_in_order(wal: WriteAheadLog) -> None:
    X, _ = chunk(3)
    predictions = np.array([[0.25, 0.75], [0.5, 0.5], [1 / 3, 2 / 3]])
    waited = wal.append_waiting("m", ["a", "b", "c"], X, predictions, 1234.5)
    plain = wal.append("m", *tagged(1))
    learned = wal.append("m", X[:2], np.array([1, 0]), label_ids=["b", "a"])
    first, second, third = wal.read_after("m", None)
    assert [first.id, second.id, third.id] == [waited, plain, learned]
    assert first.waiting and first.label_ids == ("a", "b", "c") and first.expires_at == 1234.5
    assert first.features.tobytes() == X.tobytes() and len(first.labels) == 0
    assert first.predictions is not None
    assert first.predictions.tobytes() == predictions.tobytes()  # float64, bit-exact
    assert not second.waiting and second.label_ids == () and tags([second]) == [1]
    assert not third.waiting and third.label_ids == ("b", "a")
    assert_same(third, X[:2], np.array([1, 0]))


def test_an_append_that_follows_another_end_is_refused_and_logs_nothing(
    wal: WriteAheadLog,
) -> None:
    """``follows`` names where the writer knows the log to end (None: empty): an append is
    logged only if it does and none of its keys is logged yet, also across trims and for wait
    entries; without it, always."""
    X, _ = chunk(1)
    first = wal.append("m", *tagged(1), ["k1"], follows=None)
    with pytest.raises(WalDivergedError, match=f"ends at {first}, not at nothing"):
        wal.append("m", *tagged(2), ["k2"], follows=None)
    with pytest.raises(WalDivergedError, match="already holds idempotency key 'k1'"):
        wal.append("m", *tagged(2), ["k3", "k1"], follows=first)
    second = wal.append_waiting("m", ["a"], X, np.ones((1, 2)), 10.0, follows=first)
    wal.trim_through("m", second)
    with pytest.raises(WalDivergedError, match=f"ends at {second}, not at {first}"):
        wal.append_waiting("m", ["b"], X, np.ones((1, 2)), 10.0, follows=first)
    third = wal.append("m", *tagged(3), follows=second)
    fourth = wal.append("m", *tagged(4))  # follows nothing in particular
    assert [e.id for e in wal.read_after("m", None)] == [third, fourth]
    assert wal.seen_key("m", "k2") is None and wal.seen_key("m", "k3") is None
    assert wal.reaches("m", first) and wal.reaches("m", fourth)
    assert not wal.reaches("other", first)
    wal.delete("m")
    assert not wal.reaches("m", first)
    assert wal.append("m", *tagged(5), follows=None)  # a deleted log starts afresh


def test_append_many_logs_each_append_and_refuses_one_alone(wal: WriteAheadLog) -> None:
    """One result per append, in order: an id, or the exception of an append refused (which
    logs nothing of it), the others logged as if appended one by one."""
    X, _ = chunk(1)
    first = wal.append("a", *tagged(1))
    results = wal.append_many([
        LogAppend("a", *tagged(2), follows=first),
        LogAppend("b", *tagged(3), ["kb"], request_digests=["00ff"]),
        LogAppend("a", *tagged(4), follows=first),  # "a" ends at the one before now
        LogAppend("c", X, predictions=np.ones((1, 2)), label_ids=["w"], expires_at=5.0),
        LogAppend("b", X, np.array([1, 2])),  # one row, two labels
        LogAppend("a", *tagged(5), start=9),
    ])
    assert isinstance(results[2], WalDivergedError) and isinstance(results[4], ValueError)
    a2, b3, _, c, _, a5 = results
    assert [e.id for e in wal.read_after("a", None)] == [first, a2, a5]
    assert tags(wal.read_after("a", None)) == [1, 2, 5]
    assert [e.start for e in wal.read_after("a", first)] == [None, 9]
    assert [(e.id, int(e.labels[0])) for e in wal.read_after("b", None)] == [(b3, 3)]
    assert wal.logged_requests("b", ["kb"]) == [LoggedRequest(b3, "00ff")]
    (waiting,) = wal.read_after("c", None)
    assert (waiting.id, waiting.waiting, waiting.label_ids) == (c, True, ("w",))
    assert wal.append_many([]) == []


def test_a_stream_logged_before_its_end_was_kept_is_checked_by_its_last_id(
    redis_url: str, redis_key_prefix: str,
) -> None:
    """A log appended to by an earlier version has no ``:last`` key: its stream's own
    last-generated id stands in for it, so ``follows`` works there too."""
    wal = RedisWriteAheadLog(redis_url, key_prefix=redis_key_prefix)
    first = wal.append("m", *tagged(1))
    client = redis.Redis.from_url(redis_url)
    client.delete(f"{redis_key_prefix}:wal:m:last")
    client.close()
    assert wal.last_id("m") == first and wal.reaches("m", first)
    with pytest.raises(WalDivergedError):
        wal.append("m", *tagged(2), follows=None)
    second = wal.append("m", *tagged(2), follows=first)
    assert wal.last_id("m") == second != first
    wal.close()


def test_wait_entries_name_the_rows_that_expired_with_them(wal: WriteAheadLog) -> None:
    """A put that pushes rows out names them; a drop alone is a wait entry of no rows."""
    X, _ = chunk(1)
    wal.append_waiting("m", ["c"], X, np.ones((1, 2)), 10.0, expired_ids=["a", "b"])
    wal.append_waiting("m", [], X[:0], np.ones((0, 2)), 0.0, expired_ids=["c"])
    put, dropped = wal.read_after("m", None)
    assert put.label_ids == ("c",) and put.expired_ids == ("a", "b")
    assert dropped.waiting and dropped.label_ids == () and dropped.expired_ids == ("c",)
    assert dropped.features.shape == (0, X.shape[1]) and dropped.predictions.shape == (0, 2)


def test_wait_entries_refuse_mismatched_arguments(wal: WriteAheadLog) -> None:
    X, _ = chunk(2)
    with pytest.raises(ValueError, match="2 ids, 2 feature rows and 3 predictions"):
        wal.append_waiting("m", ["a", "b"], X, np.zeros((3, 2)), 1.0)
    with pytest.raises(ValueError, match="predictions must be a 2-D float"):
        wal.append_waiting("m", ["a", "b"], X, np.zeros((2, 2), np.int64), 1.0)
    with pytest.raises(TypeError, match="label ids"):
        wal.append("m", X, np.array([0, 1]), label_ids="ab")
    with pytest.raises(TypeError, match="label ids"):
        wal.append_waiting("m", ["a", "b"], X, np.zeros((2, 2)), 1.0, expired_ids=[1])
    assert list(wal.read_after("m", None)) == []


def test_plain_learn_entries_keep_the_first_format(
    wal: WriteAheadLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A log without delayed labels stays readable by a server that predates them; entries
    about delayed labels are marked so that such a server refuses them."""
    from service.storage.wal import entries, file_log, nats_log, redis_log

    X, y = chunk(1)
    wal.append("m", X, y)
    wal.append("m", X, y, label_ids=["a"])
    wal.append_waiting("m", ["a"], X, np.ones((1, 2)), 1.0)
    original, versions = entries.decode_entry, []

    def spy(entry_id: str, header: dict, *raw: bytes) -> LogEntry:
        versions.append(header["v"])
        return original(entry_id, header, *raw)

    for log_module in (file_log, redis_log, nats_log):
        monkeypatch.setattr(log_module, "decode_entry", spy)
    assert len(list(wal.read_after("m", None))) == 3
    assert versions == [1, 2, 2]


def test_a_birth_is_logged_first_read_back_with_its_config_and_refused_by_older_servers(
    wal: WriteAheadLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model's birth (its configuration, no rows) is an entry like the others: it must come
    first (``follows=None``), the learning after it follows its id, a trim drops it, and its
    format is one a server that predates births refuses."""
    from service.storage.wal import entries

    config = {"num_features": 2, "layer_sizes": [4, 1], "learning_rate": {"scale": 0.5}}
    born = wal.append_birth("m", config)
    with pytest.raises(WalDivergedError):
        wal.append_birth("m", config)  # a second birth does not follow the first
    X, y = chunk(2)
    learned = wal.append("m", X, y, follows=born)
    first, second = wal.read_after("m", None)
    assert (first.id, first.birth, first.config, first.features.shape) == (born, True, config,
                                                                           (0, 0))
    assert (second.id, second.birth, second.config) == (learned, False, None)
    assert [e.id for e in wal.read_after("m", born)] == [learned]
    header, x, y_raw = entries.encode_append(LogAppend("m", X[:0], config=config))[1:4]
    assert header["v"] == entries.FORMAT_BIRTH
    with pytest.raises(WalCorruptError, match="no rows"):  # a birth with rows is damage
        entries.decode_entry("1", {**header, "x": {"dtype": "<f4", "shape": list(X[:1].shape)},
                                   "y": {"dtype": "<i8", "shape": [1]}},
                             X[:1].astype("<f4").tobytes(), y[:1].astype("<i8").tobytes())
    with pytest.raises(TypeError):
        wal.append_birth("other", {"seed": object()})  # nothing no log could write
    wal.trim_through("m", born)
    assert [e.id for e in wal.read_after("m", None)] == [learned]


def test_the_file_and_redis_logs_list_the_models_they_hold_entries_of(
    backend: Backend
) -> None:
    """What a restore finds the models of no snapshot by (their births): every model with a
    live entry, after a reopening too; not one trimmed to nothing, nor one deleted, nor
    another prefix's (Redis). The NATS log does not list its models."""
    if backend.kind == "nats":
        assert not isinstance(backend.make(), ModelListing)
        return
    wal = backend.make()
    other = (RedisWriteAheadLog(backend.url, key_prefix=f"{backend.prefix}-other")  # type: ignore[attr-defined]
             if backend.kind == "redis" else None)
    for name in ("b", "a", "gone", "trimmed"):
        wal.append_birth(name, {"num_features": 2})
    if other is not None:
        other.append_birth("elsewhere", {"num_features": 2})
    wal.trim_through("trimmed", wal.last_id("trimmed"))
    wal.delete("gone")
    wal.append("a", *chunk(1), idempotency_keys=["k"])  # a key's entry is no model
    assert isinstance(wal, ModelListing) and wal.names() == ["a", "b"]
    wal.close()
    with backend.make() as reopened:
        assert reopened.names() == ["a", "b"]


def test_other_dtypes_and_byte_orders_are_kept(wal: WriteAheadLog) -> None:
    X64 = np.arange(6, dtype=np.float64).reshape(3, 2) / 3
    y32 = np.array([1, 2, 3], dtype=np.int32)
    wal.append("m", X64, y32)
    big_endian = np.arange(4, dtype=">f4").reshape(2, 2)
    wal.append("m", big_endian, np.array([0, 1], dtype=np.uint8))
    wal.append("m", np.asfortranarray(X64.astype(np.float32)), y32.astype(np.int64))
    first, second, third = wal.read_after("m", None)
    assert_same(first, X64, y32)
    assert second.features.dtype == np.dtype("<f4")  # stored little-endian, same values
    assert np.array_equal(second.features, big_endian) and second.labels.dtype == np.uint8
    assert np.array_equal(third.features, X64.astype(np.float32))


def test_order_across_many_appends(wal: WriteAheadLog) -> None:
    ids = [wal.append("m", *tagged(i)) for i in range(60)]
    assert len(set(ids)) == 60
    entries = list(wal.read_after("m", None))
    assert [e.id for e in entries] == ids
    assert tags(iter(entries)) == list(range(60))
    assert wal.last_id("m") == ids[-1]


def test_read_after_a_middle_id(wal: WriteAheadLog) -> None:
    ids = [wal.append("m", *tagged(i)) for i in range(20)]
    assert tags(wal.read_after("m", ids[11])) == list(range(12, 20))
    assert [e.id for e in wal.read_after("m", ids[0])] == ids[1:]
    assert list(wal.read_after("m", ids[-1])) == []


def test_unknown_model_is_empty(wal: WriteAheadLog) -> None:
    assert list(wal.read_after("nobody", None)) == []
    assert wal.last_id("nobody") is None
    assert wal.seen_key("nobody", "k") is None
    wal.trim_through("nobody", wal.append("other", *tagged(1)))  # a no-op, not an error


def test_models_are_separate(wal: WriteAheadLog) -> None:
    wal.append("a", *tagged(1))
    wal.append("b", *tagged(2), ["k"])
    wal.append("a", *tagged(3))
    assert tags(wal.read_after("a", None)) == [1, 3]
    assert tags(wal.read_after("b", None)) == [2]
    assert wal.seen_key("a", "k") is None


def test_trim_through_keeps_only_later_entries(wal: WriteAheadLog) -> None:
    ids = [wal.append("m", *tagged(i)) for i in range(10)]
    wal.trim_through("m", ids[3])
    assert tags(wal.read_after("m", None)) == list(range(4, 10))
    assert tags(wal.read_after("m", ids[3])) == list(range(4, 10))  # the snapshot's own id
    assert wal.last_id("m") == ids[-1]
    wal.trim_through("m", ids[1])  # older than the trim point: nothing changes
    assert tags(wal.read_after("m", None)) == list(range(4, 10))

    wal.trim_through("m", ids[-1])  # everything
    assert list(wal.read_after("m", None)) == []
    assert wal.last_id("m") == ids[-1]  # ids keep increasing after a full trim
    new_id = wal.append("m", *tagged(10))
    assert [e.id for e in wal.read_after("m", ids[-1])] == [new_id]
    assert wal.last_id("m") == new_id


def test_replay_from_before_the_trim_point_is_a_gap(wal: WriteAheadLog) -> None:
    ids = [wal.append("m", *tagged(i)) for i in range(5)]
    wal.trim_through("m", ids[2])
    with pytest.raises(WalGapError, match="trimmed"):
        wal.read_after("m", ids[1])
    assert issubclass(WalGapError, WalCorruptError)


def test_continue_after_makes_later_entries_follow_a_snapshots_id(backend: Backend) -> None:
    """A log behind the model's snapshot (a new or emptied log) numbers its next entries
    after the snapshot's, so a restore that replays after that id finds them; for Redis
    even an id ahead of its clock."""
    ahead = "1000" if backend.kind != "redis" else f"{int(time.time() * 1000) + 10**9}-0"
    wal = backend.make()
    early = [wal.append("m", *tagged(i)) for i in range(2)]
    wal.continue_after("m", ahead)
    assert wal.last_id("m") == ahead and wal.reaches("m", ahead)
    assert list(wal.read_after("m", ahead)) == []
    new_id = wal.append("m", *tagged(7), follows=ahead)
    wal.continue_after("m", early[0])  # the log reaches it already: nothing changes
    wal.close()
    reopened = backend.make()
    assert [(e.id, int(e.labels[0])) for e in reopened.read_after("m", ahead)] == [(new_id, 7)]
    assert tags(reopened.read_after("m", None)) == [7]  # the older entries count as trimmed
    with pytest.raises(WalGapError):
        reopened.read_after("m", early[1])
    assert reopened.last_id("m") == new_id
    reopened.close()


def test_log_survives_reopening(backend: Backend) -> None:
    first = backend.make()
    ids = [first.append("m", *tagged(i), [f"key-{i}"]) for i in range(6)]
    first.trim_through("m", ids[1])
    first.close()
    second = backend.make()
    assert tags(second.read_after("m", None)) == [2, 3, 4, 5]
    assert second.last_id("m") == ids[-1]
    assert second.seen_keys("m", ["key-0", "key-5", "nope", None]) == [ids[0], ids[5], None, None]
    new_id = second.append("m", *tagged(6))
    assert [e.id for e in second.read_after("m", ids[-1])] == [new_id]  # ids went on growing
    second.close()


def test_idempotency_keys_name_their_entry(wal: WriteAheadLog) -> None:
    first = wal.append("m", *tagged(1), ["req-a", None, "req-b"])
    assert wal.seen_key("m", "req-a") == first
    assert wal.seen_key("m", "req-b") == first
    assert wal.seen_key("m", "req-c") is None
    # A retry is recognised before it is appended (what the learn worker does) ...
    retry = ["req-c", "req-a"]
    seen = wal.seen_keys("m", retry)
    assert seen == [None, first]
    fresh = [k for k, s in zip(retry, seen, strict=True) if s is None]
    second = wal.append("m", *tagged(2), fresh)
    assert wal.seen_key("m", "req-c") == second
    # ... and a key appended again anyway keeps naming its first entry.
    wal.append("m", *tagged(3), ["req-a"])
    assert wal.seen_key("m", "req-a") == first
    # Keys outlive the entries they were logged with (the TTL decides, not the trim).
    wal.trim_through("m", second)
    assert wal.seen_keys("m", ["req-a", "req-c"]) == [first, second]


@pytest.mark.parametrize("rows, features", [(1, 20), (3, 5)])
def test_a_request_digest_is_the_one_logs_hold(rows: int, features: int) -> None:
    """Digests already in logs were taken over the shapes as JSON text, then the values:
    a retry after an upgrade must find the same digest, whatever dtype the rows come in."""
    X = np.arange(rows * features, dtype=np.float64).reshape(rows, features) / 7
    y = np.arange(rows) % 2
    logged = hashlib.blake2b(digest_size=16)
    logged.update(json.dumps([[rows, features], [rows]]).encode())
    logged.update(X.astype("<f4").tobytes())
    logged.update(y.astype("<i8").tobytes())
    assert request_digest(X, y) == logged.hexdigest()
    assert request_digest(X.astype(">f8"), y.astype(np.int32)) == logged.hexdigest()


def test_request_digests_are_kept_with_their_keys(backend: Backend) -> None:
    wal = backend.make()
    X, y = chunk(5)
    digests = [request_digest(X[:2], y[:2]), None, request_digest(X[2:], y[2:])]
    first = wal.append("m", X, y, ["a", None, "b"], [2, 1, 2], digests)
    second = wal.append("m", *tagged(1), ["c"])  # a key without a digest
    assert [e.request_digests for e in wal.read_after("m", None)] == [tuple(digests), ()]
    expected = [LoggedRequest(first, digests[0]), LoggedRequest(first, digests[2]),
                LoggedRequest(second, None), None]
    assert wal.logged_requests("m", ["a", "b", "c", "d"]) == expected
    wal.trim_through("m", second)  # keys and digests outlive their entries ...
    wal.close()
    reopened = backend.make()  # ... and a restart
    assert reopened.logged_requests("m", ["a", "b", "c", "d"]) == expected
    assert reopened.logged_requests("m", [None, "b"]) == [None, expected[1]]
    with pytest.raises(ValueError, match="2 items for 1 keys"):
        reopened.append("m", *tagged(2), ["e"], None, ["ab", "cd"])
    with pytest.raises(ValueError, match="lowercase hex"):
        reopened.append("m", *tagged(2), ["e"], None, ["not hex"])
    assert reopened.logged_requests("m", ["e"]) == [None]
    reopened.close()


def test_request_digest_tells_data_apart_but_not_dtypes() -> None:
    X, y = chunk(4)
    digest = request_digest(X, y)
    assert len(digest) == 32 and digest == request_digest(X.astype(">f8"), y.astype(np.int32))
    changed = X.copy()
    changed[3, 4] = np.nextafter(changed[3, 4], np.inf)
    other_labels = y.copy()
    other_labels[0] += 1
    others = {request_digest(changed, y), request_digest(X, other_labels),
              request_digest(X[:3], y[:3]), request_digest(X.reshape(2, 10), y[:2])}
    assert digest not in others and len(others) == 4


def test_idempotency_keys_expire(backend: Backend) -> None:
    wal = backend.make(idempotency_ttl_s=0.3)
    entry_id = wal.append("m", *tagged(1), ["k"])
    assert wal.seen_key("m", "k") == entry_id
    time.sleep(0.45)
    assert wal.seen_key("m", "k") is None
    assert wal.append("m", *tagged(2), ["k"]) != entry_id
    assert wal.seen_key("m", "k") not in (None, entry_id)
    wal.close()


def test_delete_removes_everything(wal: WriteAheadLog, backend: Backend) -> None:
    for i in range(5):
        wal.append("gone", *tagged(i), [f"k{i}"])
    wal.trim_through("gone", wal.last_id("gone"))
    wal.append("gone", *tagged(9), ["k9"])
    wal.append("kept", *tagged(1), ["k1"])
    wal.delete("gone")
    assert list(wal.read_after("gone", None)) == []
    assert wal.last_id("gone") is None and wal.seen_key("gone", "k9") is None
    assert not [t for t in backend.traces() if "gone" in t]
    assert tags(wal.read_after("kept", None)) == [1]

    wal.delete("kept")
    wal.delete("never-existed")  # a no-op, not an error
    assert backend.traces() == []
    assert tags(wal.read_after("gone", None)) == []
    wal.append("gone", *tagged(7))  # a fresh log
    assert tags(wal.read_after("gone", None)) == [7]


def test_large_chunk_round_trip(wal: WriteAheadLog) -> None:
    X = np.random.default_rng(1).random((10_000, 784), dtype=np.float32)
    y = np.arange(10_000, dtype=np.int64) % 10
    entry_id = wal.append("big", X, y)
    (entry,) = wal.read_after("big", None)
    assert entry.id == entry_id
    assert_same(entry, X, y)


def test_concurrent_appends_are_each_logged_once(wal: WriteAheadLog) -> None:
    threads, per_thread = 8, 25
    ids: list[list[str]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(per_thread):
                ids[t].append(wal.append("race", *tagged(t * 1000 + i, n=1 + i % 4)))
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=30)
    assert not errors, errors[0]
    entries = list(wal.read_after("race", None))
    seen = tags(iter(entries))
    assert sorted(seen) == sorted(t * 1000 + i for t in range(threads) for i in range(per_thread))
    for t in range(threads):  # each thread's appends in its own order
        assert [s for s in seen if s // 1000 == t] == [t * 1000 + i for i in range(per_thread)]
    by_id = {e.id: int(e.labels[0]) for e in entries}
    assert len(by_id) == threads * per_thread
    for t in range(threads):  # the id each append returned names that append's entry
        assert [by_id[i] for i in ids[t]] == [t * 1000 + i for i in range(per_thread)]


def test_bad_arguments_are_refused(wal: WriteAheadLog) -> None:
    X, y = chunk(3)
    bad = [
        (X[0], y),  # 1-D features
        (X.astype(np.int32), y),  # integer features
        (X, y.astype(np.float32)),  # float labels
        (X, y[:2]),  # row counts differ
        (X.tolist(), y),  # not an ndarray
    ]
    for features, labels in bad:
        with pytest.raises(ValueError):
            wal.append("m", features, labels)  # type: ignore[arg-type]
    for key in ["", "has space", "x" * 201, "é", 5]:
        with pytest.raises(ValueError, match="idempotency key"):
            wal.append("m", X, y, [key])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        wal.append("m", X, y, "one-key")  # type: ignore[arg-type]
    for name in [".", "..", "", "a/b", "a:b", "x" * 65]:
        with pytest.raises(ValueError):
            wal.append(name, X, y)
        with pytest.raises(ValueError):
            wal.read_after(name, None)
    with pytest.raises(ValueError, match="entry id"):
        wal.read_after("m", "not-an-id")
    assert list(wal.read_after("m", None)) == []  # nothing half-logged


def test_ping_true_for_working_log(wal: WriteAheadLog) -> None:
    assert wal.ping() is True


# -- files ----------------------------------------------------------------------------------------


def _log_file(root: Path) -> Path:
    """The first segment of the file log in ``root``, which holds every model's records."""
    return root / "wal~" / "00000001.wal"


def _torn(record: bytes, how: str) -> bytes:
    if how == "partial-frame":
        return record[:5]
    if how == "partial-payload":
        return record[: len(record) // 2]
    if how == "bad-crc-last":
        return record[:-1] + bytes([record[-1] ^ 0xFF])
    assert how == "zero-tail"
    return bytes(len(record))


@pytest.mark.parametrize("how", ["partial-frame", "partial-payload", "bad-crc-last", "zero-tail"])
def test_file_torn_tail_is_ignored_and_cut_off(
    tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    wal = FileWriteAheadLog(tmp_path)
    for i in range(3):
        wal.append("m", *tagged(i), [f"k{i}"])
    wal.close()
    path = _log_file(tmp_path)
    good = path.read_bytes()
    # What a fourth append cut short by a crash might leave behind: its write, torn.
    probe = FileWriteAheadLog(tmp_path / "probe")
    probe.append("m", *tagged(99))
    first_write = _log_file(tmp_path / "probe").stat().st_size
    probe.append("m", *tagged(99))
    last_record = _log_file(tmp_path / "probe").read_bytes()[first_write:]
    with open(path, "ab") as fh:
        fh.write(_torn(last_record, how))

    wal = FileWriteAheadLog(tmp_path)
    with caplog.at_level("WARNING", logger="service.storage.wal.file_log"):
        assert tags(wal.read_after("m", None)) == [0, 1, 2]
    torn = len(path.read_bytes()) - len(good)  # an operator is told what was cut off
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: its last {torn} bytes are not a whole write and are cut off (an append "
        "that a crash cut short was never acknowledged; anything else is damage to the disk)"]
    assert wal.last_id("m") == "3" and wal.seen_key("m", "k2") == "3"
    assert wal.append("m", *tagged(3)) == "4"
    wal.close()
    assert path.read_bytes().startswith(good)
    reopened = FileWriteAheadLog(tmp_path)
    assert tags(reopened.read_after("m", None)) == [0, 1, 2, 3]


def test_file_log_keeps_nothing_of_deleted_models(tmp_path: Path) -> None:
    """A server that creates and deletes models by ever new names must not hold each one's
    records and idempotency keys for the rest of its life."""
    wal = FileWriteAheadLog(tmp_path)
    wal.append("kept", *tagged(1), ["k"])
    for i in range(20):
        wal.append(f"m{i}", *tagged(i), [f"key{i}-0"])
        assert wal.seen_key(f"m{i}", f"key{i}-0") == "1"
        wal.delete(f"m{i}")
    assert list(wal._states) == ["kept"]  # what this process holds of the logs
    assert wal.seen_key("kept", "k") == "1"
    wal.append("m3", *tagged(3))  # a name used again starts afresh
    assert tags(wal.read_after("m3", None)) == [3] and wal.seen_key("m3", "key3-0") is None
    wal.close()


def test_file_keys_trimmed_before_digests_were_kept_still_count(tmp_path: Path) -> None:
    """A base record (of the older layout, carried in at opening) from before digests lists
    each key as [id, time]: still a known key."""
    (tmp_path / "m").mkdir()
    base = {"kind": "base", "v": 1, "last_id": 3, "trimmed_through": 3,
            "keys": {"old": [3, time.time()]}}
    (tmp_path / "m" / "wal.log").write_bytes(frame(base))
    wal = FileWriteAheadLog(tmp_path)
    assert wal.logged_requests("m", ["old"]) == [LoggedRequest("3", None)]
    assert wal.append("m", *tagged(4)) == "4"
    wal.close()


def test_file_corruption_in_the_middle_is_refused(tmp_path: Path) -> None:
    wal = FileWriteAheadLog(tmp_path)
    for i in range(3):
        wal.append("m", *tagged(i, n=50))
    wal.close()
    path = _log_file(tmp_path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # inside the second record's arrays
    path.write_bytes(bytes(data))

    wal = FileWriteAheadLog(tmp_path)
    with pytest.raises(WalCorruptError, match="damaged"):
        wal.read_after("m", None)
    with pytest.raises(WalCorruptError):
        wal.append("m", *tagged(3))
    assert path.read_bytes() == bytes(data)  # nothing was cut off or overwritten


def test_file_change_on_disk_after_opening_is_detected(tmp_path: Path) -> None:
    wal = FileWriteAheadLog(tmp_path)
    wal.append("m", *tagged(1, n=50))
    path = _log_file(tmp_path)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(WalCorruptError, match="changed on disk"):
        list(wal.read_after("m", None))


def test_file_log_shares_a_snapshot_dir(tmp_path: Path) -> None:
    """The log's directory beside the models' is no model's: the store neither lists it nor
    touches it, and the log leaves the models' directories alone."""
    from service.storage.store import DirectorySnapshotStore

    store = DirectorySnapshotStore(tmp_path)
    wal = FileWriteAheadLog(tmp_path, fsync=False)
    ids = [wal.append("m", *tagged(i)) for i in range(4)]
    store.save("m", b"weights", metadata={"wal_id": ids[1]})
    wal.trim_through("m", store.load("m")[1].metadata["wal_id"])
    files = sorted(p.name for p in (tmp_path / "m").iterdir() if p.name != ".lock")
    assert files == ["HEAD", "v1.head", "v1.snap"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "wal~"]
    assert store.names() == ["m"]
    store.save("m", b"weights 2")
    assert tags(wal.read_after("m", ids[1])) == [2, 3]
    wal.delete("m")  # the log goes, the snapshot stays
    assert store.load("m")[0] == b"weights 2"
    assert not (tmp_path / "wal~").exists()


def test_file_reader_survives_a_concurrent_trim(tmp_path: Path) -> None:
    wal = FileWriteAheadLog(tmp_path, fsync=False)
    ids = [wal.append("m", *tagged(i)) for i in range(5)]
    reader = wal.read_after("m", None)
    assert int(next(reader).labels[0]) == 0
    wal.trim_through("m", ids[3])
    assert tags(reader) == [1, 2, 3, 4]  # the snapshot of the log it started with


# -- Redis ----------------------------------------------------------------------------------------


def test_next_redis_id_for_xtrim_minid() -> None:
    assert _next_redis_id("1712-0") == "1712-1"
    assert _next_redis_id("5-41") == "5-42"
    assert _next_redis_id(f"5-{2**64 - 1}") == "6-0"
    with pytest.raises(ValueError):
        _next_redis_id("5")


def test_redis_layout_and_same_millisecond_trim(redis_url: str, redis_key_prefix: str) -> None:
    wal = RedisWriteAheadLog(redis_url, key_prefix=redis_key_prefix)
    client = redis.Redis.from_url(redis_url)
    ids = [wal.append("m", *tagged(i), ["k"]) for i in range(3)]
    digested = wal.append("m", *tagged(3), ["j"], None, ["00ff"])
    stream = f"{redis_key_prefix}:wal:m"
    assert client.type(stream) == b"stream" and client.xlen(stream) == 4
    assert client.get(f"{stream}:key:k") == ids[0].encode()
    assert client.get(f"{stream}:key:j") == f"{digested} 00ff".encode()
    assert 0 < client.pttl(f"{stream}:key:k") <= 24 * 3600 * 1000
    # Entries in the same millisecond differ only in the sequence part; trimming through the
    # first must keep the second.
    pipe = client.pipeline()
    for _ in range(2):
        pipe.xadd(stream, {b"filler": b""}, id=b"*")
    a, b = (i.decode() for i in pipe.execute())
    wal.trim_through("m", digested)
    assert [i.decode() for i, _ in client.xrange(stream)] == [a, b]


def test_redis_reads_in_pages(redis_url: str, redis_key_prefix: str) -> None:
    wal = RedisWriteAheadLog(redis_url, key_prefix=redis_key_prefix, read_page_entries=3)
    ids = [wal.append("m", *tagged(i)) for i in range(10)]
    assert tags(wal.read_after("m", None)) == list(range(10))
    assert tags(wal.read_after("m", ids[2])) == list(range(3, 10))
    assert [e.id for e in wal.read_after("m", ids[5])] == ids[6:]


def test_redis_foreign_entry_is_corruption(redis_url: str, redis_key_prefix: str) -> None:
    wal = RedisWriteAheadLog(redis_url, key_prefix=redis_key_prefix)
    wal.append("m", *tagged(1))
    redis.Redis.from_url(redis_url).xadd(f"{redis_key_prefix}:wal:m", {b"meta": b"{}"})
    with pytest.raises(WalCorruptError):
        list(wal.read_after("m", None))


def test_redis_ping_false_when_unreachable() -> None:
    wal = RedisWriteAheadLog(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=1)
    assert wal.ping() is False
    wal.close()


def test_redis_rejects_bad_arguments(redis_url: str) -> None:
    with pytest.raises(ValueError, match="durability"):
        RedisWriteAheadLog(redis_url, durability="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="key_prefix"):
        RedisWriteAheadLog(redis_url, key_prefix="")
    with pytest.raises(ValueError, match="idempotency_ttl_s"):
        RedisWriteAheadLog(redis_url, idempotency_ttl_s=0)


def _server_facts(url: str) -> tuple[tuple[int, ...], bool]:
    client = redis.Redis.from_url(url)
    try:
        version = client.info("server")["redis_version"]
        aof = bool(int(client.info("persistence")["aof_enabled"]))
    finally:
        client.close()
    return tuple(int(p) for p in str(version).split(".")[:3]), aof


def test_redis_waitaof_refused_with_a_clear_error(redis_url: str, redis_key_prefix: str) -> None:
    version, aof = _server_facts(redis_url)
    if version >= (7, 2) and aof:
        pytest.skip("this Redis supports WAITAOF; the refusal cannot be shown on it")
    wal = RedisWriteAheadLog(redis_url, key_prefix=redis_key_prefix, durability="waitaof")
    with pytest.raises(WalDurabilityError, match="waitaof") as caught:
        wal.append("m", *tagged(1))
    message = str(caught.value)
    if version < (7, 2):
        assert "Redis >= 7.2" in message
    if not aof:
        assert "appendonly yes" in message
    assert list(wal.read_after("m", None)) == []  # refused before anything was logged
    with pytest.raises(WalDurabilityError):
        wal.check_durability()


@pytest.mark.parametrize("appendonly", [False, True])
def test_the_default_durability_warns_where_redis_keeps_no_aof(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, appendonly: bool
) -> None:
    """Redis' own default is no AOF: the log then survives the service but not Redis, which
    the start-up check says (and starts all the same, as asked)."""
    try:
        server = RedisProcess(tmp_path, appendonly=appendonly)
    except FileNotFoundError as exc:
        pytest.skip(f"{exc}")
    with server, caplog.at_level(logging.WARNING, logger="service.storage.wal.redis_log"):
        wal = RedisWriteAheadLog(server.url)
        wal.check_durability()
        wal.close()
    assert ("'appendonly no'" in caplog.text) is not appendonly


def test_redis_always_refused_without_aof(redis_url: str, redis_key_prefix: str) -> None:
    if _server_facts(redis_url)[1]:
        pytest.skip("this Redis has AOF on")
    wal = RedisWriteAheadLog(redis_url, key_prefix=redis_key_prefix, durability="always")
    with pytest.raises(WalDurabilityError, match="appendonly yes"):
        wal.check_durability()


@pytest.fixture
def aof_redis(tmp_path: Path) -> Iterator[tuple[str, tuple[int, ...]]]:
    """A private server with ``appendonly yes`` and ``appendfsync always``: one that has
    WAITAOF where there is one (``find_waitaof_server``), else the usual redis-server."""
    try:
        server = RedisProcess(tmp_path, appendfsync="always", binary=_newest_server())
    except FileNotFoundError as exc:
        pytest.skip(f"{exc}")
    with server:
        yield server.url, _server_facts(server.url)[0]


def _newest_server() -> str | None:
    """A server with WAITAOF if one is installed; None: RedisProcess's own choice."""
    try:
        return find_waitaof_server()
    except FileNotFoundError:
        return None


def test_redis_always_with_aof_fsync_always(aof_redis: tuple[str, tuple[int, ...]]) -> None:
    url, _ = aof_redis
    wal = RedisWriteAheadLog(url, durability="always")
    wal.check_durability()
    entry_id = wal.append("m", *tagged(1))
    assert [e.id for e in wal.read_after("m", None)] == [entry_id]
    wal.close()


def test_redis_waitaof_confirms_the_fsync(aof_redis: tuple[str, tuple[int, ...]]) -> None:
    url, version = aof_redis
    if version < (7, 2):
        pytest.skip(f"WAITAOF needs Redis >= 7.2; the local redis-server is {version}")
    wal = RedisWriteAheadLog(url, durability="waitaof")
    entry_id = wal.append("m", *tagged(1), ["k"])
    assert wal.seen_key("m", "k") == entry_id
    wal.close()


@pytest.mark.parametrize(("appendfsync", "warned"), [("everysec", True), ("always", False)])
def test_waitaof_warns_where_each_append_waits_for_redis_cron(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, appendfsync: str, warned: bool
) -> None:
    """A primary without replicas at Redis' default hz 10 runs the fsync a WAITAOF waits for on
    its cron ticks (about 100 ms an append): the start-up check measures that and says so. With
    ``appendfsync always`` every write is fsynced at once, and it says nothing."""
    try:
        server = RedisProcess(tmp_path, appendfsync=appendfsync, extra_args=("--hz", "10"),
                              binary=_newest_server())
    except FileNotFoundError as exc:
        pytest.skip(f"{exc}")
    with server:
        version = _server_facts(server.url)[0]
        if version < (7, 2):
            pytest.skip(f"WAITAOF needs Redis >= 7.2; the local redis-server is {version}")
        wal = RedisWriteAheadLog(server.url, durability="waitaof")
        with caplog.at_level(logging.WARNING, logger="service.storage.wal.redis_log"):
            wal.check_durability()
        wal.close()
    assert ("a WAITAOF here took" in caplog.text and "CONFIG SET hz" in caplog.text) is warned


def test_replicas_are_checked_before_anything_is_logged(
    redis_url: str, redis_key_prefix: str, tmp_path: Path
) -> None:
    """``replicas`` needs the Redis log, and a primary with fewer replicas connected than asked
    for is refused at the check, naming how many it has."""
    with pytest.raises(ValueError, match="int >= 0"):
        RedisWriteAheadLog(redis_url, replicas=-1)
    with pytest.raises(ValueError, match="redis_url"):
        open_wal(None, str(tmp_path), replicas=1)
    with pytest.raises(ValueError, match="GLN_WAL_REPLICAS needs the Redis log"):
        Settings(wal_replicas=1)  # pydantic's ValidationError is a ValueError
    client = redis.Redis.from_url(redis_url)
    connected = int(client.info("replication")["connected_slaves"])
    client.close()
    wanted = connected + 1
    wal = RedisWriteAheadLog(redis_url, key_prefix=redis_key_prefix, replicas=wanted)
    with pytest.raises(WalDurabilityError,
                       match=f"needs {wanted} replica.s. connected, the server has {connected}"):
        wal.append("m", *tagged(1))
    assert list(wal.read_after("m", None)) == []
    wal.close()


def test_an_append_is_acknowledged_once_the_replicas_have_it(
    replicated: tuple[RedisProcess, RedisProcess],
) -> None:
    """With ``replicas=1`` an append returns only once the replica has it (so the replica
    alone can replay it, keys included), and fails, naming the replicas, once none answers;
    ``wait_durable`` then says that what the log holds is not on a replica."""
    primary, replica = replicated
    wal = RedisWriteAheadLog(primary.url, replicas=1, replica_timeout_s=0.5)
    wal.check_durability()
    first = wal.append("m", *tagged(1), ["k"])
    on_replica = RedisWriteAheadLog(replica.url)
    assert [e.id for e in on_replica.read_after("m", None)] == [first]
    assert on_replica.seen_key("m", "k") == first
    on_replica.close()
    wal.wait_durable()
    replica.kill()  # the replica's machine is lost
    with pytest.raises(WalDurabilityError, match="reached 0 of the 1 replica"):
        wal.append("m", *tagged(2))
    with pytest.raises(WalDurabilityError, match="what the log holds reached 0 of the 1"):
        wal.wait_durable()  # the entry above is in the primary's log alone
    wal.close()


def test_an_append_whose_connection_drops_is_not_sent_again(
    replicated: tuple[RedisProcess, RedisProcess],
) -> None:
    """An append is sent once. Its connection is cut after Redis ran it, while the append
    waits for the replica: the append fails, and the log holds the entry once. (A client
    library that re-sent the command on a new connection would log it twice, and the model,
    catching up with its log after the failure, would learn it twice.)"""
    primary, replica = replicated
    wal = RedisWriteAheadLog(primary.url, key_prefix="cut", replicas=1, replica_timeout_s=5)
    wal.check_durability()
    replica.kill()  # WAIT now holds the append's connection for up to 5 s
    admin = redis.Redis.from_url(primary.url)

    killed = []

    def cut_the_log_connection() -> None:
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            if any(c["cmd"] == "wait" for c in admin.client_list()):  # the append waits
                killed.append(admin.client_kill_filter(_type="normal", skipme=True))
                return
            time.sleep(0.01)

    cutter = threading.Thread(target=cut_the_log_connection)
    cutter.start()
    with pytest.raises(redis.ConnectionError):
        wal.append("m", *tagged(1), ["k"])
    cutter.join()
    assert killed == [1]
    assert len(list(wal.read_after("m", None))) == 1
    assert admin.xlen("cut:wal:m") == 1
    admin.close()
    wal.close()


# -- open_wal -------------------------------------------------------------------------------------


def test_open_wal_picks_by_redis_url(tmp_path: Path, redis_url: str) -> None:
    assert isinstance(open_wal(None, str(tmp_path)), FileWriteAheadLog)
    files = open_wal("", str(tmp_path), fsync=False, idempotency_ttl_s=5)
    assert isinstance(files, FileWriteAheadLog) and not files.fsync
    assert files.idempotency_ttl_s == 5
    in_redis = open_wal(redis_url, str(tmp_path / "unused"), key_prefix="p", durability="always")
    assert isinstance(in_redis, RedisWriteAheadLog)
    assert (in_redis.key_prefix, in_redis.durability) == ("p", "always")
    in_redis.close()
    assert not (tmp_path / "unused").exists()
    assert os.listdir(tmp_path) == []


def test_check_durability_passes_for_the_defaults(wal: WriteAheadLog) -> None:
    wal.check_durability()  # everysec / fsync: nothing the server could refuse


@pytest.mark.parametrize("change", [("appendfsync", "everysec"), ("appendonly", "no")])
def test_redis_always_is_enforced_on_every_append(
    aof_redis: tuple[str, tuple[int, ...]], change: tuple[str, str]
) -> None:
    """A Redis that stops fsyncing every write under a running log (``CONFIG SET``) fails the
    next append with WalDurabilityError (the entry is logged, not acknowledged), not only the
    start-up check; back to 'always', appends are confirmed again."""
    url, _ = aof_redis
    wal = RedisWriteAheadLog(url, durability="always")
    wal.check_durability()
    wal.append("m", *tagged(1))
    admin = redis.Redis.from_url(url)
    admin.config_set(*change)
    with pytest.raises(WalDurabilityError, match="not fsynced"):
        wal.append("m", *tagged(2))
    admin.config_set("appendonly", "yes")
    admin.config_set("appendfsync", "always")
    wal.append("m", *tagged(3))
    assert len(list(wal.read_after("m", None))) == 3  # the refused entry is logged all the same
    # AOF back on rewrites the file in the background; a SHUTDOWN meanwhile waits 10 s for it.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(
            admin.info("persistence")[key] for key in
            ("aof_rewrite_in_progress", "aof_rewrite_scheduled")):
        time.sleep(0.02)
    admin.close()
    wal.close()


# -- NATS -----------------------------------------------------------------------------------------


def test_a_nats_url_names_its_servers_or_says_what_is_wrong() -> None:
    assert parse_nats_url("nats://u:p%40ss@h1:4222,h2,[::1]:4223") == [
        "nats://u:p%40ss@h1:4222", "nats://u:p%40ss@h2", "nats://u:p%40ss@[::1]:4223"]
    assert parse_nats_url("tls://h1/") == ["tls://h1"]
    for url, message in [("h1:4222", "looks like nats://"), ("redis://h1", "starts nats://"),
                         ("nats://", "names servers only"), ("nats://h1/gln", "servers only"),
                         ("nats://h1,", "host or host:port"), ("nats://h1:port", "host:port"),
                         ("nats://h1:70000", "host:port")]:
        with pytest.raises(ValueError, match=message):
            parse_nats_url(url)
        with pytest.raises(ValueError, match=message):
            Settings(wal_url=url)


def test_the_nats_log_settings_are_refused_where_they_mean_nothing() -> None:
    with pytest.raises(ValueError, match="GLN_WAL_STREAM_REPLICAS needs the NATS log"):
        Settings(wal_stream_replicas=3)
    with pytest.raises(ValueError, match="GLN_WAL_DURABILITY set the Redis log"):
        Settings(wal_url="nats://h1", wal_durability="everysec")
    with pytest.raises(ValueError, match="GLN_REDIS_KEY_PREFIX names the NATS log's streams"):
        Settings(wal_url="nats://h1", redis_key_prefix="a:b")
    summary = Settings(wal_url="nats://app:secret@h1,h2", wal_stream_replicas=3).summary()
    assert "write-ahead log: NATS JetStream nats://app:***@h1,h2" in summary
    assert "stream replicas 3" in summary and "secret" not in summary


def test_open_wal_picks_nats_by_wal_url(nats_url: str, nats_prefix: str, tmp_path: Path) -> None:
    wal = open_wal("redis://unused", str(tmp_path), wal_url=nats_url, key_prefix=nats_prefix,
                   idempotency_ttl_s=60, call_timeout_s=3)
    assert isinstance(wal, NatsWriteAheadLog)
    assert (wal.idempotency_ttl_s, wal.call_timeout_s) == (60, 3)
    wal.close()
    with pytest.raises(ValueError, match="replicas needs the Redis log"):
        open_wal(None, str(tmp_path), wal_url=nats_url, replicas=1)
    with pytest.raises(ValueError, match="stream_replicas needs the NATS log"):
        open_wal(None, str(tmp_path), stream_replicas=3)
    with pytest.raises(ValueError, match="key_prefix of a NATS log"):
        NatsWriteAheadLog(nats_url, key_prefix="a.b")
    assert os.listdir(tmp_path) == []


def test_nats_subjects_take_dotted_model_names_and_any_key(
    nats_url: str, nats_prefix: str
) -> None:
    """A dot splits a subject, and a key may hold '.', '*' or '>': both are encoded."""
    wal = NatsWriteAheadLog(nats_url, key_prefix=nats_prefix)
    keys = ["a.b", "*", ">", "x" * 200, "~!"]
    dotted = wal.append("v1.2", *tagged(1), keys)
    plain = wal.append("v1-2", *tagged(2), ["a.b"])
    assert wal.seen_keys("v1.2", keys) == [dotted] * len(keys)
    assert wal.seen_keys("v1-2", ["a.b", "*"]) == [plain, None]
    assert tags(wal.read_after("v1.2", None)) == [1]
    wal.delete("v1.2")
    assert wal.seen_key("v1-2", "a.b") == plain and tags(wal.read_after("v1-2", None)) == [2]
    wal.close()


def test_nats_keys_missing_behind_the_last_entry_are_written_by_reading_it(
    nats_url: str, nats_prefix: str
) -> None:
    """An entry and its keys are two writes: an append cut short between them leaves the entry
    without its keys, and reading the log to its end (a catch-up, a restore) writes them
    before it gives the entry."""
    import asyncio

    import nats

    wal = NatsWriteAheadLog(nats_url, key_prefix=nats_prefix)
    X, y = chunk(3)
    digests = [request_digest(X[:1], y[:1]), request_digest(X[1:], y[1:])]
    entry_id = wal.append("m", X, y, ["a", "b"], [1, 2], digests)

    async def lose_the_keys() -> None:
        nc = await nats.connect(nats_url)
        await nc.jetstream().purge_stream(f"{nats_prefix}-wal-keys")
        await nc.close()

    asyncio.run(lose_the_keys())
    assert wal.logged_requests("m", ["a", "b"]) == [None, None]
    reader = wal.read_after("m", None)
    assert next(reader).id == entry_id
    # Written before the entry was given: a model applies it only with its keys known.
    assert wal.logged_requests("m", ["a", "b"]) == [LoggedRequest(entry_id, digests[0]),
                                                     LoggedRequest(entry_id, digests[1])]
    assert list(reader) == []
    wal.close()


def test_a_foreign_message_on_a_nats_model_subject_is_corruption(
    nats_url: str, nats_prefix: str
) -> None:
    import asyncio

    import nats

    wal = NatsWriteAheadLog(nats_url, key_prefix=nats_prefix)
    wal.append("m", *tagged(1))

    async def publish_garbage() -> None:
        nc = await nats.connect(nats_url)
        await nc.jetstream().publish(f"{nats_prefix}.wal.m", b"not an entry")
        await nc.close()

    asyncio.run(publish_garbage())
    with pytest.raises(WalCorruptError):
        list(wal.read_after("m", None))
    wal.close()


def test_nats_replicas_beyond_the_servers_are_refused_before_anything_is_logged(
    nats_url: str, nats_prefix: str
) -> None:
    wal = NatsWriteAheadLog(nats_url, key_prefix=nats_prefix, replicas=3)
    with pytest.raises(WalDurabilityError, match="cluster of at least 3 servers"):
        wal.check_durability()
    with pytest.raises(WalDurabilityError):
        wal.append("m", *tagged(1))
    wal.close()
    alone = NatsWriteAheadLog(nats_url, key_prefix=nats_prefix)  # alone: one replica
    assert list(alone.read_after("m", None)) == []
    alone.close()
    with pytest.raises(ValueError, match="replicas must be an int from 1 to 5"):
        NatsWriteAheadLog(nats_url, replicas=0)


def test_nats_entry_larger_than_max_payload_is_refused_and_warned_of(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    try:
        server = NatsProcess(tmp_path, max_payload="1MB")
    except FileNotFoundError as exc:
        pytest.skip(f"{exc}")
    with server, NatsWriteAheadLog(server.url) as wal:
        with caplog.at_level(logging.WARNING, logger="service.storage.wal.nats_log"):
            wal.check_durability()
        assert "max_payload: 64MB" in caplog.text
        X = np.zeros((1000, 300), np.float32)  # 1.2 MB
        with pytest.raises(ValueError, match="larger than the NATS server's max_payload"):
            wal.append("m", X, np.zeros(1000, np.int64))
        small = wal.append("m", X[:10], np.zeros(10, np.int64))
        assert [e.id for e in wal.read_after("m", None)] == [small]


def test_a_hung_nats_server_fails_calls_in_time_not_forever(tmp_path: Path) -> None:
    """A server stopped with SIGSTOP answers nothing: each call fails after call_timeout_s
    (the append is in doubt: it may land once the server resumes), ping says False, and once
    it resumes the log works again."""
    try:
        server = NatsProcess(tmp_path)
    except FileNotFoundError as exc:
        pytest.skip(f"{exc}")
    with server, NatsWriteAheadLog(server.url, call_timeout_s=0.5) as wal:
        first = wal.append("m", *tagged(1))
        server.pause()
        try:
            t0 = time.monotonic()
            with pytest.raises(WalTimeoutError, match="did not answer within 0.5 s"):
                wal.append("m", *tagged(2))
            assert time.monotonic() - t0 < 2
            assert wal.ping() is False
        finally:
            server.resume()
        third = wal.append("m", *tagged(3))
        entries = list(wal.read_after("m", None))
        assert (entries[0].id, entries[-1].id) == (first, third) and len(entries) in (2, 3)
        assert wal.ping() is True


def test_an_unreachable_nats_log_fails_calls_in_time() -> None:
    wal = NatsWriteAheadLog(f"nats://127.0.0.1:{free_port()}", call_timeout_s=0.5)
    t0 = time.monotonic()
    assert wal.ping() is False
    with pytest.raises(WalTimeoutError):
        wal.append("m", *tagged(1))
    assert time.monotonic() - t0 < 3
    wal.close()
