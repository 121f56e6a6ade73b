"""The write-ahead log in Redis: one Stream per model (``RedisWriteAheadLog``)."""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import redis

from service.storage import RedisClient, check_name
from service.wal.entries import (
    EntryWriting,
    KeyLookups,
    check_idempotency_key,
    check_keys,
    check_ttl,
    decode_entry,
)
from service.wal.interface import (
    DEFAULT_IDEMPOTENCY_TTL_S,
    Durability,
    LogEntry,
    LoggedRequest,
    WalCorruptError,
    WalDurabilityError,
    WalGapError,
)

_DURABILITIES = ("everysec", "always", "waitaof")
WAITAOF_MIN_HZ = 100
"""Below this Redis ``hz`` a WAITAOF waits 10 ms or more (measured: about 100, 10 and 2 ms at
hz 10, 100 and 500), and the log warns at start-up."""
_REDIS_ID_RE = re.compile(r"(\d+)-(\d+)")
_U64_MAX = 2**64 - 1

log = logging.getLogger(__name__)


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


class RedisWriteAheadLog(EntryWriting, KeyLookups, RedisClient):
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
        self.idempotency_ttl_s = check_ttl(idempotency_ttl_s)
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
        return f"{self.key_prefix}:wal:{check_name(name)}"

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
                fsync = self._config("appendfsync")
            except redis.ResponseError as exc:  # CONFIG renamed or forbidden (managed Redis)
                problems.append(f"cannot read 'appendfsync' with CONFIG GET ({exc})")
            else:
                if fsync != "always":
                    problems.append(f"'appendfsync' is {fsync!r}, not 'always'")
        if problems:
            raise WalDurabilityError(
                f"durability={self.durability!r} is not available: {'; '.join(problems)}. "
                "Fix the Redis configuration or use durability='everysec' "
                "(see docs/durability.md)."
            )
        if self.durability == "waitaof":
            self._warn_if_waitaof_is_slow()
        self._checked = True

    def _config(self, parameter: str) -> str:
        """A server setting read with CONFIG GET ('' if unknown); redis.ResponseError where
        CONFIG is renamed or forbidden."""
        found = self._client.config_get(parameter)
        value = found.get(parameter, found.get(parameter.encode(), ""))
        return value.decode() if isinstance(value, bytes) else str(value)

    def _warn_if_waitaof_is_slow(self) -> None:
        """Log a warning where the server's ``hz`` makes every WAITAOF wait long.

        Redis runs the AOF fsync that a WAITAOF waits for on its cron ticks, ``hz`` a second:
        at the default hz 10 each append waits about 100 ms (200 ms under load), and learning
        falls to about 140 requests/s with 32 clients (docs/durability.md).
        """
        try:
            hz = int(self._config("hz"))
        except (redis.ResponseError, ValueError):
            return  # unknown: nothing to say
        if hz < WAITAOF_MIN_HZ:
            log.warning(
                "durability='waitaof' waits for Redis's next AOF fsync, which it runs on its "
                "cron ticks: at hz=%d every append (every learn request) waits about %d ms. "
                "Raise it (CONFIG SET hz %d, or 'hz %d' in redis.conf), or run Redis with "
                "'appendfsync always' and use durability='always' (see docs/durability.md).",
                hz, 1000 // max(hz, 1), WAITAOF_MIN_HZ, WAITAOF_MIN_HZ,
            )

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
                yield decode_entry(entry_id, header, x_raw, y_raw)
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
        checked = check_keys(keys)
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
