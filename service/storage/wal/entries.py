"""Log entries as both logs store them: the checks of what is appended, and the encoding of an
entry into a JSON header and raw array bytes (never pickles), and back.

The two logs share ``EntryWriting`` (``append`` and ``append_waiting``, which check and encode
an entry (:func:`encode_append`) and hand it to the log's own ``_write``) and ``KeyLookups``
(``seen_key`` and ``seen_keys`` read off the log's ``logged_requests``).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from service.errors import shown
from service.storage.wal.interface import (
    ANY_END,
    LogAppend,
    LogEntry,
    LoggedRequest,
    WalCorruptError,
)

FORMAT = 1
"""Version of the entry encoding (JSON header + raw array bytes); bumped on any change."""

FORMAT_DELAYED_LABELS = 2
"""Entries about delayed labels (wait entries, learn entries naming ids) are written with this
version, so a server that predates them refuses them instead of learning a wait entry's
predictions as labels; plain learn entries keep version 1."""

FORMAT_BIRTH = 3
"""A model's birth (its configuration, logged at create in place of a first snapshot) is written
with this version, so that a server that predates births refuses it instead of taking the
model for one it never had."""

_KEY_RE = re.compile(r"[\x21-\x7e]{1,200}")
_DIGEST_RE = re.compile(r"[0-9a-f]{1,128}")


def check_idempotency_key(key: object) -> str:
    """``key`` if it is a valid idempotency key: 1-200 visible ASCII characters; else ValueError
    saying what one is, and showing (the start of) what came."""
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
        raise ValueError("an idempotency key is 1 to 200 visible ASCII "
                         f"characters without spaces, got {shown(key)}")
    return key


def check_keys(keys: Sequence[str | None] | None) -> list[str | None]:
    """The request's idempotency keys as a list (None: the request has none), each checked
    by :func:`check_idempotency_key`; TypeError for a bare string where a list was meant."""
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
    # The shapes as JSON would write them, "[[n, d], [n]]" (what logs hold was digested so);
    # formatted by hand, as json.dumps was a third of a single row's digest.
    digest.update(f"[{_json_ints(x.shape)}, {_json_ints(y.shape)}]".encode())
    digest.update(memoryview(x).cast("B"))
    digest.update(memoryview(y).cast("B"))
    return digest.hexdigest()


def _json_ints(values: Sequence[int]) -> str:
    """``json.dumps(list(values))`` of integers."""
    return "[" + ", ".join(str(int(v)) for v in values) + "]"


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
    start: int | None = None,
) -> tuple[dict[str, Any], bytes, bytes]:
    """Check the arrays; return the entry's JSON-able header and the two raw byte strings."""
    _check_array(features, 2, "f", "features must be a 2-D float ndarray (n, num_features)")
    _check_array(labels, 1, "iu", "labels must be a 1-D integer ndarray (n,)")
    if len(features) != len(labels):
        raise ValueError(f"features have {len(features)} rows but labels {len(labels)}")
    x, y = _little_endian(features), _little_endian(labels)
    header = {
        "v": FORMAT,
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
        header["v"] = FORMAT_DELAYED_LABELS
        header["label_ids"] = _check_label_ids(label_ids)
    if start is not None:
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ValueError(f"start must be a count of examples, got {start!r}")
        header["start"] = start
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
        "v": FORMAT_DELAYED_LABELS,
        "y": {"dtype": p.dtype.str, "shape": list(p.shape)},
        "wait": wait,
    })
    return header, x, p.tobytes()


def _encode_birth(config: Mapping[str, Any], created_at: float
                  ) -> tuple[dict[str, Any], bytes, bytes]:
    """A birth entry: no rows, the model's configuration (JSON: what ``GLN.config`` gives)."""
    if not isinstance(config, Mapping):
        raise TypeError(f"a birth's configuration must be a mapping, got {type(config).__name__}")
    header, x, y = _encode_entry(np.zeros((0, 0), np.float32), np.zeros(0, np.int64), [],
                                 created_at)
    header.update({"v": FORMAT_BIRTH, "born": dict(config)})
    json.dumps(header["born"])  # TypeError now, for what no log could write
    return header, x, y


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


def decode_entry(
    entry_id: str, header: dict[str, Any], x_raw: bytes | memoryview, y_raw: bytes | memoryview
) -> LogEntry:
    """Rebuild a LogEntry; WalCorruptError if the header and the bytes do not fit together."""
    try:
        if header.get("v") not in (FORMAT, FORMAT_DELAYED_LABELS, FORMAT_BIRTH):
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
        config = header.get("born")
        if config is not None and not isinstance(config, dict):
            raise WalCorruptError(f"entry {entry_id}: a birth's configuration is not an object")
        label_ids = tuple(str(i) for i in header.get("label_ids") or ())
        start = header.get("start")
        start = None if start is None else int(start)
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
    if config is not None and len(labels):
        raise WalCorruptError(f"entry {entry_id}: a birth holds no rows, this one {len(labels)}")
    return LogEntry(entry_id, features, labels, keys, created_at, rows, digests, label_ids,
                    start=start, config=config)


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


def check_ttl(idempotency_ttl_s: float) -> float:
    """``idempotency_ttl_s`` if it is a positive number of seconds, else ValueError."""
    if isinstance(idempotency_ttl_s, bool) or not isinstance(idempotency_ttl_s, int | float) or (
        not idempotency_ttl_s > 0
    ):
        raise ValueError(f"idempotency_ttl_s must be a positive number, got {idempotency_ttl_s!r}")
    return float(idempotency_ttl_s)


class EncodedAppend(NamedTuple):
    """An append checked and encoded: what a log's ``_write`` takes."""

    name: str
    header: dict[str, Any]
    x: bytes
    y: bytes
    keys: list[str | None]
    digests: list[str | None]
    now: float
    follows: str | None


def encode_append(item: LogAppend) -> EncodedAppend:
    """``item`` checked (ValueError or TypeError saying what is wrong) and encoded, stamped
    with the time now."""
    now = time.time()
    if item.config is not None:
        header, x, y = _encode_birth(item.config, now)
        return EncodedAppend(item.name, header, x, y, [], [], now, item.follows)
    if item.waiting:
        assert item.predictions is not None
        header, x, y = _encode_waiting(item.label_ids, item.features, item.predictions,
                                       item.expires_at, now, item.expired_ids)
        return EncodedAppend(item.name, header, x, y, [], [], now, item.follows)
    keys = check_keys(item.idempotency_keys)
    digests = _check_digests(item.request_digests, keys)
    header, x, y = _encode_entry(item.features, item.labels, keys, now,  # type: ignore[arg-type]
                                 item.request_rows, digests, item.label_ids, item.start)
    return EncodedAppend(item.name, header, x, y, keys, digests, now, item.follows)


class EntryWriting:
    """``append`` and ``append_waiting`` of a log: checked and encoded here, written by the
    log's own ``_write``."""

    def _write(
        self, name: str, header: dict[str, Any], x: bytes, y: bytes,
        keys: list[str | None], digests: list[str | None], now: float, follows: str | None,
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
        *,
        follows: str | None = ANY_END,
        start: int | None = None,
    ) -> str:
        """Log one chunk durably; its id (see :meth:`WriteAheadLog.append`)."""
        return self._write(*encode_append(LogAppend(
            name, features, labels, idempotency_keys, request_rows, request_digests, label_ids,
            follows, start)))

    def append_waiting(
        self, name: str, ids: Sequence[str], features: np.ndarray, predictions: np.ndarray,
        expires_at: float, expired_ids: Sequence[str] = (), *, follows: str | None = ANY_END,
    ) -> str:
        """Log rows put to wait for their labels durably; its id (see
        :meth:`WriteAheadLog.append_waiting`)."""
        _check_array(predictions, 2, "f",
                     "predictions must be a 2-D float ndarray (n, num_classes)")
        return self._write(*encode_append(LogAppend(
            name, features, label_ids=ids, follows=follows, predictions=predictions,
            expires_at=expires_at, expired_ids=expired_ids)))

    def append_birth(self, name: str, config: Mapping[str, Any], *,
                     follows: str | None = None) -> str:
        """Log a model's birth durably; its id (see :meth:`WriteAheadLog.append_birth`)."""
        return self._write(*encode_append(LogAppend(
            name, np.zeros((0, 0), np.float32), follows=follows, config=config)))


class KeyLookups:
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
