"""The write-ahead log in files: one log for every model of a directory, written with group
commit (``FileWriteAheadLog``).

Layout. ``{directory}/wal~/00000001.wal``, ``00000002.wal``, ...: segment files, written in
order; appends go to the newest, and a new one is started once it holds ``segment_bytes``.
(``wal~`` is a name no model can have, so the snapshot store may share the directory, as it
does by default.) A segment is a run of *writes*, each what one ``write`` put down::

    [b"GLW1"][u32 head length][u32 body length][u32 CRC-32 of these 12 bytes and the head]
    [head: JSON list, one [model, kind, id, length, CRC-32 of the payload] per record]
    [the records' payloads, one after another]

An entry's payload is its JSON header and raw array bytes (``entries.py``): it names neither
its model nor its id, so the appending thread frames and checksums it before it takes the
log's lock. Record kinds: ``e`` an entry appended (ids 1, 2, 3, ... per model, increasing
also across trims and restarts); ``t`` a trim (the entries up to ``id`` go; ``id`` is also the
model's newest id at least, which is what ``continue_after`` writes); ``s`` the model's state
restated (newest id, trim point, idempotency keys within their TTL) and ``c`` an entry carried
forward with its id, both written by compaction and by the migration of the older layout; ``d``
the model deleted (what came before about it is forgotten).

Why one log. Served as one small model per customer, thousands of models each append single
examples: a file per model costs an fdatasync per append and an open file per model that has
learned. Here appends that arrive together share one write and one fdatasync: those of
``append_many``, and ``append`` calls of several threads (the first to find no write under
way writes everything queued so far, the others wait for its fdatasync: group commit). The
open files are the newest segment plus one per read in progress, whatever the model count.

Opening. The first call scans every segment once and keeps, per model, its newest id, trim
point, idempotency keys and where each live entry lies (an index in memory; entries are read
from the files when replayed). Records are merged, never trusted to be new: a state record or
a carried entry written twice (a compaction or migration repeated after a crash) changes
nothing.

Damage. Only the newest write of the newest segment can have been cut short by a crash, since
with ``fsync`` each write is fdatasynced before the next begins: damage there with nothing
readable after it was never acknowledged, and is ignored and overwritten by the next append
(logged as a warning). Damage anywhere else is the disk's, and a shared log cannot always say
whose record it was:

* a record whose payload fails its CRC under an intact head is its model's alone: that model's
  calls raise :class:`WalCorruptError` (it is unrestored, loudly), every other model goes on,
  and ``delete`` of the model starts it afresh;
* a head that cannot be read (or a write running past its segment's end) hides whose records
  follow and where the next write starts: any model may have lost an acknowledged entry, so
  every call of the log raises :class:`WalCorruptError`, naming the segment and byte, until
  an operator repairs or moves the segment.

Trims and space. A trim writes a small ``t`` record, or an ``s`` record where the model has at
most ``_RESTATE_KEYS`` keys. A segment is deleted once no model needs any of its records: its
live entries, and the record its state is read back from (its first record, or its latest
``s``). Segments go oldest first, so one quiet model with an entry in the oldest segment would
pin every later one: when a new segment is started, the oldest is compacted if what it still
holds is at most half a segment (the state and live entries of the models that need it are
carried into the newest), and then deleted.

Migration. A directory in the older layout (``{directory}/{name}/wal.log``, one file per
model) is carried into the log at opening: each model's state and entries, ids, keys and
digests with them, written and fdatasynced before its old file is removed. A crash in between
repeats the carry at the next opening, which the merging makes harmless.

One process per directory: a second process appending would interleave ids.
"""

from __future__ import annotations

import bisect
import collections
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
from typing import Any

import numpy as np
import orjson

from service.storage.common import (
    LOG_FILE_NAME,
    ClosingMixin,
    check_name,
    fsync_dir,
    is_model_name,
)
from service.storage.wal.entries import (
    EncodedAppend,
    EntryWriting,
    KeyLookups,
    check_keys,
    check_ttl,
    decode_entry,
    encode_append,
)
from service.storage.wal.interface import (
    ANY_END,
    DEFAULT_IDEMPOTENCY_TTL_S,
    LogAppend,
    LogEntry,
    LoggedRequest,
    WalCorruptError,
    WalDivergedError,
    WalGapError,
)

log = logging.getLogger(__name__)

LOG_DIR_NAME = "wal~"
"""The segments' directory inside the log directory: not a model name (``is_model_name``)."""

DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
"""A new segment past this: few files, and a compaction copies at most half of one."""

_COMPACT_SHARE = 0.5  # the oldest segment is compacted when its live bytes are at most this
# A trim restates the model's state (so that older segments need not be kept for it) when it
# has at most this many idempotency keys; a longer list is restated by a compaction.
_RESTATE_KEYS = 64
_MIGRATE_BATCH_BYTES = 8 * 1024 * 1024  # the older layout is carried in writes of this size
_MAGIC = b"GLW1"
_WRITE = struct.Struct("<4sIII")  # magic, head length, body length, CRC-32 of them + head
_CRC = struct.Struct("<I")
_HEADER_LEN = struct.Struct("<I")  # inside a payload: length of the JSON header
_SEGMENT_RE = re.compile(r"(\d{8})\.wal")
_FILE_ID_RE = re.compile(r"\d+")
_TMP_PREFIX = ".wal-tmp-"  # the older layout's temp files; ping's too
_LEGACY_FRAME = struct.Struct("<II")  # the older layout: payload length, CRC-32 of the payload
_COPY_BYTES = 16 * 1024 * 1024

_KeyLogged = tuple[int, float, str | None]  # entry id, logged at, request digest


def _parse_file_id(entry_id: str) -> int:
    if not isinstance(entry_id, str) or not _FILE_ID_RE.fullmatch(entry_id):
        raise ValueError(f"entry id must be a decimal number, got {entry_id!r}")
    return int(entry_id)


def _split_payload(payload: bytes | memoryview) -> tuple[dict[str, Any], memoryview]:
    """An entry payload's JSON header and the bytes after it; ValueError if unreadable."""
    view = memoryview(payload)
    if len(view) < _HEADER_LEN.size:
        raise ValueError("record shorter than its header length field")
    (hlen,) = _HEADER_LEN.unpack_from(view)
    end = _HEADER_LEN.size + hlen
    if end > len(view):
        raise ValueError(f"header length {hlen} runs past the record")
    header = orjson.loads(view[_HEADER_LEN.size:end])
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    return header, view[end:]


def _array_nbytes(spec: dict[str, Any]) -> int:
    shape = [int(s) for s in spec["shape"]]
    return np.dtype(str(spec["dtype"])).itemsize * int(np.prod(shape, dtype=np.int64))


def _entry_keys(payload: bytes | memoryview) -> list[tuple[str, float, str | None]]:
    """The idempotency keys an entry payload was logged with (key, time, digest); ValueError
    if the payload is not an entry whose arrays fit its header."""
    header, body = _split_payload(payload)
    if len(body) != _array_nbytes(header["x"]) + _array_nbytes(header["y"]):
        raise ValueError("array bytes do not match the header's dtypes and shapes")
    keys = header.get("keys") or ()
    digests = header.get("digests") or [None] * len(keys)
    t = float(header["t"])
    return [(str(k), t, None if d is None else str(d))
            for k, d in zip(keys, digests, strict=True) if k is not None]


@dataclass(eq=False)
class _Record:
    """A record of the log as the index knows it; ``seg`` None until it is written."""

    id: int
    length: int
    crc: int
    seg: int | None = None
    offset: int = 0  # of the payload in its segment
    holds: int = 0  # how many of the index's anchors it is (a live entry, a model's origin)


@dataclass(eq=False)
class _Model:
    """What the log knows of one model (under the log's lock)."""

    records: list[_Record] = field(default_factory=list)  # live entries, by id
    last_id: int = 0
    trimmed_through: int = 0
    keys: dict[str, _KeyLogged] = field(default_factory=dict)
    origin: _Record | None = None  # where its state is read back from: the log before is moot
    tail: int = 0  # sequence number of its newest record queued
    damage: str | None = None  # why its calls are refused

    @property
    def last_entry(self) -> str | None:
        return str(self.last_id) if self.last_id else None


@dataclass(eq=False)
class _Segment:
    number: int
    path: Path
    anchors: int = 0  # records in it that the index still needs
    readers: int = 0  # reads in progress that hold it


@dataclass(eq=False)
class _Ticket:
    """One caller's records in the queue: done once the write of its last one is over."""

    seq: int = 0
    error: BaseException | None = None


@dataclass(eq=False)
class _Queued:
    name: str
    kind: str
    id: int
    parts: list[bytes]
    length: int
    crc: int
    record: _Record | None
    ticket: _Ticket
    seq: int = 0


def _payload(parts: list[bytes]) -> tuple[int, int]:
    """Length and CRC-32 of the payload made of ``parts``."""
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    return sum(len(p) for p in parts), crc


def _entry_parts(header: dict[str, Any], x: bytes, y: bytes) -> list[bytes]:
    head = orjson.dumps(header)
    return [_HEADER_LEN.pack(len(head)) + head, x, y]


def _frame_write(items: Sequence[_Queued]) -> tuple[bytes, list[int]]:
    """The bytes of one write of ``items`` and each payload's offset from its start."""
    head = orjson.dumps([[q.name, q.kind, q.id, q.length, q.crc] for q in items])
    fixed = _WRITE.pack(_MAGIC, len(head), sum(q.length for q in items), 0)[:-_CRC.size]
    offsets, at = [], _WRITE.size + len(head)
    for q in items:
        offsets.append(at)
        at += q.length
    parts = [fixed, _CRC.pack(zlib.crc32(head, zlib.crc32(fixed))), head]
    for q in items:
        parts.extend(q.parts)
    return b"".join(parts), offsets


def _read_write(data: bytes, offset: int) -> tuple[list[list[Any]], int, int] | None:
    """The head of the write at ``offset`` of ``data``, where its body starts, where it ends;
    None unless its head is whole and checks and its body lies within ``data``."""
    if offset + _WRITE.size > len(data):
        return None
    magic, head_len, body_len, crc = _WRITE.unpack_from(data, offset)
    start = offset + _WRITE.size
    if magic != _MAGIC or start + head_len > len(data):
        return None
    fixed = data[offset:start - _CRC.size]
    if zlib.crc32(data[start:start + head_len], zlib.crc32(fixed)) != crc:
        return None
    end = start + head_len + body_len
    try:
        head = orjson.loads(data[start:start + head_len])
        total = sum(int(r[3]) for r in head)
    except (ValueError, TypeError, IndexError):
        return None
    if end > len(data) or total != body_len:
        return None
    return head, start + head_len, end


def _next_write(data: bytes, offset: int) -> int | None:
    """Offset of the first readable write at or after ``offset``, None if there is none."""
    at = data.find(_MAGIC, offset)
    while at >= 0:
        if _read_write(data, at) is not None:
            return at
        at = data.find(_MAGIC, at + 1)
    return None


class _Reader:
    """The entries of one ``read_after``: read from the segments as they are iterated, each
    record's CRC checked again. The segments it reads are kept (not deleted) until it ends."""

    def __init__(self, wal: FileWriteAheadLog, name: str, records: list[_Record],
                 segments: list[_Segment]) -> None:
        self._wal, self._name, self._records = wal, name, records
        self._segments = segments
        self._index = 0
        self._fd: int | None = None
        self._fd_seg: int | None = None

    def __iter__(self) -> _Reader:
        return self

    def __next__(self) -> LogEntry:
        if self._index >= len(self._records):
            self.close()
            raise StopIteration
        record = self._records[self._index]
        self._index += 1
        assert record.seg is not None
        path = self._wal._segment_path(record.seg)
        try:
            if self._fd_seg != record.seg:
                self._close_fd()
                self._fd, self._fd_seg = os.open(path, os.O_RDONLY), record.seg
            assert self._fd is not None
            raw = os.pread(self._fd, record.length, record.offset)
            if len(raw) != record.length or zlib.crc32(raw) != record.crc:
                raise WalCorruptError(f"{path}: record {record.id} of {self._name!r} at byte "
                                      f"{record.offset} changed on disk")
            header, body = _split_payload(raw)
            nx = _array_nbytes(header["x"])
        except BaseException:
            self.close()
            raise
        return decode_entry(str(record.id), header, body[:nx], body[nx:])

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = self._fd_seg = None

    def close(self) -> None:
        """Stop reading: close the file, let the log delete the segments it kept."""
        self._close_fd()
        segments, self._segments = self._segments, []
        self._wal._released.extend(segments)  # taken up under the log's lock later

    def __del__(self) -> None:
        self.close()


class FileWriteAheadLog(EntryWriting, KeyLookups, ClosingMixin):
    """One log for every model of ``directory``, in segment files under ``wal~/``, written
    with group commit; the module docstring says how it is laid out, and why.

    An append is acknowledged once its write is done and, with ``fsync=True`` (the default),
    fdatasynced, so an acknowledged chunk survives a power cut. Appends that arrive together
    share one write and one fdatasync; ``syncs`` counts the fdatasyncs done.
    ``segment_bytes``: a new segment is started once the newest holds this many bytes.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        fsync: bool = True,
        idempotency_ttl_s: float = DEFAULT_IDEMPOTENCY_TTL_S,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    ) -> None:
        if isinstance(segment_bytes, bool) or not isinstance(segment_bytes, int) or (
            segment_bytes < 1
        ):
            raise ValueError(f"segment_bytes must be an int >= 1, got {segment_bytes!r}")
        self.path = Path(directory)
        self.fsync = bool(fsync)
        self.idempotency_ttl_s = check_ttl(idempotency_ttl_s)
        self.segment_bytes = segment_bytes
        self.syncs = 0  # fdatasyncs done: appends / syncs is the group commit's gain
        self.path.mkdir(parents=True, exist_ok=True)
        self._dir = self.path / LOG_DIR_NAME
        self._cond = threading.Condition(threading.Lock())
        self._released: collections.deque[_Segment] = collections.deque()
        self._reclaiming = False
        self._deferring = threading.local()  # this thread's deferred tickets (deferred_sync)
        self._reset()

    def _reset(self) -> None:
        """(lock) Forget everything: the next call scans the directory again."""
        self._opened = False
        self._broken: str | None = None  # why the whole log refuses every call
        self._states: dict[str, _Model] = {}
        self._segments: dict[int, _Segment] = {}  # by number, oldest first
        self._active: _Segment | None = None  # the newest segment, where writes go
        self._fd: int | None = None  # write handle of the active segment, opened on first use
        self._end = 0  # bytes of whole writes in the active segment; the rest is cut off
        self._queue: list[_Queued] = []
        self._seq = 0  # sequence number of the newest record queued
        self._done = 0  # every record up to this sequence number is written (or failed)
        self._leading = False  # a thread is writing the queue
        self._stale = False  # a write failed: the next call reopens the log
        self._rotated = False  # a segment was started since the last compaction

    def __repr__(self) -> str:
        return f"FileWriteAheadLog({str(self.path)!r}, fsync={self.fsync})"

    def _segment_path(self, number: int) -> Path:
        return self._dir / f"{number:08d}.wal"

    # -- the index --------------------------------------------------------------------------

    def _hold(self, record: _Record, delta: int) -> None:
        """(lock) Count ``record`` as ``delta`` more (or fewer) anchors of its segment."""
        record.holds += delta
        if record.seg is not None:
            self._segments[record.seg].anchors += delta

    def _model(self, name: str) -> _Model:
        model = self._states.get(name)
        if model is None:
            model = self._states[name] = _Model()
        return model

    def _set_origin(self, model: _Model, record: _Record) -> None:
        if model.origin is not None:
            self._hold(model.origin, -1)
        model.origin = record
        self._hold(record, 1)

    def _add_record(self, model: _Model, record: _Record) -> None:
        """(lock) ``record`` as a live entry of ``model``: after the others, or in place of the
        one of its id (a carried copy)."""
        records = model.records
        if not records or records[-1].id < record.id:
            records.append(record)
        else:
            at = bisect.bisect_left(records, record.id, key=lambda r: r.id)
            if at < len(records) and records[at].id == record.id:
                self._hold(records[at], -1)
                records[at] = record
            else:
                records.insert(at, record)
        self._hold(record, 1)
        if model.origin is None:
            self._set_origin(model, record)

    def _drop_through(self, model: _Model, through: int) -> None:
        """(lock) Forget the model's entries up to ``through``; ids go on after it."""
        cut = 0
        while cut < len(model.records) and model.records[cut].id <= through:
            self._hold(model.records[cut], -1)
            cut += 1
        del model.records[:cut]
        model.trimmed_through = max(model.trimmed_through, through)
        model.last_id = max(model.last_id, through)

    def _forget(self, name: str) -> _Model | None:
        """(lock) Drop the model from the index, releasing its anchors."""
        model = self._states.pop(name, None)
        if model is not None:
            for record in model.records:
                self._hold(record, -1)
            if model.origin is not None:
                self._hold(model.origin, -1)
        return model

    def _remember(self, model: _Model, key: str, logged: _KeyLogged) -> None:
        """A key keeps its first entry within the TTL; past the TTL a new one takes it."""
        found = model.keys.get(key)
        if found is None or logged[1] - found[1] >= self.idempotency_ttl_s:
            model.keys[key] = logged

    def _live_keys(self, model: _Model, now: float) -> dict[str, _KeyLogged]:
        return {k: v for k, v in model.keys.items() if now - v[1] < self.idempotency_ttl_s}

    def _key_live(self, model: _Model, key: str, now: float) -> _KeyLogged | None:
        found = model.keys.get(key)
        if found is None or now - found[1] >= self.idempotency_ttl_s:
            return None
        return found

    def _replay(self, name: str, kind: str, record: _Record, payload: bytes | memoryview) -> None:
        """(lock) Merge one record read back from a segment into the index. ValueError (and
        the like) if it makes no sense: the caller marks its model damaged."""
        if kind == "d":
            self._forget(name)
            return
        model = self._model(name)
        if kind in ("e", "c"):
            keys = _entry_keys(payload)
            if kind == "e":
                if record.id <= model.last_id:
                    raise ValueError(f"entry id {record.id} does not follow {model.last_id}")
            elif record.id <= model.trimmed_through:
                return  # a carried copy of an entry trimmed since
            self._add_record(model, record)
            model.last_id = max(model.last_id, record.id)
            for key, t, digest in keys:
                self._remember(model, key, (record.id, t, digest))
        elif kind == "t":
            if model.origin is None:
                self._set_origin(model, record)
            self._drop_through(model, record.id)
        elif kind == "s":
            state = orjson.loads(payload)
            self._set_origin(model, record)
            self._drop_through(model, int(state["trimmed"]))
            model.last_id = max(model.last_id, int(state["last"]))
            for key, (entry_id, t, *digest) in dict(state["keys"]).items():
                self._remember(model, str(key), (int(entry_id), float(t),
                                                 str(digest[0]) if digest and digest[0] else None))
        else:
            raise ValueError(f"unknown record kind {kind!r}")

    # -- opening ----------------------------------------------------------------------------

    def _ready(self) -> None:
        """(lock) Scan the log once (again after a failed write); raise if it is damaged."""
        while self._released:
            self._released.popleft().readers -= 1
        if self._stale and not self._leading and not self._queue:
            self._close_files()
            self._reset()
        if not self._opened:
            self._open()
        if self._broken is not None:
            raise WalCorruptError(self._broken)

    def _open(self) -> None:
        """(lock) Read every segment into the index, then carry in the older layout."""
        self._opened = True
        numbers = sorted(int(m.group(1)) for p in self._listing(self._dir)
                         if (m := _SEGMENT_RE.fullmatch(p)))
        for number in numbers:
            self._segments[number] = _Segment(number, self._segment_path(number))
        try:
            for number in numbers:
                end = self._scan(self._segments[number], newest=number == numbers[-1])
            if numbers:
                self._active, self._end = self._segments[numbers[-1]], end
            self._migrate()
        except WalCorruptError as exc:
            self._broken = str(exc)
            return
        except BaseException:
            self._close_files()
            self._reset()  # tried again at the next call
            raise
        now = time.time()
        for model in self._states.values():
            model.keys = self._live_keys(model, now)

    @staticmethod
    def _listing(directory: Path) -> list[str]:
        try:
            return os.listdir(directory)
        except FileNotFoundError:
            return []

    def _scan(self, segment: _Segment, newest: bool) -> int:
        """(lock) Index the records of ``segment``; the bytes of whole writes in it. Damage
        that a crash explains (see the module docstring) is the end; other damage marks the
        models whose records it hit, or, where their owner cannot be told, the whole log."""
        data = segment.path.read_bytes()
        offset = 0
        while offset < len(data):
            found = _read_write(data, offset)
            if found is None:
                if newest and _next_write(data, offset + 1) is None:
                    break  # torn: the last write was cut short
                raise WalCorruptError(
                    f"{segment.path}: the write at byte {offset} is unreadable and "
                    f"{len(data) - offset} bytes follow it; whose records it held cannot be "
                    "told, so every model may have lost entries: refusing to guess")
            head, at, end = found
            records = []
            for name, kind, entry_id, length, crc in head:
                payload = memoryview(data)[at:at + length]
                records.append((str(name), str(kind), int(entry_id), at, int(length),
                                int(crc), payload, zlib.crc32(payload) == crc))
                at += length
            if newest and not all(r[-1] for r in records) and _next_write(data, end) is None:
                break  # torn: the last write, its head whole, its body not
            for name, kind, entry_id, at, length, crc, payload, whole in records:
                record = _Record(entry_id, length, crc, segment.number, at)
                problem = None
                if not whole:
                    problem = "its CRC-32 does not match"
                else:
                    try:
                        self._replay(name, kind, record, payload)
                    except (ValueError, KeyError, TypeError, IndexError) as exc:
                        problem = str(exc)
                if problem is not None:
                    model = self._model(name)
                    model.damage = model.damage or (
                        f"{segment.path}: a record of {name!r} at byte {at} is damaged "
                        f"({problem}); entries of the model may be lost: refusing to guess "
                        "(delete the model to start it afresh)")
                    if model.origin is None:
                        self._set_origin(model, record)  # keep the damage where it lies
            offset = end
        if offset < len(data):
            log.warning("%s: its last %d bytes are not a whole write and are cut off (an "
                        "append that a crash cut short was never acknowledged; anything else "
                        "is damage to the disk)", segment.path, len(data) - offset)
        return offset

    def _migrate(self) -> None:
        """(lock, opening) Carry each ``{name}/wal.log`` of the older layout into the log,
        fdatasynced, then remove it. Written as ``s`` and ``c`` records, so that doing it
        again after a crash in between changes nothing."""
        legacy = sorted(name for name in self._listing(self.path)
                        if is_model_name(name) and (self.path / name / LOG_FILE_NAME).is_file())
        batch: list[_Queued] = []
        carried: list[str] = []
        for name in legacy:
            path = self.path / name / LOG_FILE_NAME
            try:
                last_id, trimmed, keys, entries = _read_legacy(path)
            except WalCorruptError as exc:
                model = self._model(name)
                model.damage = model.damage or f"{exc} (delete the model to start it afresh)"
                continue
            ticket = _Ticket()
            state = orjson.dumps({"last": last_id, "trimmed": trimmed, "keys": keys})
            batch.append(_Queued(name, "s", 0, [state], *_payload([state]), None, ticket))
            for entry_id, payload, crc in entries:
                batch.append(_Queued(name, "c", entry_id, [payload], len(payload), crc, None,
                                     ticket))
            carried.append(name)
            if sum(q.length for q in batch) >= _MIGRATE_BATCH_BYTES:
                self._carry_in(batch)
                batch = []
        if batch:
            self._carry_in(batch)
        if not carried:
            return
        if self.fsync and self._fd is not None:
            _fdatasync(self._fd)
            self.syncs += 1
        for name in carried:
            model_dir = self.path / name
            for entry in os.listdir(model_dir):
                if entry == LOG_FILE_NAME or entry.startswith(_TMP_PREFIX):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(model_dir / entry)
            with contextlib.suppress(OSError):
                model_dir.rmdir()  # only if empty: snapshots may share the directory
            if self.fsync and model_dir.is_dir():
                fsync_dir(model_dir)
        if self.fsync:
            fsync_dir(self.path)
        log.info("carried the logs of %d models from %s/*/%s into %s", len(carried), self.path,
                 LOG_FILE_NAME, self._dir)

    def _carry_in(self, batch: list[_Queued]) -> None:
        """(lock, opening) Write ``batch`` and index its records as a scan would."""
        data, offsets, segment = self._write_out(batch, sync=False)
        for q, at in zip(batch, offsets, strict=True):
            record = _Record(q.id, q.length, q.crc, segment.number, at)
            self._replay(q.name, q.kind, record, b"".join(q.parts))

    # -- writing ----------------------------------------------------------------------------

    def _enqueue(self, name: str, kind: str, entry_id: int, parts: list[bytes], length: int,
                 crc: int, record: _Record | None, ticket: _Ticket) -> None:
        """(lock) Queue a record to be written; its model's state has been updated."""
        self._seq += 1
        self._queue.append(_Queued(name, kind, entry_id, parts, length, crc, record, ticket,
                                   self._seq))
        ticket.seq = self._seq
        model = self._states.get(name)
        if model is not None:
            model.tail = self._seq

    def _await(self, seq: int) -> None:
        """(lock) Return once every record up to ``seq`` is written: by writing the queue
        (with the lock let go meanwhile) when no other thread is, else by waiting for it."""
        while self._done < seq:
            if self._leading:
                self._cond.wait()
            else:
                self._lead()

    def _lead(self) -> None:
        """(lock) Write everything queued with one write (and one fdatasync)."""
        batch, self._queue = self._queue, []
        if not batch:
            return
        self._leading = True
        try:
            _, offsets, segment = self._write_out(batch, sync=self.fsync, unlocked=True)
        except BaseException as exc:
            # What reached the file is unknown (and after a failed fdatasync, what the page
            # cache holds too): these records and all queued behind them fail, and the next
            # call reads the log again from the disk.
            for q in (*batch, *self._queue):
                q.ticket.error = exc
            self._queue = []
            self._stale = True
            self._done = self._seq
        else:
            for q, at in zip(batch, offsets, strict=True):
                if q.record is not None:
                    q.record.seg, q.record.offset = segment.number, at
                    segment.anchors += q.record.holds
            self._done = batch[-1].seq
        finally:
            self._leading = False
            self._cond.notify_all()

    def _write_out(
        self, batch: list[_Queued], *, sync: bool, unlocked: bool = False,
    ) -> tuple[bytes, list[int], _Segment]:
        """(lock) Frame ``batch`` as one write at the end of the active segment (a new one
        past ``segment_bytes``), write it, fdatasync it if ``sync``; with ``unlocked`` the
        lock is let go for the I/O. Returns the bytes, each payload's offset in the
        segment, and the segment."""
        data, offsets = _frame_write(batch)
        new = self._active is None or (self._end >= self.segment_bytes and self._end > 0)
        if new:
            number = self._active.number + 1 if self._active is not None else 1
            segment = _Segment(number, self._segment_path(number))
            start = 0
        else:
            assert self._active is not None
            segment, start = self._active, self._end
        if unlocked:
            self._cond.release()
        try:
            if new:
                self._start_segment(segment)
            elif self._fd is None:
                self._fd = os.open(segment.path, os.O_WRONLY)
                if os.fstat(self._fd).st_size != start:
                    os.ftruncate(self._fd, start)  # a torn write, cut off
            assert self._fd is not None
            _pwrite_all(self._fd, data, start)
            if sync:
                _fdatasync(self._fd)
        finally:
            if unlocked:
                self._cond.acquire()
        if sync:
            self.syncs += 1
        if new:
            self._segments[segment.number] = segment
            self._active, self._rotated = segment, self._active is not None
        self._end = start + len(data)
        return data, [start + at for at in offsets], segment

    def _start_segment(self, segment: _Segment) -> None:
        """(I/O, the writing thread) Create ``segment``'s file, durably, and write to it."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if not self._dir.is_dir():
            self._dir.mkdir(exist_ok=True)
            if self.fsync:
                fsync_dir(self.path)
        self._fd = os.open(segment.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        if self.fsync:
            fsync_dir(self._dir)

    def _write(
        self, name: str, header: dict[str, Any], x: bytes, y: bytes,
        keys: list[str | None], digests: list[str | None], now: float, follows: str | None,
    ) -> str:
        """Log one encoded append (``append``, ``append_waiting``); its id."""
        (result,) = self._append_encoded([(0, EncodedAppend(
            name, header, x, y, keys, digests, now, follows))], [None])
        if isinstance(result, BaseException):
            raise result
        assert result is not None
        return result

    def append_many(self, appends: Sequence[LogAppend]) -> list[str | Exception]:
        """Log ``appends`` with one write and one fdatasync; each one's id or exception (see
        :meth:`WriteAheadLog.append_many`)."""
        results: list[str | Exception | None] = [None] * len(appends)
        encoded = []
        for i, item in enumerate(appends):
            try:
                encoded.append((i, encode_append(item)))
            except (ValueError, TypeError) as exc:
                results[i] = exc
        self._append_encoded(encoded, results)
        return results  # type: ignore[return-value] - every slot is filled

    def _append_encoded(
        self, encoded: list[tuple[int, EncodedAppend]], results: list[Any],
    ) -> list[Any]:
        """Queue each encoded append whose checks hold, write them together, fill in
        ``results`` (ids, or the exception of an append refused or a write that failed)."""
        framed = []
        for i, e in encoded:
            try:
                check_name(e.name)
            except ValueError as exc:
                results[i] = exc
                continue
            parts = _entry_parts(e.header, e.x, e.y)
            framed.append((i, e, parts, *_payload(parts)))  # outside the lock: the CRC
        if not framed:
            return results
        ticket = _Ticket()
        queued = []
        with self._cond:
            try:
                self._ready()
            except WalCorruptError as exc:
                for i, *_ in framed:
                    results[i] = exc
                return results
            for i, e, parts, length, crc in framed:
                try:
                    entry_id = self._admit(e)
                except (WalDivergedError, WalCorruptError) as exc:
                    results[i] = exc
                    continue
                model = self._model(e.name)
                record = _Record(entry_id, length, crc)
                self._add_record(model, record)
                model.last_id = entry_id
                for key, digest in zip(e.keys, e.digests, strict=True):
                    if key is not None and self._key_live(model, key, e.now) is None:
                        model.keys[key] = (entry_id, e.now, digest)
                self._enqueue(e.name, "e", entry_id, parts, length, crc, record, ticket)
                results[i] = str(entry_id)
                queued.append(i)
            deferred = getattr(self._deferring, "tickets", None)
            if queued and deferred is not None:
                deferred.append(ticket)  # written, and synced, as deferred_sync ends
                return results
            if queued:
                self._await(ticket.seq)
            rotated, self._rotated = self._rotated, False
        if ticket.error is not None:
            for i in queued:
                results[i] = ticket.error
        if rotated:
            self._reclaim(compact=True)
        return results

    @contextlib.contextmanager
    def deferred_sync(self) -> Iterator[None]:
        """Appends this thread makes inside the block are given their ids at once, and written
        with one write and one fdatasync (as one group) as the block ends: the caller sends
        no answer before then. If that write fails, the block raises its error (nothing of
        the block is acknowledged; what reached the disk is read back by the next call)."""
        if getattr(self._deferring, "tickets", None) is not None:
            yield  # nested: the outer block writes
            return
        tickets: list[_Ticket] = []
        self._deferring.tickets = tickets
        try:
            yield
        finally:
            self._deferring.tickets = None
            if tickets:
                with self._cond:
                    self._await(max(ticket.seq for ticket in tickets))
                    rotated, self._rotated = self._rotated, False
                if rotated:
                    self._reclaim(compact=True)
        failed = next((ticket.error for ticket in tickets if ticket.error is not None), None)
        if failed is not None:
            raise failed

    def _admit(self, e: EncodedAppend) -> int:
        """(lock) The id an append will have; WalDivergedError or WalCorruptError if refused."""
        model = self._states.get(e.name)
        if model is not None and model.damage:
            raise WalCorruptError(model.damage)
        last = model.last_entry if model is not None else None
        if e.follows != ANY_END:
            if e.follows != last:
                raise WalDivergedError(e.name, e.follows, last)
            for key in e.keys:
                if key is not None and model is not None and (
                    self._key_live(model, key, e.now) is not None
                ):
                    raise WalDivergedError(e.name, e.follows, last, key)
        return (model.last_id if model is not None else 0) + 1

    def _checked(self, name: str) -> _Model | None:
        """(lock) The model's state, None if the log holds nothing of it; raises if damaged."""
        check_name(name)
        self._ready()
        model = self._states.get(name)
        if model is not None and model.damage:
            raise WalCorruptError(model.damage)
        return model

    def _log_record(self, name: str, kind: str, entry_id: int, payload: bytes = b"") -> None:
        """(lock) Log a record other than an entry, and wait for it to be written; it is the
        origin of a model that has none yet."""
        ticket = _Ticket()
        record = _Record(entry_id, *_payload([payload]))
        model = self._states.get(name)
        if model is not None and model.origin is None:
            self._set_origin(model, record)
        self._enqueue(name, kind, entry_id, [payload], record.length, record.crc, record, ticket)
        self._await(ticket.seq)
        if ticket.error is not None:
            raise ticket.error

    # -- the interface ----------------------------------------------------------------------

    def read_after(self, name: str, after_id: str | None) -> Iterator[LogEntry]:
        """Entries after ``after_id``, re-checking each record's CRC as it is read."""
        after = 0 if after_id is None else _parse_file_id(after_id)
        with self._cond:
            model = self._checked(name)
            if model is None:
                return iter(())
            if after_id is not None and after < model.trimmed_through:
                raise WalGapError(
                    f"log of {name!r} is trimmed through {model.trimmed_through}, past "
                    f"{after_id}: the entries in between are gone, so replaying from there "
                    "would skip examples"
                )
            self._await(model.tail)  # its appends under way are written first
            if self._states.get(name) is not model:
                return iter(())  # deleted meanwhile
            wanted = [r for r in model.records if r.id > after and r.seg is not None]
            segments = [self._segments[n] for n in {r.seg for r in wanted}]  # type: ignore[index]
            for segment in segments:
                segment.readers += 1
        return _Reader(self, name, wanted, segments)

    def names(self) -> list[str]:
        """The models with entries in the log (not trimmed, not deleted), sorted: from the
        index (:class:`service.storage.wal.interface.ModelListing`)."""
        with self._cond:
            self._ready()
            return sorted(name for name, model in self._states.items() if model.records)

    def trim_through(self, name: str, entry_id: str) -> None:
        """Drop the entries up to ``entry_id`` (a small trim record); segments that no model
        needs any more are deleted."""
        cut = _parse_file_id(entry_id)
        with self._cond:
            model = self._checked(name)
            if model is None:
                return
            cut = min(cut, model.last_id)
            if cut <= model.trimmed_through:
                return  # nothing to drop, nothing new to record
            self._drop_through(model, cut)
            model.keys = self._live_keys(model, time.time())
            origin = model.origin.seg if model.origin is not None else None
            if origin is not None and self._active is not None and (
                origin != self._active.number and len(model.keys) <= _RESTATE_KEYS
            ):
                ticket = _Ticket()
                self._queue_state(name, model, ticket)
                self._await(ticket.seq)
                if ticket.error is not None:
                    raise ticket.error
            else:
                self._log_record(name, "t", cut)
        self._reclaim(compact=False)

    def continue_after(self, name: str, entry_id: str) -> None:
        """Number later entries after ``entry_id``: a trim record through it (any older
        entries go)."""
        wanted = _parse_file_id(entry_id)
        with self._cond:
            model = self._checked(name)
            if model is not None and model.last_id >= wanted:
                return
            self._drop_through(self._model(name), wanted)
            self._log_record(name, "t", wanted)
        self._reclaim(compact=False)

    def last_id(self, name: str) -> str | None:
        """The newest id appended (kept across trims), None if none."""
        with self._cond:
            model = self._checked(name)
            return None if model is None else model.last_entry

    def reaches(self, name: str, entry_id: str) -> bool:
        """True when the newest id appended is ``entry_id`` or later."""
        wanted = _parse_file_id(entry_id)
        with self._cond:
            model = self._checked(name)
            return model is not None and model.last_id >= wanted

    def logged_requests(
        self, name: str, keys: Sequence[str | None]
    ) -> list[LoggedRequest | None]:
        """Each key's entry and digest (None for None and expired keys), from the index."""
        checked = check_keys(keys)
        now = time.time()
        with self._cond:
            model = self._checked(name)
            if model is None:
                return [None] * len(checked)
            found = [None if k is None else self._key_live(model, k, now) for k in checked]
        return [None if f is None else LoggedRequest(str(f[0]), f[2]) for f in found]

    def delete(self, name: str) -> None:
        """Forget the model: a delete record, so that its records are never read back (a
        damaged model's too, which starts afresh); the segments then unneeded are deleted,
        and the whole ``wal~`` directory once the log holds no model."""
        check_name(name)
        with self._cond:
            self._ready()
            model = self._forget(name)
            legacy = self.path / name / LOG_FILE_NAME
            if legacy.exists():  # of the older layout, damaged (healthy ones are carried in)
                legacy.unlink()
                with contextlib.suppress(OSError):
                    legacy.parent.rmdir()
                if self.fsync:
                    fsync_dir(self.path)
            if model is None:
                return
            self._log_record(name, "d", 0)
        self._reclaim(compact=False)

    def _reclaim(self, *, compact: bool) -> None:
        """Delete the segments no model needs, oldest first; with ``compact``, first carry the
        few records that keep the oldest one. Never raises: a failure is logged, and the
        segments are kept until the next try."""
        with self._cond:
            if self._reclaiming:
                return
            self._reclaiming = True
        try:
            self._reclaim_segments(compact)
        except Exception as exc:  # noqa: BLE001 - space is reclaimed at the next try
            log.warning("reclaiming space of the log in %s failed (tried again later): %s",
                        self._dir, exc)
        finally:
            with self._cond:
                self._reclaiming = False

    def _reclaim_segments(self, compact: bool) -> None:
        compacted = None  # a segment compacted once and still needed is left alone
        while True:
            with self._cond:
                if not self._opened or self._broken is not None or self._stale:
                    return
                while self._released:
                    self._released.popleft().readers -= 1
                if not self._states:
                    self._remove_all()
                    return
                oldest = next(iter(self._segments.values()), None)
                if oldest is None or oldest is self._active or oldest.readers:
                    return
                if oldest.anchors == 0:
                    # The records that freed it may be queued still: write them first.
                    self._await(self._seq)
                    if self._stale or next(iter(self._segments.values()), None) is not oldest:
                        return
                    if not oldest.readers:
                        self._remove_segment(oldest)
                    continue
                if not compact or oldest.number == compacted:
                    return
                plan = self._compaction_plan(oldest)
                if plan is None:
                    return
            carried = _read_records(oldest.path, [r for _, _, records in plan for r in records])
            with self._cond:
                self._carry_forward(plan, carried)
            compacted = oldest.number

    def _compaction_plan(
        self, oldest: _Segment,
    ) -> list[tuple[str, _Model, list[_Record]]] | None:
        """(lock) The models that need ``oldest`` and their live entries in it, if carrying
        them forward costs little (none of them damaged)."""
        plan, cost = [], 0
        for name, model in self._states.items():
            mine = [r for r in model.records if r.seg == oldest.number]
            if not mine and (model.origin is None or model.origin.seg != oldest.number):
                continue
            if model.damage:
                return None
            plan.append((name, model, mine))
            cost += sum(r.length for r in mine) + 64 + 80 * len(model.keys)
        if cost > self.segment_bytes * _COMPACT_SHARE:
            return None
        return plan

    def _carry_forward(
        self, plan: list[tuple[str, _Model, list[_Record]]], carried: dict[int, bytes],
    ) -> None:
        """(lock) Restate each planned model's state and copy its planned entries into the
        newest segment, as they are now (a model trimmed or deleted meanwhile is skipped)."""
        ticket = _Ticket()
        now = time.time()
        for name, model, records in plan:
            if self._states.get(name) is not model:
                continue
            model.keys = self._live_keys(model, now)
            self._queue_state(name, model, ticket)
            for old in records:
                at = bisect.bisect_left(model.records, old.id, key=lambda r: r.id)
                if at == len(model.records) or model.records[at] is not old:
                    continue  # trimmed meanwhile
                copy = _Record(old.id, old.length, old.crc)
                self._add_record(model, copy)
                self._enqueue(name, "c", old.id, [carried[id(old)]], old.length, old.crc, copy,
                              ticket)
        if ticket.seq:
            self._await(ticket.seq)
            if ticket.error is not None:
                raise ticket.error

    def _queue_state(self, name: str, model: _Model, ticket: _Ticket) -> None:
        """(lock) Queue a record restating the model's state; the model's origin from now."""
        state = orjson.dumps({"last": model.last_id, "trimmed": model.trimmed_through,
                              "keys": model.keys})
        origin = _Record(0, *_payload([state]))
        self._set_origin(model, origin)
        self._enqueue(name, "s", 0, [state], origin.length, origin.crc, origin, ticket)

    def _remove_segment(self, segment: _Segment) -> None:
        """(lock) Delete a segment no model needs, durably (an older one coming back after a
        power cut would be read before newer records that assume it gone)."""
        segment.path.unlink(missing_ok=True)
        del self._segments[segment.number]
        if self.fsync:
            fsync_dir(self._dir)

    def _remove_all(self) -> None:
        """(lock) The log holds no model: remove its segments, oldest first, and directory."""
        if self._leading or self._queue or any(s.readers for s in self._segments.values()):
            return
        self._close_files()
        for segment in list(self._segments.values()):
            self._remove_segment(segment)
        self._active, self._end = None, 0
        with contextlib.suppress(FileNotFoundError):
            self._dir.rmdir()
            if self.fsync:
                fsync_dir(self.path)

    def _close_files(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def wait_durable(self) -> None:
        """Nothing to wait for: each append is fsynced (with ``fsync``) before it returns."""

    def reconnect(self) -> None:
        """Nothing to reconnect: files."""

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
        """Finish the writes under way and close the file; the next call reads the log anew."""
        with self._cond:
            self._await(self._seq)
            self._close_files()
            self._reset()


def _read_records(path: Path, records: list[_Record]) -> dict[int, bytes]:
    """The payloads of ``records`` in the segment at ``path``, by ``id(record)``, each
    checked against its CRC."""
    out = {}
    with open(path, "rb") as fh:
        for record in records:
            fh.seek(record.offset)
            raw = fh.read(record.length)
            if len(raw) != record.length or zlib.crc32(raw) != record.crc:
                raise WalCorruptError(f"{path}: record {record.id} at byte {record.offset} "
                                      "changed on disk")
            out[id(record)] = raw
    return out


def _read_legacy(
    path: Path,
) -> tuple[int, int, dict[str, list[Any]], list[tuple[int, bytes, int]]]:
    """A model's file of the older layout: newest id, trim point, keys (``{key: [id, time,
    digest]}``) and entries (id, payload, CRC-32). A torn last record is left out, as that
    layout did; damage before it raises WalCorruptError."""
    data = path.read_bytes()
    last_id = trimmed = offset = 0
    keys: dict[str, list[Any]] = {}
    entries: list[tuple[int, bytes, int]] = []
    while offset + _LEGACY_FRAME.size <= len(data):
        length, crc = _LEGACY_FRAME.unpack_from(data, offset)
        end = offset + _LEGACY_FRAME.size + length
        if end > len(data):
            break  # torn: the payload was cut short
        payload = data[offset + _LEGACY_FRAME.size:end]
        try:
            if zlib.crc32(payload) != crc:
                raise ValueError("CRC-32 mismatch")
            header, _ = _split_payload(payload)
            if header.get("kind") == "base":
                if offset != 0:
                    raise ValueError("base record not at the start of the file")
                last_id, trimmed = int(header["last_id"]), int(header["trimmed_through"])
                for key, (entry_id, t, *digest) in dict(header["keys"]).items():
                    keys[str(key)] = [int(entry_id), float(t), digest[0] if digest else None]
            elif header.get("kind") == "entry":
                entry_id = int(header["id"])
                if entry_id <= (entries[-1][0] if entries else trimmed):
                    raise ValueError(f"entry id {entry_id} out of order")
                for key, t, digest in _entry_keys(payload):
                    keys.setdefault(key, [entry_id, t, digest])
                entries.append((entry_id, payload, crc))
                last_id = max(last_id, entry_id)
            else:
                raise ValueError(f"unknown record kind {header.get('kind')!r}")
        except (ValueError, KeyError, TypeError) as exc:
            if end == len(data) or data.count(0, offset) == len(data) - offset:
                break  # torn: the last record, or a zero-filled tail
            raise WalCorruptError(
                f"{path}: record at byte {offset} is damaged ({exc}) and {len(data) - end} "
                "bytes follow it; refusing to guess") from exc
        offset = end
    if offset < len(data):
        log.warning("%s: its last %d bytes are not a whole record and are left out (an append "
                    "that a crash cut short was never acknowledged)", path, len(data) - offset)
    return last_id, trimmed, keys, entries


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _fdatasync(fd: int) -> None:
    (getattr(os, "fdatasync", None) or os.fsync)(fd)


def logs_model(directory: str | os.PathLike[str], name: str) -> bool:
    """True when the file log of ``directory`` holds something of model ``name`` (records not
    followed by its delete, or a file of the older layout): what a model leaves only once it
    has learned, which the snapshot store sharing the directory takes as evidence that it
    lived. Reads the segments without the log's lock (a write under way ends the reading)."""
    root = Path(directory)
    with contextlib.suppress(OSError):
        if (root / check_name(name) / LOG_FILE_NAME).stat().st_size > 0:
            return True
    quoted, held = json.dumps(name).encode(), False
    for entry in sorted(FileWriteAheadLog._listing(root / LOG_DIR_NAME)):
        try:
            data = (root / LOG_DIR_NAME / entry).read_bytes() if _SEGMENT_RE.fullmatch(
                entry) else b""
        except OSError:
            continue
        offset = 0 if quoted in data else len(data)  # most segments never name it
        while (found := _read_write(data, offset)) is not None:
            head, _, offset = found
            for record in head:
                if record[0] == name:
                    held = record[1] != "d"
    return held
