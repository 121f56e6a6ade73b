"""Contract tests for the snapshot stores, run against a real Redis and a real directory.

Every test in the first part runs once per store (``backend`` is parametrised); a small
``Backend`` helper per store knows how to look underneath it (list keys or files, tamper with
stored bytes) so the tests can check what a user relies on: the current snapshot is always
complete and checksum-valid, and nothing is left behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.storage.store import (
    DirectorySnapshotStore,
    RedisSnapshotStore,
    SnapshotCorruptError,
    SnapshotInfo,
    SnapshotStore,
    open_store,
)
from service.storage.store.loading import LOAD_ATTEMPTS, load_current
from tests.support.redis_process import free_port

CHUNK = 64  # tiny chunks, so even small blobs span several Redis keys


class Backend:
    """A store under test plus ways to inspect what it keeps underneath."""

    kind: str

    def make(self, chunk_bytes: int = CHUNK, keep: int = 1) -> SnapshotStore:
        """A store over this backend; ``keep=1`` (one version, as the contract tests assume)
        unless a test is about the versions kept."""
        raise NotImplementedError

    def traces(self) -> list[str]:
        """Every key or file the store keeps (for 'nothing left behind' checks)."""
        raise NotImplementedError

    def snapshot_parts(self, name: str) -> list[str]:
        """The keys or files holding the bytes of ``name``'s snapshots (any version)."""
        raise NotImplementedError

    def tamper(self, name: str) -> None:
        """Flip one byte of ``name``'s current stored bytes, keeping the length."""
        raise NotImplementedError


class RedisBackend(Backend):
    kind = "redis"

    def __init__(self, url: str, prefix: str) -> None:
        self.url, self.prefix = url, prefix
        self.client = redis.Redis.from_url(url)

    def make(self, chunk_bytes: int = CHUNK, keep: int = 1) -> SnapshotStore:
        return RedisSnapshotStore(self.url, key_prefix=self.prefix, chunk_bytes=chunk_bytes,
                                  keep=keep)

    def traces(self) -> list[str]:
        return sorted(k.decode() for k in self.client.scan_iter(match=f"{self.prefix}*"))

    def snapshot_parts(self, name: str) -> list[str]:
        pattern = f"{self.prefix}:model:{name}:v*:chunk:*"
        return sorted(k.decode() for k in self.client.scan_iter(match=pattern))

    def tamper(self, name: str) -> None:
        version = int(self.client.hget(f"{self.prefix}:model:{name}:head", "version"))
        key = f"{self.prefix}:model:{name}:v{version}:chunk:0"
        chunk = bytearray(self.client.get(key))
        chunk[0] ^= 0xFF
        self.client.set(key, bytes(chunk))


class DirectoryBackend(Backend):
    kind = "dir"

    def __init__(self, root: Path) -> None:
        self.root = root

    def make(self, chunk_bytes: int = CHUNK, keep: int = 1) -> SnapshotStore:
        return DirectorySnapshotStore(self.root, keep=keep)

    def traces(self) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*"))

    def snapshot_parts(self, name: str) -> list[str]:
        return sorted(p.name for p in (self.root / name).glob("*.snap"))

    def tamper(self, name: str) -> None:
        version = json.loads((self.root / name / "HEAD").read_bytes())["version"]
        path = self.root / name / f"v{version}.snap"
        data = bytearray(path.read_bytes())
        data[0] ^= 0xFF
        path.write_bytes(bytes(data))


@pytest.fixture(params=["redis", "dir"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """One Backend per store kind; Redis keys live under a per-test prefix."""
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        prefix = request.getfixturevalue("redis_key_prefix")
        yield RedisBackend(url, prefix)
    else:
        yield DirectoryBackend(tmp_path / "snapshots")


@pytest.fixture
def store(backend: Backend) -> Iterator[SnapshotStore]:
    s = backend.make()
    yield s
    s.close()


def _sha(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


# -- the contract, for both stores ---------------------------------------------------------


def test_round_trip(store: SnapshotStore) -> None:
    blob = os.urandom(1000)
    before = time.time()
    info = store.save("model-a", blob, metadata={"wal_id": "1712-0"})
    assert isinstance(store, SnapshotStore)
    assert info.version == 1
    assert info.nbytes == len(blob)
    assert info.sha256 == _sha(blob)
    assert before - 1 <= info.created_at <= time.time() + 1
    assert info.metadata == {"wal_id": "1712-0"}

    loaded = store.load("model-a")
    assert loaded is not None
    got, got_info = loaded
    assert got == blob and isinstance(got, bytes)
    assert got_info == info


def test_save_accepts_bytearray_and_memoryview(store: SnapshotStore) -> None:
    store.save("m", bytearray(b"abc" * 50))
    assert store.load("m")[0] == b"abc" * 50
    store.save("m", memoryview(b"xyz" * 50))
    assert store.load("m")[0] == b"xyz" * 50


def test_versions_increase_and_load_returns_latest(store: SnapshotStore) -> None:
    versions = [store.save("m", f"blob {i}".encode() * 20).version for i in range(4)]
    assert versions == [1, 2, 3, 4]
    blob, info = store.load("m")
    assert blob == b"blob 3" * 20 and info.version == 4
    assert info.metadata == {}


def test_versions_older_than_the_kept_ones_are_removed_after_save(backend: Backend) -> None:
    store = backend.make(keep=3)
    store.save("m", os.urandom(500))
    first_parts = backend.snapshot_parts("m")
    for size in (500, 300, 200):
        store.save("m", os.urandom(size))
    parts = backend.snapshot_parts("m")
    if backend.kind == "redis":
        assert len(first_parts) == 8  # ceil(500 / 64)
        assert parts == sorted(f"{backend.prefix}:model:m:v{v}:chunk:{i}"
                               for v, n in ((2, 8), (3, 5), (4, 4)) for i in range(n))
    else:
        assert parts == ["v2.snap", "v3.snap", "v4.snap"]
    assert [info.version for info in store.kept("m")] == [2, 3, 4]  # keep=3, oldest first


def test_a_damaged_newest_version_falls_back_to_the_newest_whole_one(backend: Backend) -> None:
    """GLN_SNAPSHOT_KEEP: the current version damaged, load returns the newest older version
    that is whole, saying what was damaged; with every kept version damaged, it raises."""
    store = backend.make(keep=3)
    blobs = [os.urandom(300) for _ in range(3)]
    for version, blob in enumerate(blobs, 1):
        store.save("m", blob, metadata={"wal_id": str(version)})
    backend.tamper("m")
    blob, info = store.load("m")
    assert (blob, info.version, info.metadata) == (blobs[1], 2, {"wal_id": "2"})
    assert "v3" in info.damage
    store.save("one", b"only version")
    backend.tamper("one")
    with pytest.raises(SnapshotCorruptError):
        store.load("one")


def test_delete_removes_everything(store: SnapshotStore, backend: Backend) -> None:
    store.save("gone", os.urandom(700), metadata={"k": "v"})
    store.save("gone", os.urandom(700))
    store.save("kept", b"keep me")
    store.delete("gone")
    assert store.load("gone") is None
    assert store.names() == ["kept"]
    assert not [t for t in backend.traces() if "gone" in t]

    store.delete("kept")
    store.delete("never-existed")  # a no-op, not an error
    assert backend.traces() == []  # no keys under the prefix / no files in the directory
    assert store.save("gone", b"again").version == 1  # the counter went too


def test_names(store: SnapshotStore) -> None:
    assert store.names() == []
    for name in ["zeta", "alpha", "m.v2_x-1"]:
        store.save(name, b"x")
    store.save("alpha", b"y")
    assert store.names() == ["alpha", "m.v2_x-1", "zeta"]


def test_load_unknown_is_none(store: SnapshotStore) -> None:
    assert store.load("nobody") is None


def test_tampered_bytes_are_detected(store: SnapshotStore, backend: Backend) -> None:
    store.save("m", os.urandom(400))
    backend.tamper("m")
    with pytest.raises(SnapshotCorruptError, match="sha256"):
        store.load("m")
    assert issubclass(SnapshotCorruptError, ValueError)


def test_a_head_missing_a_field_is_corruption(store: SnapshotStore, backend: Backend) -> None:
    """Both stores read their heads through one parser: a field gone is named corruption. The
    current head damaged, the version's own head still reads it (saying what was damaged);
    both damaged, the load raises."""
    store.save("m", b"payload", {"k": "v"})
    own = ("m:v1:head" if isinstance(backend, RedisBackend) else "v1.head")
    for head in ("head", own):
        if isinstance(backend, RedisBackend):
            backend.client.hdel(f"{backend.prefix}:model:{'m:head' if head == 'head' else own}",
                                "sha256")
        else:
            head_file = backend.root / "m" / ("HEAD" if head == "head" else own)
            fields = json.loads(head_file.read_text())
            del fields["sha256"]
            head_file.write_text(json.dumps(fields))
        if head == "head":
            blob, info = store.load("m")
            assert blob == b"payload" and "is unreadable" in info.damage
    with pytest.raises(SnapshotCorruptError, match="is unreadable"):
        store.load("m")


def test_blob_spanning_many_chunks(backend: Backend) -> None:
    store = backend.make(chunk_bytes=1000)
    blob = os.urandom(10_500)
    info = store.save("big", blob)
    assert store.load("big") == (blob, info)
    if backend.kind == "redis":
        assert len(backend.snapshot_parts("big")) == 11
    # a chunk size that divides the blob exactly
    blob = os.urandom(3000)
    store.save("big", blob)
    assert store.load("big")[0] == blob
    if backend.kind == "redis":
        assert len(backend.snapshot_parts("big")) == 3
    store.close()


def test_empty_blob(store: SnapshotStore) -> None:
    info = store.save("empty", b"")
    assert info.nbytes == 0 and info.sha256 == _sha(b"")
    assert store.load("empty") == (b"", info)
    assert store.names() == ["empty"]


def test_unsafe_names_are_refused(store: SnapshotStore) -> None:
    for bad in [".", "..", "", "a/b", "../x", "a:b", "x" * 65, "spa ce", "é"]:
        with pytest.raises(ValueError):
            store.save(bad, b"x")
        with pytest.raises(ValueError):
            store.load(bad)
        with pytest.raises(ValueError):
            store.delete(bad)


def test_metadata_must_be_strings(store: SnapshotStore) -> None:
    with pytest.raises(ValueError, match="metadata"):
        store.save("m", b"x", metadata={"offset": 3})  # type: ignore[dict-item]
    assert store.load("m") is None


def test_ping_true_for_working_store(store: SnapshotStore) -> None:
    assert store.ping() is True


def test_reader_sees_only_complete_versions_during_saves(backend: Backend) -> None:
    """Two writers and three readers race; every load is a whole, checksum-valid version."""
    store = backend.make(chunk_bytes=CHUNK)
    saves_per_writer = 40
    stop = threading.Event()
    errors: list[BaseException] = []
    loads = [0]

    def blob_for(writer: int, i: int) -> bytes:
        # Self-describing: the tag repeated; sizes vary so chunk counts differ by version.
        tag = f"<w{writer}:{i}>".encode()
        return tag * (20 + (i * 7) % 50)

    def write(writer: int) -> None:
        try:
            for i in range(saves_per_writer):
                store.save("race", blob_for(writer, i), metadata={"i": str(i)})
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    def read() -> None:
        last_version = 0
        try:
            while not stop.is_set():
                loaded = store.load("race")
                if loaded is None:
                    continue
                blob, info = loaded
                assert info.version >= last_version, "head went backwards"
                last_version = info.version
                assert len(blob) == info.nbytes and _sha(blob) == info.sha256
                tag = blob[: blob.index(b">") + 1]
                assert blob == tag * (len(blob) // len(tag))
                loads[0] += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    readers = [threading.Thread(target=read) for _ in range(3)]
    writers = [threading.Thread(target=write, args=(w,)) for w in range(2)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join(timeout=30)
    stop.set()
    for t in readers:
        t.join(timeout=30)
    assert not errors, errors[0]
    assert loads[0] > 0

    blob, info = store.load("race")
    assert info.version == 2 * saves_per_writer  # the highest version always wins
    if backend.kind == "redis":
        expected = -(-len(blob) // CHUNK)
        assert len(backend.snapshot_parts("race")) == expected
    else:
        assert backend.snapshot_parts("race") == [f"v{info.version}.snap"]
    store.close()


# -- the load both stores share ------------------------------------------------------------


def _load_over(
    heads: list[int | None], kept: dict[int, bytes]
) -> tuple[bytes, SnapshotInfo] | None:
    """``load_current`` where the head's reads give ``heads`` in turn (a version each, None for
    no snapshot), version ``v`` was saved as ``b"v<v>"``, and only ``kept`` is still stored."""
    reads = iter(heads)

    def parse_head(version: int) -> tuple[SnapshotInfo, int]:
        saved = f"v{version}".encode()
        return SnapshotInfo(version, 0.0, len(saved), _sha(saved)), version

    def read_blob(info: SnapshotInfo, version: int) -> bytes:
        if version not in kept:
            raise SnapshotCorruptError(f"v{version} is gone")
        return kept[version]

    return load_current("m", lambda: next(reads), parse_head, read_blob)


def test_load_without_a_head_is_none() -> None:
    assert _load_over([None], {}) is None


def test_load_starts_over_when_a_save_switched_the_head() -> None:
    """v1 was pruned by the save that made v2 current: the load reads v2 instead."""
    blob, info = _load_over([1, 2, 2], {2: b"v2"})
    assert (blob, info.version) == (b"v2", 2)


def test_load_raises_what_failed_while_the_head_stayed() -> None:
    with pytest.raises(SnapshotCorruptError, match="v1 is gone"):
        _load_over([1, 1], {})
    with pytest.raises(SnapshotCorruptError, match="sha256"):
        _load_over([1, 1], {1: b"v!"})


def test_load_gives_up_on_a_head_that_keeps_changing() -> None:
    heads = list(range(1, 2 * LOAD_ATTEMPTS + 1))
    with pytest.raises(
        SnapshotCorruptError,
        match=rf"snapshot of 'm' kept changing while being read \({LOAD_ATTEMPTS} attempts\)",
    ):
        _load_over(heads, {})


# -- Redis specifics -----------------------------------------------------------------------


def test_redis_ping_false_when_unreachable() -> None:
    store = RedisSnapshotStore(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=1)
    started = time.monotonic()
    assert store.ping() is False
    assert time.monotonic() - started < 5
    store.close()


def test_redis_missing_chunk_is_corruption(redis_url: str, redis_key_prefix: str) -> None:
    store = RedisSnapshotStore(redis_url, key_prefix=redis_key_prefix, chunk_bytes=10)
    store.save("m", os.urandom(95))
    redis.Redis.from_url(redis_url).delete(f"{redis_key_prefix}:model:m:v1:chunk:4")
    with pytest.raises(SnapshotCorruptError, match="chunk 4 of 10 missing"):
        store.load("m")


def test_redis_key_prefixes_are_isolated(redis_url: str, redis_key_prefix: str) -> None:
    a = RedisSnapshotStore(redis_url, key_prefix=f"{redis_key_prefix}-a")
    b = RedisSnapshotStore(redis_url, key_prefix=f"{redis_key_prefix}-b")
    a.save("m", b"from a")
    assert b.names() == [] and b.load("m") is None
    assert a.load("m")[0] == b"from a"


def test_redis_rejects_bad_arguments(redis_url: str) -> None:
    with pytest.raises(ValueError, match="chunk_bytes"):
        RedisSnapshotStore(redis_url, chunk_bytes=0)
    with pytest.raises(ValueError, match="key_prefix"):
        RedisSnapshotStore(redis_url, key_prefix="")


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(blob=st.binary(max_size=300), chunk_bytes=st.integers(min_value=1, max_value=80))
def test_redis_round_trip_any_chunking(
    redis_url: str, redis_key_prefix: str, blob: bytes, chunk_bytes: int
) -> None:
    prefix = f"{redis_key_prefix}:{uuid.uuid4().hex}"
    with RedisSnapshotStore(redis_url, key_prefix=prefix, chunk_bytes=chunk_bytes) as store:
        info = store.save("h", blob)
        assert store.load("h") == (blob, info)
        store.delete("h")
    # the fixture removes leftovers; delete should already have left none
    assert not list(redis.Redis.from_url(redis_url).scan_iter(match=f"{prefix}*"))


# -- directory specifics -------------------------------------------------------------------


def test_directory_ping_false_when_directory_gone(tmp_path: Path) -> None:
    root = tmp_path / "snaps"
    store = DirectorySnapshotStore(root)
    assert store.ping() is True
    root.rmdir()
    assert store.ping() is False


def test_directory_layout_and_leftover_temp_files(tmp_path: Path) -> None:
    store = DirectorySnapshotStore(tmp_path)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / ".tmp-crashed-v9.snap").write_bytes(b"half")
    info = store.save("m", b"payload", metadata={"a": "b"})
    files = sorted(p.name for p in (tmp_path / "m").iterdir() if p.name != ".lock")
    assert files == ["HEAD", "v1.head", "v1.snap"]
    assert (tmp_path / "m" / "v1.snap").read_bytes() == b"payload"
    assert info.version == 1


def test_a_save_that_fails_midway_leaves_the_last_version_and_no_temp_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = DirectorySnapshotStore(tmp_path)
    first = store.save("m", b"first")
    real_fsync, calls = os.fsync, []

    def fsync_failing_at_the_second_file(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 2:  # the version's own head, after its snapshot file was synced
            raise OSError(5, "I/O error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync_failing_at_the_second_file)
    with pytest.raises(OSError, match="I/O error"):
        store.save("m", b"second")
    monkeypatch.undo()
    files = sorted(p.name for p in (tmp_path / "m").iterdir() if p.name != ".lock")
    assert files == ["HEAD", "v1.head", "v1.snap"]
    assert store.load("m") == (b"first", first)


def test_directory_truncated_file_is_corruption(tmp_path: Path) -> None:
    store = DirectorySnapshotStore(tmp_path)
    store.save("m", b"0123456789")
    (tmp_path / "m" / "v1.snap").write_bytes(b"01234")
    with pytest.raises(SnapshotCorruptError, match="5 bytes"):
        store.load("m")
    (tmp_path / "m" / "v1.snap").unlink()
    with pytest.raises(SnapshotCorruptError, match="missing"):
        store.load("m")


def test_directory_unreadable_head_is_corruption(tmp_path: Path) -> None:
    store = DirectorySnapshotStore(tmp_path)
    store.save("m", b"x")
    (tmp_path / "m" / "HEAD").write_text("{not json")
    assert "HEAD is not JSON" in store.load("m")[1].damage  # its own head still reads it
    (tmp_path / "m" / "v1.head").write_text("{not json")
    with pytest.raises(SnapshotCorruptError):
        store.load("m")


# -- open_store ----------------------------------------------------------------------------


def test_open_store_picks_by_redis_url(tmp_path: Path, redis_url: str) -> None:
    directory = open_store(None, str(tmp_path))
    assert isinstance(directory, DirectorySnapshotStore)
    assert isinstance(open_store("", str(tmp_path)), DirectorySnapshotStore)
    in_redis = open_store(redis_url, str(tmp_path / "unused"), key_prefix="p")
    assert isinstance(in_redis, RedisSnapshotStore) and in_redis.key_prefix == "p"
    in_redis.close()
    assert isinstance(SnapshotInfo(1, 0.0, 0, _sha(b"")).metadata, dict)


def test_a_directory_delete_that_fails_keeps_the_model_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delete the file system refuses reaches the caller, with the snapshots still there;
    one whose files cannot be removed afterwards still leaves nothing a start-up restores,
    and the next start-up removes them."""
    store = DirectorySnapshotStore(tmp_path)
    store.save("kept", b"snapshot")

    def refused(self: Path, target: Path) -> None:
        raise PermissionError(13, "Permission denied", str(self))

    with monkeypatch.context() as patched:
        patched.setattr(Path, "rename", refused)
        with pytest.raises(PermissionError):
            store.delete("kept")
    assert store.names() == ["kept"] and store.load("kept")[0] == b"snapshot"

    def stuck(path: Path) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    with monkeypatch.context() as patched:
        patched.setattr("service.storage.store.directory_store.shutil.rmtree", stuck)
        store.delete("kept")
    assert store.names() == [] and store.load("kept") is None
    (left,) = tmp_path.iterdir()  # the renamed directory, under no model's name
    assert (left / "HEAD").is_file() and left.name.startswith("deleted~kept~")
    assert DirectorySnapshotStore(tmp_path).names() == [] and not list(tmp_path.iterdir())


def test_a_directory_store_makes_new_and_deleted_models_durable_in_its_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model's directory appears (first save) and leaves (delete) by an entry of the
    store's root, which only an fsync of the root keeps through a power cut: without it a
    created model could vanish, or a deleted one come back."""
    import service.storage.common as common
    import service.storage.store.directory_store as directory_store

    store = DirectorySnapshotStore(tmp_path)
    synced: list[tuple[Path, bool]] = []
    real = directory_store.fsync_dir

    def recorded(path: Path) -> None:  # the root's syncs, and those of a new model's staging
        if Path(path) == tmp_path or Path(path).name.startswith("new~"):
            synced.append((Path(path), (tmp_path / "m").is_dir()))
        real(path)

    for module in (directory_store, common):  # the store's own, and its files' (common's)
        monkeypatch.setattr(module, "fsync_dir", recorded)
    store.save("m", b"first")
    (staged, root) = synced  # the files' entries in the staging directory, then the new entry
    assert staged[0].name.startswith("new~") and root == (tmp_path, True)
    store.save("m", b"second")
    assert synced[2:] == []  # an existing directory: its files sync themselves
    store.delete("m")
    assert synced[2:] == [(tmp_path, False)]  # after the rename


def test_a_first_save_cut_short_leaves_nothing_of_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model's first version appears whole or not at all: a save that fails before its
    directory is in place leaves no directory of the name (which a restore would take for a
    model whose HEAD was lost), and what a crash left of one is removed at the next opening."""
    store = DirectorySnapshotStore(tmp_path)

    def power_cut(self: Path, target: Path) -> None:
        raise OSError("cut")

    with monkeypatch.context() as patched:
        patched.setattr(Path, "rename", power_cut)
        with pytest.raises(OSError, match="cut"):
            store.save("m", b"first")
    assert list(tmp_path.iterdir()) == [] and store.names() == []
    crashed = tmp_path / "new~m"  # as a crash before the rename leaves it
    crashed.mkdir()
    (crashed / "v1.snap").write_bytes(b"first")
    assert DirectorySnapshotStore(tmp_path).names() == [] and list(tmp_path.iterdir()) == []
    assert store.save("m", b"again").version == 1 and store.load("m")[0] == b"again"


def test_redis_health_is_false_while_redis_refuses_writes(tmp_path: Path) -> None:
    """A Redis out of memory (``noeviction``) still answers PING, but takes no snapshot and no
    log append: the store's and the log's health say so, and recover with it."""
    from service.storage.wal import RedisWriteAheadLog
    from tests.support.redis_process import RedisProcess

    with RedisProcess(tmp_path / "redis", appendonly=False) as server:
        store = RedisSnapshotStore(server.url, key_prefix="health-test")
        wal = RedisWriteAheadLog(server.url, key_prefix="health-test")
        admin = redis.Redis.from_url(server.url)
        try:
            assert store.ping() and wal.ping()
            admin.config_set("maxmemory", 1)
            assert admin.ping()  # PING alone would call it healthy
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                store.save("m", b"x")
            assert not store.ping() and not wal.ping()
            admin.config_set("maxmemory", 0)
            assert store.ping() and wal.ping()
            assert store.save("m", b"x").version == 1
        finally:
            store.close()
            wal.close()
            admin.close()
