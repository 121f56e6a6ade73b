"""The write-ahead log in NATS JetStream: one replicated stream for every model, a subject each
(``NatsWriteAheadLog``).

JetStream keeps each stream in a Raft group: a publish is acknowledged once a majority of the
stream's replicas has stored it, and a new leader is elected only among replicas that hold
every acknowledged message. So an acknowledged append survives the leader being paused
(SIGSTOP) or killed while a majority of the nodes is up, where Redis' asynchronous
replication loses what the old primary acknowledged last (docs/durability.md).

Only this module imports nats-py (asyncio only): it runs on an event loop of its own in a
background thread, and every method here is a blocking call into it, bounded by
``call_timeout_s``.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import logging
import re
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote, unquote

import nats
import nats.errors
import nats.js.errors
import numpy as np
import orjson
from nats.js.api import RetentionPolicy, StorageType, StreamConfig

from service.storage.common import check_name, parse_nats_url
from service.storage.wal.entries import (
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
    WalDurabilityError,
    WalGapError,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

_PREFIX_RE = re.compile(r"[A-Za-z0-9_-]{1,32}")
_ID_RE = re.compile(r"\d+")
_HEADER_LEN = struct.Struct("<I")  # the payload starts with the length of its JSON header
_EXPECTED_LAST = "Nats-Expected-Last-Subject-Sequence"
_WRONG_LAST = 10071  # JetStream's error code: the subject does not end where a publish expected
_WRONG_LAST_RE = re.compile(r"wrong last sequence: (\d+)")
_NOT_FOUND = 10037  # no message
PING_TIMEOUT_S = 2.0
# The start-up check waits this long at least: a cluster that has just formed, or streams just
# made, elect their leaders first (up to a few seconds).
STARTUP_TIMEOUT_S = 15.0
# Time allowed a call for each byte it sends or may receive, on top of call_timeout_s: a 31 MB
# entry took 2.8 s to append to a 3-node cluster, and 1.0 s to read back, on two busy cores.
_SLOWEST_BYTES_PER_S = 8 * 1024 * 1024
_DEFAULT_MAX_PAYLOAD = 1024 * 1024  # NATS' own, until a server says
_UNBOUNDED_S = 24 * 3600.0
# nats-py's pings find a server that stopped answering (SIGSTOP, a dead machine whose TCP
# connection never closed): one every second, and the connection is given up after two unanswered,
# instead of nats-py's two minutes.
_PING_INTERVAL_S = 1.0
_MAX_OUTSTANDING_PINGS = 2


class WalTimeoutError(TimeoutError):
    """A call to NATS got no answer within the log's ``call_timeout_s`` (a leader paused or
    being elected, a server unreachable). A failed append may still have been logged."""


def _model_token(name: str) -> str:
    """``name`` as one subject token: model names are [A-Za-z0-9_.-], and a dot would split
    it in two, so dots become ``~`` (which no name has)."""
    return check_name(name).replace(".", "~")


def _key_token(key: str) -> str:
    """An idempotency key (visible ASCII: ``.``, ``*`` and ``>`` included) as one subject
    token: base64url without padding."""
    return base64.urlsafe_b64encode(key.encode()).rstrip(b"=").decode()


def _parse_id(entry_id: str) -> int:
    if not isinstance(entry_id, str) or not _ID_RE.fullmatch(entry_id):
        raise ValueError(f"entry id must be a decimal number, got {entry_id!r}")
    return int(entry_id)


def _frame(header: dict[str, Any], x: bytes = b"", y: bytes = b"") -> bytes:
    """An entry as one message: [u32 header length][JSON header][x bytes][y bytes]."""
    head = orjson.dumps(header)
    return b"".join([_HEADER_LEN.pack(len(head)), head, x, y])


def _unframe(seq: int, payload: bytes) -> tuple[dict[str, Any], memoryview]:
    view = memoryview(payload)
    try:
        (length,) = _HEADER_LEN.unpack_from(view)
        header = orjson.loads(view[_HEADER_LEN.size:_HEADER_LEN.size + length])
    except (struct.error, ValueError) as exc:
        raise WalCorruptError(f"message {seq}: unreadable entry header ({exc})") from exc
    if not isinstance(header, dict):
        raise WalCorruptError(f"message {seq}: the entry header is not a JSON object")
    return header, view[_HEADER_LEN.size + length:]


def _array_bytes(spec: Any) -> int:
    """Bytes of the array a header's ``{"dtype", "shape"}`` describes."""
    shape = [int(s) for s in spec["shape"]]
    return np.dtype(str(spec["dtype"])).itemsize * int(np.prod(shape, dtype=np.int64))


@dataclass
class _Meta:
    """What a model's log keeps beside its messages (one message on its meta subject).

    ``offset``: added to a message's stream sequence to give its entry id (0 unless
    ``continue_after`` moved the model's ids ahead of the stream). ``trimmed``: the id through
    which entries are trimmed (the last message is never purged, so that the subject ends where
    the log does; it may be one of them).
    """

    offset: int = 0
    trimmed: int = 0


class NatsWriteAheadLog(EntryWriting, KeyLookups, AppendEach):
    """The log in NATS JetStream, replicated by Raft: nothing acknowledged is lost while a
    majority of the stream's replicas is up.

    Layout (``p`` is ``key_prefix``, ``n`` the model name with dots as ``~``, ``K`` an
    idempotency key in base64url)::

        stream p-wal        subjects p.wal.n: one message per entry, [u32 n][JSON header]
                            [x bytes][y bytes]; entry id = stream sequence (+ the model's offset)
        stream p-wal-keys   subjects p.wal-key.n.K: "id time digest" of idempotency key K, one
                            message a subject, removed by JetStream after the TTL (max age)
        stream p-wal-meta   subjects p.wal-meta.n: {"offset", "trimmed"} of the model's log

    The three streams have ``replicas`` replicas (default: 3 where the server is in a cluster,
    1 on a server of its own). One stream for every model: a Raft group per model would cost
    each server a group per model. Entry ids are decimal strings: the stream's sequence only
    grows, so each model's ids do too, across trims and restarts.

    An append publishes the entry (with ``follows``, checked by JetStream itself against the
    subject's last sequence: ``Nats-Expected-Last-Subject-Sequence``) and, once JetStream has
    acknowledged it (a majority of the replicas stored it), one message per idempotency key,
    created only where the key has none yet (the same header, expecting 0), all at once. With
    ``follows`` the keys are first looked up, so that a key logged already refuses the append
    (:class:`WalDivergedError`). An entry and its keys are two writes: should the keys not
    land (a crash, a timeout), the entry is in the log without them, its append failed, and
    the model catches up with the log; reading the log to its end (``read_after``, as a catch-up
    and a restore do) writes the keys of the last entry where they are missing, before it gives
    that entry (so no model applies an entry whose keys are missing). Any entry before the last
    was followed by an append, which the writer made only after that entry's keys were
    written, or after it had read the log to its end.

    ``trim_through`` writes the trim point to the model's meta message, then purges the
    subject through it, keeping its last message: JetStream checks ``follows`` against the
    subject's last sequence, and an empty subject would say 0. Reads skip what is trimmed.

    ``call_timeout_s`` bounds each call (an append with its key checks and writes, a read of
    one entry), plus a second for every 8 MB the call sends (or, reading, the largest message
    the servers take): past it, :class:`WalTimeoutError`. A NATS client connection that stops
    answering is given up after about two seconds and another server of ``url`` tried.
    Messages are limited by the server's ``max_payload`` (1 MB by default, 64 MB at most):
    an entry larger than that is refused (ValueError) before anything is sent.
    """

    def __init__(
        self,
        url: str,
        key_prefix: str = "gln",
        *,
        replicas: int | None = None,
        idempotency_ttl_s: float = DEFAULT_IDEMPOTENCY_TTL_S,
        call_timeout_s: float | None = None,
        connect_timeout_s: float = 2.0,
    ) -> None:
        self.servers = parse_nats_url(url)
        if not isinstance(key_prefix, str) or not _PREFIX_RE.fullmatch(key_prefix):
            raise ValueError("key_prefix of a NATS log must be 1-32 characters from "
                             f"[A-Za-z0-9_-], got {key_prefix!r}")
        if replicas is not None and (isinstance(replicas, bool) or not isinstance(replicas, int)
                                     or not 1 <= replicas <= 5):
            raise ValueError(f"replicas must be an int from 1 to 5 (or None), got {replicas!r}")
        self.key_prefix = key_prefix
        self.replicas = replicas
        self.idempotency_ttl_s = check_ttl(idempotency_ttl_s)
        self.call_timeout_s = 5.0 if call_timeout_s is None else float(call_timeout_s)
        if not self.call_timeout_s > 0:
            raise ValueError(f"call_timeout_s must be positive, got {call_timeout_s!r}")
        self.connect_timeout_s = min(connect_timeout_s, max(self.call_timeout_s, 0.5))
        self.stream = f"{key_prefix}-wal"
        self.keys_stream = f"{key_prefix}-wal-keys"
        self.meta_stream = f"{key_prefix}-wal-meta"
        self._nc: Any = None  # the connection, made on the loop by _connection
        self._js: Any = None
        self._streams_ready = False
        self._offsets: dict[str, int] = {}  # each model's id offset, once read (loop thread)
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._connect_lock: asyncio.Lock | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name=f"gln-nats-wal-{key_prefix}")
        self._thread.start()

    def __repr__(self) -> str:
        replicas = "auto" if self.replicas is None else self.replicas
        return f"NatsWriteAheadLog(key_prefix={self.key_prefix!r}, replicas={replicas})"

    # -- the loop ---------------------------------------------------------------------------

    def _call(self, work: Callable[[], Awaitable[T]], what: str,
              timeout_s: float | None = None) -> T:
        """Run ``work()`` on the log's loop (connected first) and wait for it, at most
        ``timeout_s`` (``call_timeout_s``); WalTimeoutError after that."""
        if self._closed:
            raise RuntimeError("the NATS log is closed")
        timeout_s = self.call_timeout_s if timeout_s is None else timeout_s

        async def bounded() -> T:
            async def connected_work() -> T:
                await self._connection()
                return await work()
            return await asyncio.wait_for(connected_work(), timeout_s)

        future = asyncio.run_coroutine_threadsafe(bounded(), self._loop)
        try:
            return future.result(timeout_s + 1.0)
        except (TimeoutError, concurrent.futures.TimeoutError):
            future.cancel()
            raise WalTimeoutError(
                f"NATS did not answer within {timeout_s:.3g} s ({what}); the log's servers: "
                f"{', '.join(_without_password(s) for s in self.servers)}") from None

    async def _connection(self) -> Any:
        """(loop) The connection, made on first use, with the streams made or checked."""
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        async with self._connect_lock:
            if self._nc is None or self._nc.is_closed:
                nc = nats.NATS()
                try:
                    await nc.connect(
                        servers=self.servers, connect_timeout=self.connect_timeout_s,
                        reconnect_time_wait=0.1, max_reconnect_attempts=-1,
                        ping_interval=_PING_INTERVAL_S,
                        max_outstanding_pings=_MAX_OUTSTANDING_PINGS,
                        pending_size=128 * 1024 * 1024, name="gln-service write-ahead log",
                        error_cb=_log_error, allow_reconnect=True,
                    )
                except BaseException:
                    await _close_quietly(nc)
                    raise
                # Each call is bounded as a whole by _call (its time grows with what it sends);
                # nats-py's own per-request timeout would cut a large entry's publish short.
                self._nc, self._js = nc, nc.jetstream(timeout=_UNBOUNDED_S)
            if not self._streams_ready:
                await self._make_streams()
                self._streams_ready = True
            return self._nc

    async def _make_streams(self) -> None:
        """(loop) Create the three streams where missing; WalDurabilityError where JetStream
        cannot give ``replicas``, or a stream has fewer."""
        replicas = self._replicas()
        wanted = {
            self.stream: StreamConfig(
                name=self.stream, subjects=[f"{self.key_prefix}.wal.*"],
                retention=RetentionPolicy.LIMITS, storage=StorageType.FILE,
                num_replicas=replicas, description="gln-service write-ahead log entries"),
            self.keys_stream: StreamConfig(
                name=self.keys_stream, subjects=[f"{self.key_prefix}.wal-key.>"],
                retention=RetentionPolicy.LIMITS, storage=StorageType.FILE,
                num_replicas=replicas, max_msgs_per_subject=1,
                max_age=self.idempotency_ttl_s,
                description="gln-service idempotency keys of the write-ahead log"),
            self.meta_stream: StreamConfig(
                name=self.meta_stream, subjects=[f"{self.key_prefix}.wal-meta.*"],
                retention=RetentionPolicy.LIMITS, storage=StorageType.FILE,
                num_replicas=replicas, max_msgs_per_subject=1,
                description="gln-service write-ahead log: each model's trim point"),
        }
        for name, config in wanted.items():
            try:
                info = await self._js.stream_info(name)
            except nats.js.errors.NotFoundError:
                info = None
            except nats.js.errors.ServiceUnavailableError as exc:
                raise WalDurabilityError(
                    f"the NATS server has no JetStream (enable it: 'jetstream {{}}' in its "
                    f"configuration): {exc}") from exc
            try:
                if info is None:
                    await self._js.add_stream(config)
                    continue
            except nats.js.errors.APIError as exc:
                raise WalDurabilityError(
                    f"cannot create the log's stream {name!r} with {replicas} replica(s): "
                    f"{exc.description} (a JetStream cluster of at least {replicas} servers "
                    "is needed; see docs/durability.md)") from exc
            found = info.config.num_replicas or 1
            if found < replicas:
                raise WalDurabilityError(
                    f"the log's stream {name!r} has {found} replica(s), fewer than the "
                    f"{replicas} asked for: raise them (nats stream edit {name} --replicas "
                    f"{replicas}) or ask for fewer")
            if name == self.keys_stream and info.config.max_age != config.max_age:
                info.config.max_age = config.max_age  # the TTL changed since it was made
                await self._js.update_stream(info.config)
        for name in wanted:  # a stream just made elects its leader before it takes writes
            while True:
                info = await self._js.stream_info(name)
                if info.cluster is None or info.cluster.leader:
                    break
                await asyncio.sleep(0.05)

    def _replicas(self) -> int:
        """``replicas``, or 3 where the server is in a cluster and 1 where it is alone."""
        if self.replicas is not None:
            return self.replicas
        return 3 if self._nc._server_info.get("cluster") else 1

    # -- subjects and small reads ----------------------------------------------------------

    def _subject(self, name: str) -> str:
        return f"{self.key_prefix}.wal.{_model_token(name)}"

    def _key_subject(self, name: str, key: str) -> str:
        return f"{self.key_prefix}.wal-key.{_model_token(name)}.{_key_token(key)}"

    def _meta_subject(self, name: str) -> str:
        return f"{self.key_prefix}.wal-meta.{_model_token(name)}"

    async def _last(self, stream: str, subject: str) -> Any | None:
        """(loop) The last message on ``subject``, None if it has none (from the leader)."""
        try:
            return await self._js.get_msg(stream, subject=subject)
        except nats.js.errors.NotFoundError:
            return None

    async def _next(self, subject: str, seq: int) -> Any | None:
        """(loop) The first message of the log's stream on ``subject`` at ``seq`` or later."""
        try:
            return await self._js.get_msg(self.stream, seq=max(seq, 1), subject=subject,
                                          next=True)
        except nats.js.errors.NotFoundError:
            return None

    async def _meta(self, name: str) -> _Meta:
        """(loop) The model's meta (its offset remembered)."""
        found = await self._last(self.meta_stream, self._meta_subject(name))
        meta = _Meta()
        if found is not None and found.data:
            try:
                fields = json.loads(found.data)
                meta = _Meta(int(fields["offset"]), int(fields["trimmed"]))
            except (ValueError, KeyError, TypeError) as exc:
                raise WalCorruptError(f"the log meta of {name!r} is unreadable: {exc}") from exc
        self._offsets[name] = meta.offset
        return meta

    async def _offset(self, name: str) -> int:
        offset = self._offsets.get(name)
        return (await self._meta(name)).offset if offset is None else offset

    async def _put_meta(self, name: str, meta: _Meta) -> None:
        await self._js.publish(self._meta_subject(name), json.dumps(
            {"offset": meta.offset, "trimmed": meta.trimmed}).encode(), stream=self.meta_stream)
        self._offsets[name] = meta.offset

    async def _last_seq(self, name: str) -> int:
        last = await self._last(self.stream, self._subject(name))
        return 0 if last is None else int(last.seq)

    async def _last_id(self, name: str) -> int | None:
        meta_read = asyncio.ensure_future(self._meta(name))
        last_seq = await self._last_seq(name)
        meta = await meta_read
        if not last_seq:
            return meta.trimmed or None  # nothing left (a delete cut short): the trim point
        return last_seq + meta.offset

    # -- the interface ----------------------------------------------------------------------

    def _write(
        self, name: str, header: dict[str, Any], x: bytes, y: bytes,
        keys: list[str | None], digests: list[str | None], now: float, follows: str | None,
    ) -> str:
        """Publish the entry (checked against ``follows``), then its idempotency keys."""
        subject = self._subject(name)
        expected = None if follows in (ANY_END, None) else _parse_id(follows)
        keyed = [(k, d) for k, d in zip(keys, digests, strict=True) if k is not None]
        payload = _frame(header, x, y)

        async def write() -> str:
            limit = self._nc.max_payload
            if len(payload) > limit:
                raise ValueError(
                    f"a log entry of {len(payload):,} bytes is larger than the NATS server's "
                    f"max_payload ({limit:,} bytes): raise max_payload (64MB at most) in the "
                    "servers' configuration, or lower GLN_MAX_CHUNK_ROWS")
            offset = await self._offset(name)
            if follows != ANY_END and keyed:
                found = await self._lookup(name, [k for k, _ in keyed])
                for (key, _), known in zip(keyed, found, strict=True):
                    if known is not None:
                        last = await self._last_id(name)
                        raise WalDivergedError(name, follows, _text(last), key)
            headers = None
            if follows != ANY_END:
                seq = 0 if expected is None else expected - offset
                if seq < 0:  # an id from before the model's ids moved ahead
                    raise WalDivergedError(name, follows, _text(await self._last_id(name)))
                headers = {_EXPECTED_LAST: str(seq)}
            try:
                ack = await self._js.publish(subject, payload, stream=self.stream,
                                             headers=headers)
            except nats.js.errors.APIError as exc:
                if exc.err_code == _WRONG_LAST:
                    found = _WRONG_LAST_RE.search(exc.description or "")
                    last_seq = int(found.group(1)) if found else 0
                    raise WalDivergedError(
                        name, follows, str(last_seq + offset) if last_seq else None) from exc
                raise
            entry_id = int(ack.seq) + offset
            await self._create_keys(name, entry_id, now, keyed)
            return str(entry_id)

        return self._call(write, f"append to the log of {name!r}",
                          self.call_timeout_s + len(payload) / _SLOWEST_BYTES_PER_S)

    async def _create_keys(
        self, name: str, entry_id: int, logged_at: float, keyed: list[tuple[str, str | None]],
    ) -> None:
        """(loop) Write each key's message unless the key has one (within its TTL) already:
        a key keeps naming the entry it was first logged with."""
        async def create(key: str, digest: str | None) -> None:
            subject = self._key_subject(name, key)
            value = f"{entry_id} {logged_at!r}" + (f" {digest}" if digest else "")
            expect = 0
            for _ in range(3):  # an expired key is replaced (JetStream may not have dropped it)
                try:
                    await self._js.publish(subject, value.encode(), stream=self.keys_stream,
                                           headers={_EXPECTED_LAST: str(expect)})
                    return
                except nats.js.errors.APIError as exc:
                    if exc.err_code != _WRONG_LAST:
                        raise
                held = await self._last(self.keys_stream, subject)
                if held is None:
                    expect = 0
                elif self._live(held.data) is not None:
                    return  # logged with another entry, within the TTL: it stays
                else:
                    expect = int(held.seq)
            raise WalCorruptError(f"idempotency key {key!r} of {name!r} keeps changing")

        await asyncio.gather(*(create(key, digest) for key, digest in keyed))

    def _live(self, value: bytes | None) -> LoggedRequest | None:
        """A key message's entry and digest, None once older than the TTL."""
        if not value:
            return None
        try:
            entry_id, logged_at, *digest = value.decode().split(" ")
            if time.time() - float(logged_at) >= self.idempotency_ttl_s:
                return None
            return LoggedRequest(str(int(entry_id)), digest[0] if digest else None)
        except (ValueError, UnicodeDecodeError) as exc:
            raise WalCorruptError(f"an idempotency key's message is unreadable: {exc}") from exc

    async def _lookup(self, name: str, keys: list[str]) -> list[LoggedRequest | None]:
        """(loop) Each key's entry and digest, all asked at once (one round trip)."""
        found = await asyncio.gather(*(self._last(self.keys_stream, self._key_subject(name, k))
                                       for k in keys))
        return [None if msg is None else self._live(msg.data) for msg in found]

    def logged_requests(
        self, name: str, keys: Sequence[str | None]
    ) -> list[LoggedRequest | None]:
        """The keys' messages, asked for all at once; None for None, unknown and expired."""
        checked = check_keys(keys)
        _model_token(name)
        wanted = [k for k in checked if k is not None]
        if not wanted:
            return [None] * len(checked)
        found = iter(self._call(lambda: self._lookup(name, wanted),
                                f"look up idempotency keys of {name!r}"))
        return [None if k is None else next(found) for k in checked]

    def read_after(self, name: str, after_id: str | None) -> Iterator[LogEntry]:
        """Entries after ``after_id``, one message per read; WalGapError if trimmed past it."""
        subject = self._subject(name)
        after = 0 if after_id is None else _parse_id(after_id)
        meta = self._call(lambda: self._meta(name), f"read the log meta of {name!r}")
        if after_id is not None and meta.trimmed > after:
            raise WalGapError(
                f"log of {name!r} is trimmed through {meta.trimmed}, past {after_id}: the "
                "entries in between are gone, so replaying from there would skip examples")
        start = max(after, meta.trimmed) - meta.offset + 1
        return self._entries(name, subject, start, meta.offset)

    def _entries(self, name: str, subject: str, seq: int, offset: int) -> Iterator[LogEntry]:
        """The entries from ``seq`` on, each read one ahead: the last one's keys are written
        (where missing) before it is given, so that no model applies an entry whose keys a
        retry could miss."""
        def read(at: int) -> Any | None:
            return self._call(lambda: self._next(subject, at), f"read the log of {name!r}",
                              self._read_timeout_s())

        message = read(seq)
        while message is not None:
            following = read(int(message.seq) + 1)
            header, body = _unframe(int(message.seq), message.data or b"")
            if header.get("kind") != "base":  # continue_after's marker is no entry
                entry_id = str(int(message.seq) + offset)
                try:
                    nx = _array_bytes(header["x"])
                except (KeyError, ValueError, TypeError, IndexError) as exc:
                    raise WalCorruptError(
                        f"entry {entry_id}: unreadable header {header!r}") from exc
                entry = decode_entry(entry_id, header, body[:nx], body[nx:])
                if following is None and any(k is not None for k in entry.idempotency_keys):
                    self._restore_keys(name, entry)
                yield entry
            message = following

    def _read_timeout_s(self) -> float:
        """``call_timeout_s``, and time for the largest message the servers take."""
        nc = self._nc
        largest = nc.max_payload if nc is not None and nc.is_connected else _DEFAULT_MAX_PAYLOAD
        return self.call_timeout_s + largest / _SLOWEST_BYTES_PER_S

    def _restore_keys(self, name: str, entry: LogEntry) -> None:
        """Write the keys of the log's last entry where they are missing (its append may have
        failed between the entry and its keys: see the class docstring)."""
        if time.time() - entry.created_at >= self.idempotency_ttl_s:
            return
        digests = entry.request_digests or (None,) * len(entry.idempotency_keys)
        keyed = [(k, d) for k, d in zip(entry.idempotency_keys, digests, strict=True)
                 if k is not None]
        self._call(lambda: self._create_keys(name, int(entry.id), entry.created_at, keyed),
                   f"write the idempotency keys of {name!r}'s last entry")

    def trim_through(self, name: str, entry_id: str) -> None:
        """Write the trim point, then purge the subject through it (keeping its last
        message)."""
        subject = self._subject(name)
        cut = _parse_id(entry_id)

        async def trim() -> None:
            meta_read = asyncio.ensure_future(self._meta(name))
            last_seq = await self._last_seq(name)
            meta = await meta_read
            if not last_seq:
                return
            last = last_seq + meta.offset
            cut_id = min(cut, last)  # never mark ids not generated yet as trimmed
            if cut_id > meta.trimmed:
                await self._put_meta(name, _Meta(meta.offset, cut_id))
            # Purge below the first message to keep: the one after the cut, or the last.
            keep_from = min(max(cut_id, meta.trimmed) - meta.offset + 1, last_seq)
            if keep_from > 1:
                await self._js.purge_stream(self.stream, subject=subject, seq=keep_from)

        self._call(trim, f"trim the log of {name!r}")

    def continue_after(self, name: str, entry_id: str) -> None:
        """Publish a marker message whose id is ``entry_id`` (moving the model's ids ahead of
        the stream's sequence, by its offset, where needed) and count everything through it
        as trimmed; nothing if the log reaches ``entry_id`` already."""
        subject = self._subject(name)
        wanted = _parse_id(entry_id)

        async def move() -> None:
            meta_read = asyncio.ensure_future(self._meta(name))
            last_seq = await self._last_seq(name)
            meta = await meta_read
            if last_seq and last_seq + meta.offset >= wanted:
                return
            ack = await self._js.publish(subject, _frame({"kind": "base"}), stream=self.stream,
                                         headers={_EXPECTED_LAST: str(last_seq)})
            marker = int(ack.seq)
            offset = max(meta.offset, wanted - marker)
            await self._put_meta(name, _Meta(offset, marker + offset))
            await self._js.purge_stream(self.stream, subject=subject, seq=marker)

        self._call(move, f"move the ids of {name!r} ahead")

    def last_id(self, name: str) -> str | None:
        """The id of the subject's last message (never purged by a trim), None if none."""
        _model_token(name)
        return _text(self._call(lambda: self._last_id(name), f"read the end of {name!r}"))

    def reaches(self, name: str, entry_id: str) -> bool:
        """True when the log's newest id is ``entry_id`` or later."""
        wanted = _parse_id(entry_id)
        last = self.last_id(name)
        return last is not None and int(last) >= wanted

    def delete(self, name: str) -> None:
        """Purge the model's subject, its keys' subjects and its meta."""
        subject = self._subject(name)

        async def purge() -> None:
            await self._js.purge_stream(self.stream, subject=subject)
            await self._js.purge_stream(
                self.keys_stream, subject=f"{self.key_prefix}.wal-key.{_model_token(name)}.>")
            await self._js.purge_stream(self.meta_stream, subject=self._meta_subject(name))
            self._offsets.pop(name, None)

        self._call(purge, f"delete the log of {name!r}")

    def wait_durable(self) -> None:
        """Nothing to wait for: JetStream acknowledges a publish once a majority of the
        replicas stored it, and serves reads of what is committed only."""

    def check_durability(self) -> None:
        """Connect and make (or check) the streams, waiting (``STARTUP_TIMEOUT_S`` at least)
        until each has a leader; WalDurabilityError if JetStream cannot give the replicas
        asked for. Warns where the servers' max_payload is under 8 MB."""
        limit = self._call(lambda: self._max_payload(), "connect to NATS",
                           max(self.call_timeout_s, STARTUP_TIMEOUT_S))
        if limit < 8 * 1024 * 1024:
            log.warning(
                "the NATS servers take messages of %s bytes at most (max_payload): a learn "
                "chunk larger than that cannot be logged (a 10,000-row chunk of 784 float32 "
                "features is 31 MB). Set max_payload: 64MB in their configuration, or lower "
                "GLN_MAX_CHUNK_ROWS (docs/durability.md).", f"{limit:,}")

    async def _max_payload(self) -> int:
        return int(self._nc.max_payload)

    def ping(self) -> bool:
        """True when the log's stream answers and has a leader; never raises."""
        async def leader() -> bool:
            info = await self._js.stream_info(self.stream)
            return info.cluster is None or bool(info.cluster.leader)

        try:
            return self._call(leader, "ping", timeout_s=min(self.call_timeout_s, PING_TIMEOUT_S))
        except Exception:
            return False

    def reconnect(self) -> None:
        """Drop the connection (the next call makes a new one) and what was read of the
        models' offsets."""
        if self._closed:
            return

        async def drop() -> None:
            nc, self._nc = self._nc, None
            self._offsets.clear()
            await _close_quietly(nc)

        asyncio.run_coroutine_threadsafe(drop(), self._loop).result(self.call_timeout_s + 1)

    def close(self) -> None:
        """Close the connection and stop the log's thread."""
        if self._closed:
            return
        self._closed = True

        async def shut() -> None:
            await _close_quietly(self._nc)
            self._nc = None

        try:
            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(self.call_timeout_s + 1)
        except (TimeoutError, concurrent.futures.TimeoutError):
            log.warning("closing the NATS log's connection took over %g s",
                        self.call_timeout_s + 1)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5.0)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> NatsWriteAheadLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _text(entry_id: int | None) -> str | None:
    return None if entry_id is None else str(entry_id)


async def _close_quietly(nc: Any) -> None:
    if nc is None:
        return
    try:
        await asyncio.wait_for(nc.close(), 2.0)
    except Exception as exc:  # closing a connection that broke: nothing left to do
        log.debug("closing a NATS connection: %s", exc)


async def _log_error(exc: Exception) -> None:
    log.debug("NATS connection: %s: %s", type(exc).__name__, exc)


def _without_password(server: str) -> str:
    """``server`` with the password of its user part replaced by ``***``."""
    scheme, _, rest = server.partition("://")
    user, at, host = rest.rpartition("@")
    if not at:
        return server
    name, colon, _ = unquote(user).partition(":")
    return f"{scheme}://{quote(name)}{':***' if colon else ''}@{host}"
