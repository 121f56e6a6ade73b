"""Write-ahead log: every learned chunk is logged before it is applied, so a crash loses nothing.

Snapshots (``service/storage/store/``) are taken every so often; the log covers the time between
them. The learn worker appends each coalesced chunk of examples to the model's log with one
write, then applies it to the model, then answers every request in the chunk. A snapshot
records the id of the last entry it includes (snapshot metadata); once the snapshot is the
current one, the log is trimmed through that id. At start-up a model is restored from its
snapshot and the entries after that id are replayed in order. ``docs/durability.md`` says
what survives what.

Three implementations share the :class:`WriteAheadLog` interface (``interface.py``):

* :class:`RedisWriteAheadLog` (``redis_log.py``) keeps one Redis Stream per model (``XADD`` /
  ``XRANGE`` / ``XTRIM MINID``). Its ``durability`` decides when an append counts as done.
* :class:`FileWriteAheadLog` (``file_log.py``) keeps one log for every model of its directory:
  segment files under ``wal~/``, each record tagged with its model and checked by a CRC-32,
  an index per model built by one scan at opening. Appends that arrive together share one
  write and one fdatasync (group commit); trimmed segments are deleted.
* ``NatsWriteAheadLog`` (``nats_log.py``) keeps one subject per model in a NATS JetStream
  stream replicated by Raft (three servers: nothing acknowledged is lost while two are up).
  It is imported only when asked for (``open_wal(..., wal_url=...)``): nats-py is an extra.

Several appends, of many models, can be logged together (:meth:`WriteAheadLog.append_many`,
one :class:`LogAppend` each): the file log writes them with one write and one fdatasync, the
Redis and NATS logs one after another (:class:`AppendEach`).

A model's birth can be logged too (:meth:`WriteAheadLog.append_birth`: its configuration, no
rows), in place of the first snapshot a create would otherwise wait for, where the log can
list its models (:class:`ModelListing`: the file and Redis logs): a restore finds the birth of
a model that has no snapshot yet, builds it, and replays what follows.

Entries (``entries.py``) carry raw array bytes plus their dtype and shape, never pickles. An
append may carry idempotency keys (one per request of the chunk, or None for a request without
one) and each keyed request's :func:`request_digest`; the log remembers for
``idempotency_ttl_s`` seconds which entry each key was logged with, and the digest, so a
retried request can be recognised (:meth:`WriteAheadLog.seen_key`) and not learned twice, and a
key reused for other data told from a retry (:meth:`WriteAheadLog.logged_requests`).

Entry ids are strings, opaque to callers: Redis stream ids (``"1712345678901-0"``), in
files decimal counters (``"1"``, ``"2"``, ...), in NATS the stream's sequence numbers. Ids
only ever increase for a model, also across trims and restarts;
:meth:`WriteAheadLog.delete` starts a model's log afresh.

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

from service.storage.wal.entries import check_idempotency_key, request_digest
from service.storage.wal.file_log import FileWriteAheadLog
from service.storage.wal.interface import (
    ANY_END,
    DEFAULT_IDEMPOTENCY_TTL_S,
    AppendEach,
    Durability,
    LogAppend,
    LogEntry,
    LoggedRequest,
    ModelListing,
    WalCorruptError,
    WalDivergedError,
    WalDurabilityError,
    WalGapError,
    WriteAheadLog,
)
from service.storage.wal.redis_log import RedisWriteAheadLog

__all__ = [
    "ANY_END",
    "DEFAULT_IDEMPOTENCY_TTL_S",
    "AppendEach",
    "Durability",
    "FileWriteAheadLog",
    "LogAppend",
    "LogEntry",
    "LoggedRequest",
    "ModelListing",
    "RedisWriteAheadLog",
    "WalCorruptError",
    "WalDivergedError",
    "WalDurabilityError",
    "WalGapError",
    "WriteAheadLog",
    "check_idempotency_key",
    "open_wal",
    "request_digest",
]


def open_wal(
    redis_url: str | None,
    wal_dir: str,
    *,
    key_prefix: str = "gln",
    durability: Durability = "everysec",
    idempotency_ttl_s: float = DEFAULT_IDEMPOTENCY_TTL_S,
    fsync: bool = True,
    replicas: int = 0,
    call_timeout_s: float | None = None,
    wal_url: str | None = None,
    stream_replicas: int | None = None,
) -> WriteAheadLog:
    """The NATS JetStream log when ``wal_url`` is set (non-empty), else the Redis log when
    ``redis_url`` is set, else the file log in ``wal_dir``.

    ``durability`` and ``replicas`` apply to Redis, ``stream_replicas`` to NATS (None: 3 in a
    cluster, 1 on a server alone), ``call_timeout_s`` to both, ``fsync`` to files;
    ``idempotency_ttl_s`` to all three.
    """
    if wal_url:
        if replicas:
            raise ValueError("replicas needs the Redis log; the NATS log has stream_replicas")
        from service.storage.wal.nats_log import NatsWriteAheadLog  # nats-py: an extra

        return NatsWriteAheadLog(
            wal_url, key_prefix=key_prefix, replicas=stream_replicas,
            idempotency_ttl_s=idempotency_ttl_s, call_timeout_s=call_timeout_s,
        )
    if stream_replicas is not None:
        raise ValueError("stream_replicas needs the NATS log (a wal_url)")
    if redis_url:
        return RedisWriteAheadLog(
            redis_url, key_prefix=key_prefix, durability=durability,
            idempotency_ttl_s=idempotency_ttl_s, replicas=replicas,
            call_timeout_s=call_timeout_s,
        )
    if replicas:
        raise ValueError("replicas needs the Redis log (a redis_url)")
    return FileWriteAheadLog(wal_dir, fsync=fsync, idempotency_ttl_s=idempotency_ttl_s)
