"""The write-ahead log in files: one append-only file per model (``FileWriteAheadLog``)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import struct
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from service.storage.common import (
    LOG_FILE_NAME,
    ClosingMixin,
    fsync_dir,
    model_dir_in,
    replace_atomically,
)
from service.storage.wal.entries import (
    FORMAT,
    EntryWriting,
    KeyLookups,
    check_keys,
    check_ttl,
    decode_entry,
)
from service.storage.wal.interface import (
    ANY_END,
    DEFAULT_IDEMPOTENCY_TTL_S,
    AppendEach,
    LogEntry,
    LoggedRequest,
    WalCorruptError,
    WalDivergedError,
    WalGapError,
)

_FILE_ID_RE = re.compile(r"\d+")

log = logging.getLogger(__name__)

_FRAME = struct.Struct("<II")  # payload length, CRC-32 of the payload
_HEADER_LEN = struct.Struct("<I")  # inside the payload: length of the JSON header
_LOG_NAME = LOG_FILE_NAME
_TMP_PREFIX = ".wal-tmp-"  # not ".tmp-": DirectorySnapshotStore removes those in its dirs
_COPY_BYTES = 16 * 1024 * 1024


def _parse_file_id(entry_id: str) -> int:
    if not isinstance(entry_id, str) or not _FILE_ID_RE.fullmatch(entry_id):
        raise ValueError(f"entry id must be a decimal number, got {entry_id!r}")
    return int(entry_id)


def _frame(header: dict[str, Any], *parts: bytes) -> bytes:
    """One record: [u32 length][u32 crc32][u32 header length][header JSON][parts...]."""
    head = json.dumps(header, separators=(",", ":")).encode()
    payload = b"".join([_HEADER_LEN.pack(len(head)), head, *parts])
    return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def _split_payload(payload: bytes | memoryview) -> tuple[dict[str, Any], memoryview]:
    """The record's JSON header and the bytes after it; ValueError if unreadable."""
    view = memoryview(payload)
    if len(view) < _HEADER_LEN.size:
        raise ValueError("record shorter than its header length field")
    (hlen,) = _HEADER_LEN.unpack_from(view)
    end = _HEADER_LEN.size + hlen
    if end > len(view):
        raise ValueError(f"header length {hlen} runs past the record")
    header = json.loads(bytes(view[_HEADER_LEN.size:end]))
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    return header, view[end:]


def _array_nbytes(spec: dict[str, Any]) -> int:
    shape = [int(s) for s in spec["shape"]]
    return np.dtype(str(spec["dtype"])).itemsize * int(np.prod(shape, dtype=np.int64))


@dataclass
class _Record:
    id: int
    offset: int  # of the frame in the file
    size: int  # frame + payload bytes


@dataclass
class _FileState:
    """What a FileWriteAheadLog knows about one model's file; guarded by ``lock``."""

    path: Path  # the file, its name checked once
    lock: threading.Lock = field(default_factory=threading.Lock)
    loaded: bool = False
    fd: int | None = None  # append handle, opened on first append
    end: int = 0  # bytes of valid records; anything after is a torn tail to cut off
    records: list[_Record] = field(default_factory=list)
    last_id: int = 0
    trimmed_through: int = 0
    # key -> (entry id, logged at, request digest or None)
    keys: dict[str, tuple[int, float, str | None]] = field(default_factory=dict)

    @property
    def last_entry(self) -> str | None:
        """The newest id appended, as the interface gives ids, None if none."""
        return str(self.last_id) if self.last_id else None


class FileWriteAheadLog(EntryWriting, KeyLookups, AppendEach, ClosingMixin):
    """The log as one append-only file per model: ``{directory}/{name}/wal.log``.

    Each record is ``[u32 length][u32 CRC-32][payload]`` (little-endian); the payload is a
    JSON header plus the raw feature and label bytes. Entry ids are 1, 2, 3, ... per model.
    An append writes one record with one ``write`` and, with ``fsync=True`` (the default),
    fdatasyncs it before returning, so an acknowledged chunk survives a power cut.

    On opening a model's file the records are checked in order. A damaged *last* record
    (shorter than its length says, a bad checksum with nothing after it, or a zero-filled
    tail) is a write a crash cut short: it was never acknowledged, so it is ignored and cut
    off by the next append. A damaged record with valid-looking bytes after it is
    corruption and raises :class:`WalCorruptError`. (A length field corrupted into pointing
    past the end of the file cannot be told from a torn write; it too counts as torn.)

    ``trim_through`` rewrites the file (temp file + fsync + ``os.replace``), keeping later
    records behind a first "base" record that carries the last id, the trim point and the
    idempotency keys still within their TTL, so none of them is forgotten by a trim.
    Keys are otherwise read back from the entry records when a file is opened.

    One process per directory: a second process appending to the same file would interleave
    ids. The directory may be the snapshot directory (the files do not collide).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        fsync: bool = True,
        idempotency_ttl_s: float = DEFAULT_IDEMPOTENCY_TTL_S,
    ) -> None:
        self.path = Path(directory)
        self.fsync = bool(fsync)
        self.idempotency_ttl_s = check_ttl(idempotency_ttl_s)
        self.path.mkdir(parents=True, exist_ok=True)
        self._guard = threading.Lock()
        self._states: dict[str, _FileState] = {}

    def __repr__(self) -> str:
        return f"FileWriteAheadLog({str(self.path)!r}, fsync={self.fsync})"

    # -- per-model state ------------------------------------------------------------------

    def _state_of(self, name: str) -> _FileState:
        """The model's state, made on first use (checking its name then, not on every call)."""
        with self._guard:
            state = self._states.get(name)
            if state is None:
                state = _FileState(model_dir_in(self.path, name) / _LOG_NAME)
                self._states[name] = state
            return state

    @contextlib.contextmanager
    def _state(self, name: str) -> Iterator[tuple[_FileState, Path]]:
        """Hold the model's lock, with its file scanned (once per process)."""
        state = self._state_of(name)
        with state.lock:
            if not state.loaded:
                self._scan(state.path, state)
            yield state, state.path

    def _scan(self, path: Path, state: _FileState) -> None:
        """Read every record once: rebuild ids, offsets and keys; find a torn tail."""
        state.records, state.keys = [], {}
        state.end = state.last_id = state.trimmed_through = 0
        try:
            fh = open(path, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            state.loaded = True
            return
        with fh:
            size = os.fstat(fh.fileno()).st_size
            offset = 0
            while offset < size:
                frame = fh.read(_FRAME.size)
                if len(frame) < _FRAME.size:
                    break  # torn: the frame itself was cut short
                length, crc = _FRAME.unpack(frame)
                record_end = offset + _FRAME.size + length
                if record_end > size:
                    break  # torn: the payload was cut short
                payload = fh.read(length)
                try:
                    if zlib.crc32(payload) != crc:
                        raise ValueError("CRC-32 mismatch")
                    self._index(state, payload, offset, record_end - offset)
                except (ValueError, KeyError, TypeError) as exc:
                    if record_end == size or _zeros_from(fh, offset, size):
                        break  # torn: the last record, or a zero-filled tail
                    raise WalCorruptError(
                        f"{path}: record at byte {offset} is damaged ({exc}) and "
                        f"{size - record_end} bytes follow it; refusing to guess"
                    ) from exc
                offset = record_end
            state.end = offset
        if offset < size:
            log.warning("%s: its last %d bytes are not a whole record and are cut off (an "
                        "append that a crash cut short was never acknowledged; anything else "
                        "is damage to the disk)", path, size - offset)
        state.loaded = True

    def _index(self, state: _FileState, payload: bytes, offset: int, size: int) -> None:
        """Add one checksum-valid record to ``state``; ValueError if it makes no sense."""
        header, body = _split_payload(payload)
        kind = header.get("kind")
        if kind == "base":
            if offset != 0:
                raise ValueError("base record not at the start of the file")
            state.last_id = int(header["last_id"])
            state.trimmed_through = int(header["trimmed_through"])
            for key, (entry_id, logged_at, *digest) in dict(header["keys"]).items():
                state.keys[str(key)] = (int(entry_id), float(logged_at),
                                        str(digest[0]) if digest and digest[0] else None)
            return
        if kind != "entry":
            raise ValueError(f"unknown record kind {kind!r}")
        entry_id = int(header["id"])
        previous = state.records[-1].id if state.records else state.trimmed_through
        if entry_id <= previous:
            raise ValueError(f"entry id {entry_id} does not follow {previous}")
        if len(body) != _array_nbytes(header["x"]) + _array_nbytes(header["y"]):
            raise ValueError("array bytes do not match the header's dtypes and shapes")
        state.records.append(_Record(entry_id, offset, size))
        state.last_id = max(state.last_id, entry_id)  # a base record may name a later one
        keys = header.get("keys") or ()
        digests = header.get("digests") or [None] * len(keys)
        for key, digest in zip(keys, digests, strict=True):
            if key is not None:
                logged = (entry_id, float(header["t"]), None if digest is None else str(digest))
                state.keys.setdefault(str(key), logged)

    def _key_live(
        self, state: _FileState, key: str, now: float
    ) -> tuple[int, float, str | None] | None:
        found = state.keys.get(key)
        if found is None or now - found[1] >= self.idempotency_ttl_s:
            return None
        return found

    # -- the interface --------------------------------------------------------------------

    def _write(
        self, name: str, header: dict[str, Any], x: bytes, y: bytes,
        keys: list[str | None], digests: list[str | None], now: float, follows: str | None,
    ) -> str:
        """Write one record (after cutting off any torn tail), fsync it, return its id."""
        with self._state(name) as (state, path):
            last = state.last_entry
            if follows != ANY_END:
                if follows != last:
                    raise WalDivergedError(name, follows, last)
                for key in keys:
                    if key is not None and self._key_live(state, key, now) is not None:
                        raise WalDivergedError(name, follows, last, key)
            entry_id = state.last_id + 1
            record = _frame({"kind": "entry", "id": entry_id, **header}, x, y)
            if state.fd is None:
                created = not path.exists()
                path.parent.mkdir(exist_ok=True)
                state.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                if created:
                    fsync_dir(path.parent)
                    fsync_dir(self.path)
            if os.fstat(state.fd).st_size != state.end:
                os.ftruncate(state.fd, state.end)  # a torn tail, or our own failed write
            _write_all(state.fd, record)
            if self.fsync:
                _fdatasync(state.fd)
            state.records.append(_Record(entry_id, state.end, len(record)))
            state.end += len(record)
            state.last_id = entry_id
            for key, digest in zip(keys, digests, strict=True):
                if key is not None and self._key_live(state, key, now) is None:
                    state.keys[key] = (entry_id, now, digest)
        return str(entry_id)

    def read_after(self, name: str, after_id: str | None) -> Iterator[LogEntry]:
        """Entries after ``after_id``, re-checking each record's CRC as it is read."""
        after = 0 if after_id is None else _parse_file_id(after_id)
        with self._state(name) as (state, path):
            if after_id is not None and after < state.trimmed_through:
                raise WalGapError(
                    f"log of {name!r} is trimmed through {state.trimmed_through}, past "
                    f"{after_id}: the entries in between are gone, so replaying from there "
                    "would skip examples"
                )
            wanted = [r for r in state.records if r.id > after]
            # Open now, under the lock: a later trim replaces the file, and this handle keeps
            # reading the one whose offsets we hold.
            fd = os.open(path, os.O_RDONLY) if wanted else None
        return self._read(path, fd, wanted)

    def _read(self, path: Path, fd: int | None, records: list[_Record]) -> Iterator[LogEntry]:
        if fd is None:
            return
        try:
            for record in records:
                raw = os.pread(fd, record.size, record.offset)
                length, crc = _FRAME.unpack_from(raw)
                payload = memoryview(raw)[_FRAME.size:]
                if len(payload) != length or zlib.crc32(payload) != crc:
                    raise WalCorruptError(
                        f"{path}: record {record.id} at byte {record.offset} changed on disk"
                    )
                header, body = _split_payload(payload)
                nx = _array_nbytes(header["x"])
                yield decode_entry(str(record.id), header, body[:nx], body[nx:])
        finally:
            os.close(fd)

    def trim_through(self, name: str, entry_id: str) -> None:
        """Rewrite the file without the records up to ``entry_id`` (atomically, fsynced)."""
        cut = _parse_file_id(entry_id)
        with self._state(name) as (state, path):
            cut = min(cut, state.last_id)
            if cut <= state.trimmed_through and not any(r.id <= cut for r in state.records):
                return  # nothing to drop, nothing new to record
            self._rewrite(state, path, max(state.trimmed_through, cut), state.last_id)

    def continue_after(self, name: str, entry_id: str) -> None:
        """Number later entries after ``entry_id``: the file is rewritten as a base record
        that says the log was trimmed through it (any older records go)."""
        wanted = _parse_file_id(entry_id)
        with self._state(name) as (state, path):
            if state.last_id < wanted:
                self._rewrite(state, path, wanted, wanted)

    def _rewrite(self, state: _FileState, path: Path, trimmed_through: int, last_id: int) -> None:
        """(model lock) Replace the file by a base record (``last_id``, ``trimmed_through`` and
        the live keys) followed by the records after ``trimmed_through``."""
        kept = [r for r in state.records if r.id > trimmed_through]
        now = time.time()
        live = {
            key: found
            for key, found in state.keys.items()
            if self._key_live(state, key, now) is not None
        }
        base = _frame({
            "kind": "base", "v": FORMAT, "last_id": last_id,
            "trimmed_through": trimmed_through, "keys": live,
        })
        path.parent.mkdir(exist_ok=True)
        start = kept[0].offset if kept else state.end

        def write_trimmed(out: BinaryIO) -> None:
            out.write(base)
            if kept:
                with open(path, "rb") as src:
                    src.seek(start)
                    remaining = state.end - start
                    while remaining:
                        block = src.read(min(_COPY_BYTES, remaining))
                        if not block:
                            raise WalCorruptError(f"{path} shrank while being trimmed")
                        out.write(block)
                        remaining -= len(block)

        replace_atomically(path, write_trimmed, tmp_prefix=_TMP_PREFIX)
        if state.fd is not None:
            os.close(state.fd)
            state.fd = None
        shift = len(base) - start
        state.records = [_Record(r.id, r.offset + shift, r.size) for r in kept]
        state.end += shift
        state.last_id = last_id
        state.trimmed_through = trimmed_through
        state.keys = live

    def last_id(self, name: str) -> str | None:
        """The newest id appended (kept across trims by the base record), None if none."""
        with self._state(name) as (state, _):
            return state.last_entry

    def wait_durable(self) -> None:
        """Nothing to wait for: each append is fsynced (with ``fsync``) before it returns."""

    def reconnect(self) -> None:
        """Nothing to reconnect: files."""

    def reaches(self, name: str, entry_id: str) -> bool:
        """True when the newest id appended is ``entry_id`` or later."""
        wanted = _parse_file_id(entry_id)
        with self._state(name) as (state, _):
            return state.last_id >= wanted

    def logged_requests(
        self, name: str, keys: Sequence[str | None]
    ) -> list[LoggedRequest | None]:
        """Each key's entry and digest (None for None and expired keys), from the index."""
        checked = check_keys(keys)
        now = time.time()
        with self._state(name) as (state, _):
            found = [None if k is None else self._key_live(state, k, now) for k in checked]
        return [None if f is None else LoggedRequest(str(f[0]), f[2]) for f in found]

    def delete(self, name: str) -> None:
        """Remove ``wal.log`` (and leftover temp files); the model directory if now empty; and
        what this process kept of the model (its records and idempotency keys), which would
        otherwise outlive it: a server that creates and deletes models by many names would
        hold them all."""
        state = self._state_of(name)
        path = state.path
        with state.lock:
            if state.fd is not None:
                os.close(state.fd)
            state.fd, state.loaded = None, False
            state.records, state.keys = [], {}
            if path.parent.is_dir():
                for entry in path.parent.iterdir():
                    if entry.name == _LOG_NAME or entry.name.startswith(_TMP_PREFIX):
                        with contextlib.suppress(FileNotFoundError):
                            entry.unlink()
                with contextlib.suppress(OSError):
                    path.parent.rmdir()  # only if empty: snapshots may share the directory
                fsync_dir(self.path)
        with self._guard:  # not under the state's lock: close takes the guard, then each lock
            if self._states.get(name) is state:
                del self._states[name]

    def check_durability(self) -> None:
        """Nothing to check: ``fsync`` is ours to do. Present for the interface."""

    def ping(self) -> bool:
        """True when a file can be created (and removed) in the log directory."""
        try:
            with tempfile.TemporaryFile(dir=self.path, prefix=_TMP_PREFIX):
                pass
        except OSError:
            return False
        return True

    def close(self) -> None:
        """Close the append handles; the next call on a model reopens (and rescans) it."""
        with self._guard:
            states = list(self._states.values())
            self._states = {}
        for state in states:
            with state.lock:
                if state.fd is not None:
                    os.close(state.fd)
                state.fd, state.loaded = None, False


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _fdatasync(fd: int) -> None:
    (getattr(os, "fdatasync", None) or os.fsync)(fd)


def _zeros_from(fh: Any, offset: int, size: int) -> bool:
    """True when every byte from ``offset`` to ``size`` is zero (a crash's unwritten tail)."""
    fh.seek(offset)
    remaining = size - offset
    while remaining:
        block = fh.read(min(_COPY_BYTES, remaining))
        if not block:
            return False
        if block.count(0) != len(block):
            return False
        remaining -= len(block)
    return True
