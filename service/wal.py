"""Write-ahead log: every learned chunk is logged before it is applied, so a crash loses nothing.

Snapshots (``service/store.py``) are taken every so often; the log covers the time between
them. The learn worker appends each coalesced chunk of examples to the model's log with one
write, then applies it to the model, then answers every request in the chunk. A snapshot
records the id of the last entry it includes (snapshot metadata); once the snapshot is the
current one, the log is trimmed through that id. At start-up a model is restored from its
snapshot and the entries after that id are replayed in order. ``docs/durability.md`` says
what survives what.

Two implementations share the :class:`WriteAheadLog` interface:

* :class:`RedisWriteAheadLog` keeps one Redis Stream per model (``XADD`` / ``XRANGE`` /
  ``XTRIM MINID``). Its ``durability`` decides when an append counts as done.
* :class:`FileWriteAheadLog` keeps one append-only file per model, records framed with their
  length and CRC-32, fsynced on every append.

Entries carry raw array bytes plus their dtype and shape, never pickles. An append may carry
idempotency keys (one per request of the chunk, or None for a request without one) and each
keyed request's :func:`request_digest`; the log remembers for ``idempotency_ttl_s`` seconds
which entry each key was logged with, and the digest, so a retried request can be recognised
(:meth:`WriteAheadLog.seen_key`) and not learned twice, and a key reused for other data told
from a retry (:meth:`WriteAheadLog.logged_requests`).

Entry ids are strings, opaque to callers: Redis stream ids (``"1712345678901-0"``) or, in
files, decimal counters (``"1"``, ``"2"``, ...). Ids only ever increase for a model, also
across trims and restarts; :meth:`WriteAheadLog.delete` starts a model's log afresh.

>>> import tempfile
>>> import numpy as np
>>> with tempfile.TemporaryDirectory() as tmp:
...     wal = open_wal(None, tmp)
...     first = wal.append("spam", np.zeros((2, 3), np.float32), np.array([0, 1]), ["req-1"])
...     second = wal.append("spam", np.ones((1, 3), np.float32), np.array([2]))
...     wal.trim_through("spam", first)
...     replay = [(e.id, e.labels.tolist()) for e in wal.read_after("spam", None)]
...     (first, second, replay, wal.seen_key("spam", "req-1"), wal.last_id("spam"))
('1', '2', [('2', [2])], '1', '2')
"""

from __future__ import annotations

import contextlib
import hashlib
import json
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
from typing import Any, BinaryIO, Literal, NamedTuple, Protocol, runtime_checkable

import numpy as np
import redis

from service.store import (
    _check_name,
    _ClosingMixin,
    _fsync_dir,
    _model_dir_in,
    _RedisClient,
    _replace_atomically,
)

__all__ = [
    "DEFAULT_IDEMPOTENCY_TTL_S",
    "Durability",
    "FileWriteAheadLog",
    "LogEntry",
    "LoggedRequest",
    "RedisWriteAheadLog",
    "WalCorruptError",
    "WalDurabilityError",
    "WalGapError",
    "WriteAheadLog",
    "check_idempotency_key",
    "open_wal",
    "request_digest",
]

DEFAULT_IDEMPOTENCY_TTL_S = 24 * 3600.0
"""How long a logged idempotency key is remembered: long enough for any sane client retry."""

Durability = Literal["everysec", "always", "waitaof"]
"""When :class:`RedisWriteAheadLog` counts an append as done (see its docstring)."""

_DURABILITIES = ("everysec", "always", "waitaof")

_FORMAT = 1
"""Version of the entry encoding (JSON header + raw array bytes); bumped on any change."""

_FORMAT_DELAYED_LABELS = 2
"""Entries about delayed labels (wait entries, learn entries naming ids) are written with this
version, so a server that predates them refuses them instead of learning a wait entry's
predictions as labels; plain learn entries keep version 1."""

_KEY_RE = re.compile(r"[\x21-\x7e]{1,200}")
_DIGEST_RE = re.compile(r"[0-9a-f]{1,128}")
_REDIS_ID_RE = re.compile(r"(\d+)-(\d+)")
_FILE_ID_RE = re.compile(r"\d+")
_U64_MAX = 2**64 - 1


class WalCorruptError(ValueError):
    """A log record is damaged (bad checksum, unreadable header, ids out of order).

    A torn *last* record of a file log (a write cut short by a crash) is not corruption: it
    was never acknowledged, so it is ignored and overwritten by the next append.
    """


class WalGapError(WalCorruptError):
    """``read_after(name, id)`` was asked for entries the log has already trimmed away.

    Replaying from there would silently skip examples: typically a snapshot older than the
    log's trim point (restored from a backup, say).
    """


class WalDurabilityError(RuntimeError):
    """The Redis server cannot give the durability asked for, or did not confirm it in time."""


@dataclass(frozen=True)
class LogEntry:
    """One logged chunk: its id, its examples, and the idempotency keys it was logged with.

    ``features`` and ``labels`` have the dtype and shape they were appended with; they are
    read-only views of the bytes read back (copy them to modify).
    """

    id: str
    features: np.ndarray
    labels: np.ndarray
    idempotency_keys: tuple[str | None, ...] = ()
    created_at: float = 0.0
    request_rows: tuple[int, ...] = ()  # rows of each request in the chunk, if logged
    request_digests: tuple[str | None, ...] = ()  # each request's request_digest, if logged
    # Delayed labels (service/pending.py). A learn entry: the ids of the waiting rows it
    # learned, which stop waiting. A wait entry: the id of each of its rows.
    label_ids: tuple[str, ...] = ()
    predictions: np.ndarray | None = None  # wait entry: (n, num_classes), as predicted
    expires_at: float = 0.0  # wait entry: when its rows' wait ends (time.time())
    # Wait entry: ids that expired (dropped, their label never came) once its rows were put.
    expired_ids: tuple[str, ...] = ()

    @property
    def waiting(self) -> bool:
        """True for a wait entry: rows put to wait for labels, nothing learned (no labels)."""
        return self.predictions is not None


class LoggedRequest(NamedTuple):
    """What the log remembers of an idempotency key: its entry, and its request's digest.

    ``digest`` is None when the append carried none (a log written before digests were kept).
    """

    entry_id: str
    digest: str | None


@runtime_checkable
class WriteAheadLog(Protocol):
    """The interface the service uses; both implementations are synchronous and thread-safe."""

    def append(
        self,
        name: str,
        features: np.ndarray,
        labels: np.ndarray,
        idempotency_keys: Sequence[str | None] | None = None,
        request_rows: Sequence[int] | None = None,
        request_digests: Sequence[str | None] | None = None,
        label_ids: Sequence[str] = (),
    ) -> str:
        """Log one chunk (``features`` (n, d) floats, ``labels`` (n,) ints) durably; its id.

        ``idempotency_keys`` has one item per request of the chunk (None where a request has
        no key). A key already remembered keeps its original entry id; callers check
        :meth:`seen_keys` first so that a retried request is not logged (or learned) again.
        ``request_rows`` (optional, one count per request, summing to n) records how the
        chunk splits into requests, so that a replay can give each request its own answer.
        ``request_digests`` (optional, one per request, like the keys) is remembered with
        each key, so that :meth:`logged_requests` can tell a retry from a reused key.
        ``label_ids`` names the waiting rows (delayed labels) the chunk learns.
        """
        ...

    def append_waiting(
        self, name: str, ids: Sequence[str], features: np.ndarray, predictions: np.ndarray,
        expires_at: float, expired_ids: Sequence[str] = (),
    ) -> str:
        """Log rows put to wait for their labels (a wait entry) durably; its id.

        ``expired_ids`` names the waiting rows dropped once these are put (their wait ended,
        or too many wait); an entry of no rows logs a drop alone.
        """
        ...

    def read_after(self, name: str, after_id: str | None) -> Iterator[LogEntry]:
        """Entries strictly after ``after_id`` (all of them for None), oldest first.

        Raises :class:`WalGapError` if entries after ``after_id`` were already trimmed.
        """
        ...

    def trim_through(self, name: str, entry_id: str) -> None:
        """Drop every entry up to and including ``entry_id`` (ids keep increasing after)."""
        ...

    def last_id(self, name: str) -> str | None:
        """Id of the newest entry ever appended (even if trimmed since), None if none."""
        ...

    def seen_key(self, name: str, key: str) -> str | None:
        """The id of the entry logged with idempotency ``key`` within the TTL, else None."""
        ...

    def seen_keys(self, name: str, keys: Sequence[str | None]) -> list[str | None]:
        """:meth:`seen_key` for many keys at once (None stays None), in one round trip."""
        ...

    def logged_requests(
        self, name: str, keys: Sequence[str | None]
    ) -> list[LoggedRequest | None]:
        """Entry and digest of each key logged within the TTL (None otherwise), in one trip."""
        ...

    def delete(self, name: str) -> None:
        """Remove the model's log and remembered keys; a no-op for an unknown name."""
        ...

    def check_durability(self) -> None:
        """Raise WalDurabilityError if the configured durability cannot be had (start-up)."""
        ...

    def ping(self) -> bool:
        """True when the log can be written right now; never raises."""
        ...

    def close(self) -> None:
        """Release connections or file handles."""
        ...


# -- entry encoding, shared by both logs --------------------------------------------------------


def check_idempotency_key(key: object) -> str:
    """``key`` if it is a valid idempotency key: 1-200 visible ASCII characters; else ValueError."""
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
        raise ValueError(
            f"idempotency key must be 1-200 visible ASCII characters, got {key!r}"
        )
    return key


def _check_keys(keys: Sequence[str | None] | None) -> list[str | None]:
    if keys is None:
        return []
    if isinstance(keys, str | bytes):
        raise TypeError("idempotency_keys must be a list of str or None, not a single str")
    return [None if k is None else check_idempotency_key(k) for k in keys]


def request_digest(features: np.ndarray, labels: np.ndarray) -> str:
    """A fingerprint of one request's rows and labels, as float32 and int64 values.

    Kept with the request's idempotency key: a retry has the same digest, other data sent
    under a used key does not. The same values in another dtype or byte order give the same
    digest (the service checks rows as float32 before it logs them).
    """
    x = np.ascontiguousarray(features, dtype="<f4")
    y = np.ascontiguousarray(labels, dtype="<i8")
    digest = hashlib.blake2b(digest_size=16)
    digest.update(json.dumps([list(x.shape), list(y.shape)]).encode())
    digest.update(memoryview(x).cast("B"))
    digest.update(memoryview(y).cast("B"))
    return digest.hexdigest()


def _check_digests(
    digests: Sequence[str | None] | None, keys: list[str | None]
) -> list[str | None]:
    """Digests aligned with ``keys`` (all None when not given); ValueError if malformed."""
    if digests is None:
        return [None] * len(keys)
    checked = list(digests)
    if len(checked) != len(keys):
        raise ValueError(f"request_digests has {len(checked)} items for {len(keys)} keys")
    for digest in checked:
        if digest is not None and (not isinstance(digest, str) or not _DIGEST_RE.fullmatch(digest)):
            raise ValueError(f"a request digest must be lowercase hex, got {digest!r}")
    return checked


def _little_endian(a: np.ndarray) -> np.ndarray:
    """``a`` as a C-contiguous array in little-endian byte order (a copy only if needed)."""
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return np.ascontiguousarray(a)


def _check_request_rows(rows: Sequence[int] | None, n: int) -> list[int]:
    if rows is None:
        return []
    counts = [int(r) for r in rows]
    if any(r < 1 for r in counts) or sum(counts) != n:
        raise ValueError(f"request_rows must be positive counts summing to {n}, got {counts}")
    return counts


def _encode_entry(
    features: np.ndarray,
    labels: np.ndarray,
    keys: list[str | None],
    created_at: float,
    request_rows: Sequence[int] | None = None,
    digests: Sequence[str | None] = (),
    label_ids: Sequence[str] = (),
) -> tuple[dict[str, Any], bytes, bytes]:
    """Check the arrays; return the entry's JSON-able header and the two raw byte strings."""
    _check_array(features, 2, "f", "features must be a 2-D float ndarray (n, num_features)")
    _check_array(labels, 1, "iu", "labels must be a 1-D integer ndarray (n,)")
    if len(features) != len(labels):
        raise ValueError(f"features have {len(features)} rows but labels {len(labels)}")
    x, y = _little_endian(features), _little_endian(labels)
    header = {
        "v": _FORMAT,
        "t": created_at,
        "x": {"dtype": x.dtype.str, "shape": list(x.shape)},
        "y": {"dtype": y.dtype.str, "shape": list(y.shape)},
        "keys": keys,
    }
    rows = _check_request_rows(request_rows, len(labels))
    if rows:
        header["rows"] = rows
    if any(digest is not None for digest in digests):
        header["digests"] = list(digests)
    if label_ids:
        header["v"] = _FORMAT_DELAYED_LABELS
        header["label_ids"] = _check_label_ids(label_ids)
    return header, x.tobytes(), y.tobytes()


def _check_array(a: object, ndim: int, kinds: str, requirement: str) -> None:
    """ValueError saying ``requirement`` unless ``a`` is an ndarray of ``ndim`` and a dtype kind
    in ``kinds``."""
    if not isinstance(a, np.ndarray) or a.ndim != ndim or a.dtype.kind not in kinds:
        raise ValueError(
            f"{requirement}, got {getattr(a, 'dtype', type(a).__name__)} "
            f"shape {getattr(a, 'shape', None)}"
        )


def _check_label_ids(ids: Sequence[str]) -> list[str]:
    if isinstance(ids, str | bytes) or not all(isinstance(i, str) for i in ids):
        raise TypeError(f"label ids must be a list of str, got {ids!r}")
    return list(ids)


def _encode_waiting(
    ids: Sequence[str], features: np.ndarray, predictions: np.ndarray, expires_at: float,
    created_at: float, expired_ids: Sequence[str] = (),
) -> tuple[dict[str, Any], bytes, bytes]:
    """A wait entry: the rows as features, their predictions where labels would be."""
    _check_array(predictions, 2, "f", "predictions must be a 2-D float ndarray (n, num_classes)")
    ids = _check_label_ids(ids)
    expired = _check_label_ids(expired_ids)
    if not len(ids) == len(predictions) == len(features):
        raise ValueError(
            f"{len(ids)} ids, {len(features)} feature rows and {len(predictions)} predictions"
        )
    header, x, _ = _encode_entry(features, np.zeros(len(ids), np.int64), [], created_at)
    p = _little_endian(predictions)
    wait: dict[str, Any] = {"ids": ids, "expires_at": float(expires_at)}
    if expired:
        wait["expired"] = expired
    header.update({
        "v": _FORMAT_DELAYED_LABELS,
        "y": {"dtype": p.dtype.str, "shape": list(p.shape)},
        "wait": wait,
    })
    return header, x, p.tobytes()


def _decode_array(spec: object, raw: bytes | memoryview, what: str) -> np.ndarray:
    if not isinstance(spec, dict):
        raise WalCorruptError(f"{what}: no dtype/shape")
    dtype = np.dtype(str(spec.get("dtype")))
    shape = tuple(int(s) for s in spec.get("shape", ()))
    if dtype.kind not in "fiu" or dtype.hasobject:
        raise WalCorruptError(f"{what}: dtype {dtype.str} is not numeric")
    expected = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
    if len(raw) != expected:
        raise WalCorruptError(f"{what}: {len(raw)} bytes, dtype and shape {shape} need {expected}")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def _decode_entry(
    entry_id: str, header: dict[str, Any], x_raw: bytes | memoryview, y_raw: bytes | memoryview
) -> LogEntry:
    """Rebuild a LogEntry; WalCorruptError if the header and the bytes do not fit together."""
    try:
        if header.get("v") not in (_FORMAT, _FORMAT_DELAYED_LABELS):
            raise WalCorruptError(f"entry {entry_id}: unknown format {header.get('v')!r}")
        features = _decode_array(header.get("x"), x_raw, f"entry {entry_id} features")
        second = _decode_array(header.get("y"), y_raw, f"entry {entry_id} labels")
        keys = tuple(header.get("keys") or ())
        created_at = float(header.get("t", 0.0))
        rows = tuple(int(r) for r in header.get("rows") or ())
        digests = tuple(None if d is None else str(d) for d in header.get("digests") or ())
        wait = header.get("wait")
        if wait is not None:
            return _waiting_entry(entry_id, features, second, wait, created_at)
        label_ids = tuple(str(i) for i in header.get("label_ids") or ())
        labels = second
    except WalCorruptError:
        raise
    except (TypeError, ValueError, KeyError) as exc:
        raise WalCorruptError(f"entry {entry_id}: unreadable header {header!r}: {exc}") from exc
    if features.ndim != 2 or labels.ndim != 1 or len(features) != len(labels):
        raise WalCorruptError(f"entry {entry_id}: shapes {features.shape} and {labels.shape}")
    if rows and sum(rows) != len(labels):
        raise WalCorruptError(f"entry {entry_id}: request rows {rows} for {len(labels)} labels")
    if digests and len(digests) != len(keys):
        raise WalCorruptError(f"entry {entry_id}: {len(digests)} digests for {len(keys)} keys")
    return LogEntry(entry_id, features, labels, keys, created_at, rows, digests, label_ids)


def _waiting_entry(
    entry_id: str, features: np.ndarray, predictions: np.ndarray, wait: dict[str, Any],
    created_at: float,
) -> LogEntry:
    ids = tuple(str(i) for i in wait["ids"])
    if features.ndim != 2 or predictions.ndim != 2 or predictions.dtype.kind != "f" or not (
        len(ids) == len(features) == len(predictions)
    ):
        raise WalCorruptError(
            f"entry {entry_id}: {len(ids)} ids, shapes {features.shape} and {predictions.shape}"
        )
    return LogEntry(entry_id, features, np.zeros(0, np.int64), (), created_at,
                    label_ids=ids, predictions=predictions,
                    expires_at=float(wait["expires_at"]),
                    expired_ids=tuple(str(i) for i in wait.get("expired") or ()))


def _check_ttl(idempotency_ttl_s: float) -> float:
    if isinstance(idempotency_ttl_s, bool) or not isinstance(idempotency_ttl_s, int | float) or (
        not idempotency_ttl_s > 0
    ):
        raise ValueError(f"idempotency_ttl_s must be a positive number, got {idempotency_ttl_s!r}")
    return float(idempotency_ttl_s)


class _Entries:
    """``append`` and ``append_waiting`` of a log: checked and encoded here, written by the
    log's own ``_write``."""

    def _write(
        self, name: str, header: dict[str, Any], x: bytes, y: bytes,
        keys: list[str | None], digests: list[str | None], now: float,
    ) -> str:
        raise NotImplementedError

    def append(
        self,
        name: str,
        features: np.ndarray,
        labels: np.ndarray,
        idempotency_keys: Sequence[str | None] | None = None,
        request_rows: Sequence[int] | None = None,
        request_digests: Sequence[str | None] | None = None,
        label_ids: Sequence[str] = (),
    ) -> str:
        """Log one chunk durably; its id (see :meth:`WriteAheadLog.append`)."""
        keys = _check_keys(idempotency_keys)
        digests = _check_digests(request_digests, keys)
        now = time.time()
        header, x, y = _encode_entry(
            features, labels, keys, now, request_rows, digests, label_ids
        )
        return self._write(name, header, x, y, keys, digests, now)

    def append_waiting(
        self, name: str, ids: Sequence[str], features: np.ndarray, predictions: np.ndarray,
        expires_at: float, expired_ids: Sequence[str] = (),
    ) -> str:
        """Log rows put to wait for their labels durably; its id (see
        :meth:`WriteAheadLog.append_waiting`)."""
        now = time.time()
        header, x, y = _encode_waiting(ids, features, predictions, expires_at, now, expired_ids)
        return self._write(name, header, x, y, [], [], now)


class _KeyLookups:
    """``seen_key`` and ``seen_keys`` of a log, read off its ``logged_requests``."""

    def logged_requests(
        self, name: str, keys: Sequence[str | None]
    ) -> list[LoggedRequest | None]:
        raise NotImplementedError

    def seen_key(self, name: str, key: str) -> str | None:
        """The id of the entry logged with idempotency ``key`` within the TTL, else None."""
        return self.seen_keys(name, [key])[0]

    def seen_keys(self, name: str, keys: Sequence[str | None]) -> list[str | None]:
        """The entry ids of :meth:`logged_requests`."""
        return [None if r is None else r.entry_id for r in self.logged_requests(name, keys)]


# -- Redis --------------------------------------------------------------------------------------


def _parse_redis_id(entry_id: str) -> tuple[int, int]:
    match = _REDIS_ID_RE.fullmatch(entry_id) if isinstance(entry_id, str) else None
    if match is None:
        raise ValueError(f"entry id must look like '<ms>-<seq>', got {entry_id!r}")
    return int(match.group(1)), int(match.group(2))


def _next_redis_id(entry_id: str) -> str:
    """The smallest stream id greater than ``entry_id`` (for XTRIM MINID, which keeps it)."""
    ms, seq = _parse_redis_id(entry_id)
    return f"{ms}-{seq + 1}" if seq < _U64_MAX else f"{ms + 1}-0"


def _glob_escape(text: str) -> str:
    """``text`` with Redis glob specials escaped, for SCAN MATCH."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def _server_version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


# XADD, then SET every idempotency key to the new entry's id (and its request's digest, if
# any): one script, so the entry and its keys land together (a MULTI cannot feed XADD's
# generated id into the SETs).
# KEYS: stream, idempotency keys...; ARGV: key TTL in ms, meta JSON, features, labels, then
# one digest per idempotency key ('' for none).
_APPEND_LUA = """
local id = redis.call('XADD', KEYS[1], '*', 'meta', ARGV[2], 'x', ARGV[3], 'y', ARGV[4])
for i = 2, #KEYS do
  local digest = ARGV[i + 3]
  local value = id
  if digest ~= '' then value = id .. ' ' .. digest end
  redis.call('SET', KEYS[i], value, 'PX', ARGV[1], 'NX')
end
return id
"""

# Server-side, so the first and last entries XINFO includes never cross the network.
_STREAM_IDS_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local info = redis.call('XINFO', 'STREAM', KEYS[1])
for i = 1, #info, 2 do
  if info[i] == 'last-generated-id' then return info[i + 1] end
end
return false
"""


class RedisWriteAheadLog(_Entries, _KeyLookups, _RedisClient):
    """The log as one Redis Stream per model, plus one short-lived key per idempotency key.

    Layout (``p`` is ``key_prefix``, ``n`` the model name)::

        p:wal:n             stream; one entry per chunk: fields meta (JSON), x, y (raw bytes)
        p:wal:n:trimmed     id of the last entry trimmed away (to detect replay gaps)
        p:wal:n:key:K       "id digest": the entry idempotency key K was logged with, and its
                            request's digest (just "id" without one); expires

    An append is one server-side script doing the XADD and a ``SET ... PX ttl NX`` per key
    (value: the new entry id and the request's digest), so an entry and its keys land (and
    persist) together, in one round trip. ``durability`` decides when it returns:

    * ``"everysec"``: as soon as Redis has it in memory. What survives a crash of Redis is
      then whatever its own persistence keeps: with ``appendonly yes`` and the default
      ``appendfsync everysec``, all but about the last second.
    * ``"always"``: the same, but first checks that the server runs ``appendonly yes`` with
      ``appendfsync always`` (every write fsynced before it is answered); refuses otherwise.
    * ``"waitaof"``: after the append, ``WAITAOF 1 0`` waits until the local AOF holds it on
      disk (``waitaof_timeout_s`` at most, then :class:`WalDurabilityError`). Needs Redis 7.2
      or newer with ``appendonly yes``.

    The server is checked (for ``"always"`` and ``"waitaof"``) by :meth:`check_durability`,
    which the first append calls; call it at start-up to fail early. Either raises
    :class:`WalDurabilityError` naming what is missing.

    ``read_page_entries`` is how many entries one XRANGE fetches during replay (an entry can
    be a whole chunk, tens of MB); ``socket_timeout`` bounds each Redis call in seconds.
    """

    def __init__(
        self,
        url: str,
        key_prefix: str = "gln",
        durability: Durability = "everysec",
        *,
        idempotency_ttl_s: float = DEFAULT_IDEMPOTENCY_TTL_S,
        waitaof_timeout_s: float = 1.0,
        read_page_entries: int = 8,
        socket_connect_timeout: float = 5.0,
        socket_timeout: float | None = 60.0,
    ) -> None:
        super().__init__(url, key_prefix, socket_connect_timeout, socket_timeout)
        if durability not in _DURABILITIES:
            raise ValueError(f"durability must be one of {_DURABILITIES}, got {durability!r}")
        if not isinstance(read_page_entries, int) or read_page_entries < 1:
            raise ValueError(
                f"read_page_entries must be a positive int, got {read_page_entries!r}"
            )
        if not waitaof_timeout_s > 0:
            raise ValueError(f"waitaof_timeout_s must be positive, got {waitaof_timeout_s!r}")
        self.durability = durability
        self.idempotency_ttl_s = _check_ttl(idempotency_ttl_s)
        self.waitaof_timeout_s = waitaof_timeout_s
        self.read_page_entries = read_page_entries
        self._append_script = self._client.register_script(_APPEND_LUA)
        self._stream_ids = self._client.register_script(_STREAM_IDS_LUA)
        self._checked = False
        self._check_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RedisWriteAheadLog(key_prefix={self.key_prefix!r}, durability={self.durability!r})"

    # -- key names ------------------------------------------------------------------------

    def _stream_key(self, name: str) -> str:
        return f"{self.key_prefix}:wal:{_check_name(name)}"

    def _idem_key(self, name: str, key: str) -> str:
        return f"{self._stream_key(name)}:key:{check_idempotency_key(key)}"

    # -- durability -----------------------------------------------------------------------

    def check_durability(self) -> None:
        """Raise WalDurabilityError unless the server can give ``durability``; else no-op."""
        if self.durability == "everysec":
            self._checked = True
            return
        server = self._client.info("server")
        persistence = self._client.info("persistence")
        version_text = str(server.get("redis_version", "0"))
        problems = []
        if not int(persistence.get("aof_enabled", 0)):
            problems.append("AOF is off (needs 'appendonly yes')")
        if self.durability == "waitaof" and _server_version(version_text) < (7, 2):
            problems.append(f"WAITAOF needs Redis >= 7.2, the server is {version_text}")
        if self.durability == "always":
            try:
                found = self._client.config_get("appendfsync")
                fsync = found.get("appendfsync", found.get(b"appendfsync"))
            except redis.ResponseError as exc:  # CONFIG renamed or forbidden (managed Redis)
                problems.append(f"cannot read 'appendfsync' with CONFIG GET ({exc})")
            else:
                if fsync not in ("always", b"always"):
                    shown = fsync.decode() if isinstance(fsync, bytes) else fsync
                    problems.append(f"'appendfsync' is {shown!r}, not 'always'")
        if problems:
            raise WalDurabilityError(
                f"durability={self.durability!r} is not available: {'; '.join(problems)}. "
                "Fix the Redis configuration or use durability='everysec' "
                "(see docs/durability.md)."
            )
        self._checked = True

    # -- the interface --------------------------------------------------------------------

    def _write(
        self, name: str, header: dict[str, Any], x: bytes, y: bytes,
        keys: list[str | None], digests: list[str | None], now: float,
    ) -> str:
        """XADD the entry and SET its idempotency keys in one atomic script; the entry id.

        With ``durability="waitaof"`` a ``WAITAOF`` follows in the same pipeline (same
        connection, one round trip) and waits for the AOF fsync; if that does not
        come in time, WalDurabilityError says so (the entry *is* logged and will be
        replayed, so report the request as failed and let its idempotency key catch a retry).
        """
        stream = self._stream_key(name)
        if not self._checked:
            with self._check_lock:
                if not self._checked:
                    self.check_durability()
        ttl_ms = max(1, round(self.idempotency_ttl_s * 1000))
        keyed = [(key, digest) for key, digest in zip(keys, digests, strict=True)
                 if key is not None]
        idem = [f"{stream}:key:{key}" for key, _ in keyed]
        idem_digests = [digest or "" for _, digest in keyed]
        # One connection for both commands: WAITAOF waits for *this connection's* writes.
        pipe = self._client.pipeline(transaction=False)
        self._append_script(
            keys=[stream, *idem],
            args=[ttl_ms, json.dumps(header).encode(), x, y, *idem_digests],
            client=pipe,
        )
        if self.durability == "waitaof":
            timeout_ms = max(1, round(self.waitaof_timeout_s * 1000))
            pipe.execute_command("WAITAOF", 1, 0, timeout_ms)
        replies = pipe.execute()
        entry_id = replies[0].decode()
        if self.durability == "waitaof":
            local, _replicas = replies[1]
            if int(local) < 1:
                raise WalDurabilityError(
                    f"entry {entry_id} of {name!r} was not fsynced to the AOF within "
                    f"{self.waitaof_timeout_s} s"
                )
        return entry_id

    def read_after(self, name: str, after_id: str | None) -> Iterator[LogEntry]:
        """XRANGE pages with an exclusive start, ``read_page_entries`` entries per page."""
        stream = self._stream_key(name)
        if after_id is not None:
            _parse_redis_id(after_id)
            self._check_no_gap(name, stream, after_id)
        return self._pages(stream, "-" if after_id is None else f"({after_id}")

    def _pages(self, stream: str, start: str) -> Iterator[LogEntry]:
        while True:
            page = self._client.xrange(stream, min=start, max="+", count=self.read_page_entries)
            for raw_id, fields in page:
                entry_id = raw_id.decode()
                try:
                    header = json.loads(fields[b"meta"])
                    x_raw, y_raw = fields[b"x"], fields[b"y"]
                except (KeyError, ValueError) as exc:
                    raise WalCorruptError(f"{stream} entry {entry_id}: {exc!r}") from exc
                if not isinstance(header, dict):
                    raise WalCorruptError(f"{stream} entry {entry_id}: meta is not an object")
                yield _decode_entry(entry_id, header, x_raw, y_raw)
            if len(page) < self.read_page_entries:
                return
            start = f"({page[-1][0].decode()}"

    def _check_no_gap(self, name: str, stream: str, after_id: str) -> None:
        trimmed = self._client.get(f"{stream}:trimmed")
        if trimmed is not None and _parse_redis_id(trimmed.decode()) > _parse_redis_id(after_id):
            raise WalGapError(
                f"log of {name!r} is trimmed through {trimmed.decode()}, past {after_id}: "
                "the entries in between are gone, so replaying from there would skip examples"
            )

    def trim_through(self, name: str, entry_id: str) -> None:
        """XTRIM MINID <next id> (exact), and remember the trim point, in one MULTI/EXEC."""
        stream = self._stream_key(name)
        cut = _parse_redis_id(entry_id)
        last = self.last_id(name)
        if last is None:
            return  # no stream: nothing to trim
        cut = min(cut, _parse_redis_id(last))  # never mark ids not generated yet as trimmed
        cut_id = f"{cut[0]}-{cut[1]}"
        minid = _next_redis_id(cut_id)
        marker = f"{stream}:trimmed"

        def trim(pipe: redis.client.Pipeline) -> None:
            current = pipe.get(marker)
            newer = current is None or _parse_redis_id(current.decode()) < cut
            pipe.multi()
            pipe.xtrim(stream, minid=minid, approximate=False)
            if newer:
                pipe.set(marker, cut_id)

        self._client.transaction(trim, marker)

    def last_id(self, name: str) -> str | None:
        """The stream's last generated id (it survives XTRIM), None without a stream."""
        found = self._stream_ids(keys=[self._stream_key(name)])
        if not found or found == b"0-0":
            return None
        return found.decode()

    def logged_requests(
        self, name: str, keys: Sequence[str | None]
    ) -> list[LoggedRequest | None]:
        """One MGET for all keys; None for None keys and for keys not (or no longer) known."""
        checked = _check_keys(keys)
        wanted = [self._idem_key(name, k) for k in checked if k is not None]
        found = iter(self._client.mget(wanted) if wanted else [])
        out: list[LoggedRequest | None] = []
        for key in checked:
            value = None if key is None else next(found)
            if not value:
                out.append(None)
                continue
            entry_id, _, digest = value.decode().partition(" ")
            out.append(LoggedRequest(entry_id, digest or None))
        return out

    def delete(self, name: str) -> None:
        """DEL the stream and trim marker, then every remembered key (found with SCAN)."""
        stream = self._stream_key(name)
        self._client.delete(stream, f"{stream}:trimmed")
        pattern = f"{_glob_escape(stream)}:key:*"
        batch: list[bytes] = []
        for key in self._client.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                self._client.delete(*batch)
                batch = []
        if batch:
            self._client.delete(*batch)



# -- files --------------------------------------------------------------------------------------

_FRAME = struct.Struct("<II")  # payload length, CRC-32 of the payload
_HEADER_LEN = struct.Struct("<I")  # inside the payload: length of the JSON header
_LOG_NAME = "wal.log"
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


class FileWriteAheadLog(_Entries, _KeyLookups, _ClosingMixin):
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
        self.idempotency_ttl_s = _check_ttl(idempotency_ttl_s)
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
                state = _FileState(_model_dir_in(self.path, name) / _LOG_NAME)
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
        keys: list[str | None], digests: list[str | None], now: float,
    ) -> str:
        """Write one record (after cutting off any torn tail), fsync it, return its id."""
        with self._state(name) as (state, path):
            entry_id = state.last_id + 1
            record = _frame({"kind": "entry", "id": entry_id, **header}, x, y)
            if state.fd is None:
                created = not path.exists()
                path.parent.mkdir(exist_ok=True)
                state.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                if created:
                    _fsync_dir(path.parent)
                    _fsync_dir(self.path)
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
                yield _decode_entry(str(record.id), header, body[:nx], body[nx:])
        finally:
            os.close(fd)

    def trim_through(self, name: str, entry_id: str) -> None:
        """Rewrite the file without the records up to ``entry_id`` (atomically, fsynced)."""
        cut = _parse_file_id(entry_id)
        with self._state(name) as (state, path):
            cut = min(cut, state.last_id)
            if cut <= state.trimmed_through and not any(r.id <= cut for r in state.records):
                return  # nothing to drop, nothing new to record
            kept = [r for r in state.records if r.id > cut]
            now = time.time()
            live = {
                key: found
                for key, found in state.keys.items()
                if self._key_live(state, key, now) is not None
            }
            trimmed_through = max(state.trimmed_through, cut)
            base = _frame({
                "kind": "base", "v": _FORMAT, "last_id": state.last_id,
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

            _replace_atomically(path, write_trimmed, tmp_prefix=_TMP_PREFIX)
            if state.fd is not None:
                os.close(state.fd)
                state.fd = None
            shift = len(base) - start
            state.records = [_Record(r.id, r.offset + shift, r.size) for r in kept]
            state.end += shift
            state.trimmed_through = trimmed_through
            state.keys = live

    def last_id(self, name: str) -> str | None:
        """The newest id appended (kept across trims by the base record), None if none."""
        with self._state(name) as (state, _):
            return str(state.last_id) if state.last_id else None

    def logged_requests(
        self, name: str, keys: Sequence[str | None]
    ) -> list[LoggedRequest | None]:
        """Each key's entry and digest (None for None and expired keys), from the index."""
        checked = _check_keys(keys)
        now = time.time()
        with self._state(name) as (state, _):
            found = [None if k is None else self._key_live(state, k, now) for k in checked]
        return [None if f is None else LoggedRequest(str(f[0]), f[2]) for f in found]

    def delete(self, name: str) -> None:
        """Remove ``wal.log`` (and leftover temp files); the model directory if now empty."""
        state = self._state_of(name)
        path = state.path
        with state.lock:
            if state.fd is not None:
                os.close(state.fd)
            state.fd, state.loaded = None, False
            if path.parent.is_dir():
                for entry in path.parent.iterdir():
                    if entry.name == _LOG_NAME or entry.name.startswith(_TMP_PREFIX):
                        with contextlib.suppress(FileNotFoundError):
                            entry.unlink()
                with contextlib.suppress(OSError):
                    path.parent.rmdir()  # only if empty: snapshots may share the directory
                _fsync_dir(self.path)

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


def open_wal(
    redis_url: str | None,
    wal_dir: str,
    *,
    key_prefix: str = "gln",
    durability: Durability = "everysec",
    idempotency_ttl_s: float = DEFAULT_IDEMPOTENCY_TTL_S,
    fsync: bool = True,
) -> WriteAheadLog:
    """The Redis log when ``redis_url`` is set (non-empty), else the file log in ``wal_dir``.

    ``durability`` applies to Redis, ``fsync`` to files; ``idempotency_ttl_s`` to both.
    """
    if redis_url:
        return RedisWriteAheadLog(
            redis_url, key_prefix=key_prefix, durability=durability,
            idempotency_ttl_s=idempotency_ttl_s,
        )
    return FileWriteAheadLog(wal_dir, fsync=fsync, idempotency_ttl_s=idempotency_ttl_s)
