"""The write-ahead log in Redis: one Stream per model (``RedisWriteAheadLog``)."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import redis

from service.storage.common import RedisClient, check_name
from service.storage.wal.entries import (
    EntryWriting,
    KeyLookups,
    check_idempotency_key,
    check_keys,
    check_ttl,
    decode_entry,
)
from service.storage.wal.interface import (
    ANY_END,
    DEFAULT_IDEMPOTENCY_TTL_S,
    AppendEach,
    Durability,
    LogEntry,
    LoggedRequest,
    WalCorruptError,
    WalDivergedError,
    WalDurabilityError,
    WalGapError,
)

_DURABILITIES = ("everysec", "always", "waitaof")
WAITAOF_SLOW_S = 0.02
"""A WAITAOF that takes longer at start-up makes the log warn (measured on a primary without
replicas: about 100, 10 and 2 ms at Redis' hz 10, 100 and 500)."""
_REDIS_ID_RE = re.compile(r"(\d+)-(\d+)")
_DIVERGED = "GLNDIVERGED"  # the append script's error when the stream ends elsewhere
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


def _milliseconds(seconds: float) -> int:
    """``seconds`` as whole milliseconds for Redis, at least 1 (0 would mean no limit)."""
    return max(1, round(seconds * 1000))


def _server_version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


# The id of a stream's newest entry, trimmed or not ('' if none): the ``:last`` key that each
# append sets, or for a log appended to before that key was kept, XINFO's last-generated-id,
# read server-side so that the first and last entries XINFO includes never cross the network.
_LAST_ID_LUA = """
local function last_id(stream, last_key)
  local last = redis.call('GET', last_key)
  if last then return last end
  if redis.call('EXISTS', stream) == 0 then return '' end
  local info = redis.call('XINFO', 'STREAM', stream)
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then return info[i + 1] end
  end
  return ''
end
"""

# Check where the stream ends and that none of the idempotency keys is logged yet (unless
# ARGV[5] is ANY_END), XADD, note the new id as the stream's last, then SET every idempotency
# key to it (and its request's digest, if any): one script, so the entry, its keys and the
# checks land together (a MULTI cannot feed XADD's generated id into the SETs, nor refuse on
# what it reads). The key check is what keeps a request from being logged twice when its
# writer looked the key up on another server than the one that takes the append: during a
# failover, old connections can still reach the old primary.
# KEYS: stream, last-id key, idempotency keys...; ARGV: key TTL in ms, meta JSON, features,
# labels, the id the stream must end at ('' for none, ANY_END for any), then one digest per
# idempotency key ('' for none).
_APPEND_LUA = _LAST_ID_LUA + f"""
if ARGV[5] ~= '{ANY_END}' then
  local last = last_id(KEYS[1], KEYS[2])
  if last ~= ARGV[5] then return redis.error_reply('{_DIVERGED} ' .. last) end
  for i = 3, #KEYS do
    if redis.call('EXISTS', KEYS[i]) == 1 then
      return redis.error_reply('{_DIVERGED} ' .. last .. ' ' .. KEYS[i])
    end
  end
end
local id = redis.call('XADD', KEYS[1], '*', 'meta', ARGV[2], 'x', ARGV[3], 'y', ARGV[4])
redis.call('SET', KEYS[2], id)
for i = 3, #KEYS do
  local digest = ARGV[i + 3]
  local value = id
  if digest ~= '' then value = id .. ' ' .. digest end
  redis.call('SET', KEYS[i], value, 'PX', ARGV[1], 'NX')
end
return id
"""

_STREAM_IDS_LUA = _LAST_ID_LUA + """
local last = last_id(KEYS[1], KEYS[2])
if last == '' then return false end
return last
"""


class RedisWriteAheadLog(EntryWriting, KeyLookups, AppendEach, RedisClient):
    """The log as one Redis Stream per model, plus one short-lived key per idempotency key.

    Layout (``p`` is ``key_prefix``, ``n`` the model name)::

        p:wal:n             stream; one entry per chunk: fields meta (JSON), x, y (raw bytes)
        p:wal:n:trimmed     id of the last entry trimmed away (to detect replay gaps)
        p:wal:n:last        id of the newest entry (what an append's ``follows`` is checked by)
        p:wal:n:key:K       "id digest": the entry idempotency key K was logged with, and its
                            request's digest (just "id" without one); expires
        p:wal-probe         written by the start-up checks of waitaof and replicas; expires

    An append is one server-side script doing the XADD and a ``SET ... PX ttl NX`` per key
    (value: the new entry id and the request's digest), so an entry and its keys land (and
    persist) together, in one round trip. Given ``follows``, the script first checks that the
    stream ends at that id, so that a writer whose entries a failover lost learns it at its
    next append (:class:`WalDivergedError`) instead of logging on as if they were there.
    ``durability`` decides when it returns:

    * ``"everysec"``: as soon as Redis has it in memory. What survives a crash of Redis is
      then whatever its own persistence keeps: with ``appendonly yes`` and the default
      ``appendfsync everysec``, all but about the last second.
    * ``"always"``: the same, but first checks that the server runs ``appendonly yes`` with
      ``appendfsync always`` (every write fsynced before it is answered); refuses otherwise.
    * ``"waitaof"``: after the append, ``WAITAOF 1 0`` waits until the local AOF holds it on
      disk (``waitaof_timeout_s`` at most, then :class:`WalDurabilityError`). Needs Redis 7.2
      or newer with ``appendonly yes``.

    ``replicas`` (default 0), with any durability: after the append (and its WAITAOF),
    ``WAIT <replicas>`` waits until that many replicas have received it (``replica_timeout_s``
    at most, then :class:`WalDurabilityError`), so that an acknowledged entry outlives the
    loss of the primary's machine. A replica holds it in memory then, and on its disk once its
    own AOF is fsynced (``everysec``: within about a second).

    The server is checked (for ``"always"``, ``"waitaof"`` and replicas) by
    :meth:`check_durability`, which the first append calls; call it at start-up to fail
    early. Either raises :class:`WalDurabilityError` naming what is missing.

    ``read_page_entries`` is how many entries one XRANGE fetches during replay (an entry can
    be a whole chunk, tens of MB); ``socket_timeout`` bounds each Redis call in seconds, and
    ``call_timeout_s`` (when given, in its place) bounds each beyond the waits its
    confirmations ask of Redis (WAITAOF, WAIT): a Redis that hangs fails appends in about that
    long instead of holding a model's writer, and its thread, for a minute.
    """

    def __init__(
        self,
        url: str,
        key_prefix: str = "gln",
        durability: Durability = "everysec",
        *,
        idempotency_ttl_s: float = DEFAULT_IDEMPOTENCY_TTL_S,
        waitaof_timeout_s: float = 1.0,
        replicas: int = 0,
        replica_timeout_s: float = 2.0,
        read_page_entries: int = 8,
        socket_connect_timeout: float = 5.0,
        socket_timeout: float | None = 60.0,
        call_timeout_s: float | None = None,
    ) -> None:
        if call_timeout_s is not None:
            socket_timeout = call_timeout_s + (waitaof_timeout_s if durability == "waitaof"
                                               else 0.0) + (replica_timeout_s if replicas else 0.0)
            socket_connect_timeout = min(socket_connect_timeout, max(call_timeout_s, 0.5))
        super().__init__(url, key_prefix, socket_connect_timeout, socket_timeout)
        if durability not in _DURABILITIES:
            raise ValueError(f"durability must be one of {_DURABILITIES}, got {durability!r}")
        if not isinstance(read_page_entries, int) or read_page_entries < 1:
            raise ValueError(
                f"read_page_entries must be a positive int, got {read_page_entries!r}"
            )
        for setting, seconds in (("waitaof_timeout_s", waitaof_timeout_s),
                                 ("replica_timeout_s", replica_timeout_s)):
            if not seconds > 0:
                raise ValueError(f"{setting} must be positive, got {seconds!r}")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ValueError(f"replicas must be an int >= 0, got {replicas!r}")
        self.durability = durability
        self.idempotency_ttl_s = check_ttl(idempotency_ttl_s)
        self.waitaof_timeout_s = waitaof_timeout_s
        self.replicas = replicas
        self.replica_timeout_s = replica_timeout_s
        self.read_page_entries = read_page_entries
        self._append_script = self._client.register_script(_APPEND_LUA)
        self._stream_ids = self._client.register_script(_STREAM_IDS_LUA)
        self._checked = False
        self._check_lock = threading.Lock()

    def __repr__(self) -> str:
        replicas = f", replicas={self.replicas}" if self.replicas else ""
        return (f"RedisWriteAheadLog(key_prefix={self.key_prefix!r}, "
                f"durability={self.durability!r}{replicas})")

    # -- key names ------------------------------------------------------------------------

    def _stream_key(self, name: str) -> str:
        return f"{self.key_prefix}:wal:{check_name(name)}"

    def _idem_key(self, name: str, key: str) -> str:
        return f"{self._stream_key(name)}:key:{check_idempotency_key(key)}"

    # -- durability -----------------------------------------------------------------------

    def check_durability(self) -> None:
        """Raise WalDurabilityError unless the server can give ``durability`` and ``replicas``;
        else no-op (with ``waitaof``, a warning where each WAITAOF waits long)."""
        self._wait_for_sentinels(self.replica_timeout_s)
        if self.durability == "everysec" and not self.replicas:
            self._warn_if_aof_is_off()
            self._checked = True
            return
        problems = []
        if self.durability != "everysec":
            problems += self._fsync_problems()
        if self.replicas:
            replication = self._client.info("replication")
            role, connected = replication.get("role"), int(replication.get("connected_slaves", 0))
            if role != "master":
                problems.append(f"the server is a {role}, not a primary")
            elif connected < self.replicas:
                problems.append(f"replicas={self.replicas} needs {self.replicas} replica(s) "
                                f"connected, the server has {connected}")
            elif (acknowledged := self._replicas_acknowledging_a_write()) < self.replicas:
                problems.append(f"{acknowledged} of the {self.replicas} replica(s) "
                                f"acknowledged a write within {self.replica_timeout_s} s")
        if problems:
            replicas = f" with replicas={self.replicas}" if self.replicas else ""
            raise WalDurabilityError(
                f"durability={self.durability!r}{replicas} is not available: "
                f"{'; '.join(problems)}. Fix the Redis configuration, or ask for less "
                "(durability='everysec', replicas=0; see docs/durability.md)."
            )
        if self.durability == "waitaof":
            self._warn_if_waitaof_is_slow()
        self._checked = True

    def _warn_if_aof_is_off(self) -> None:
        """Say so where Redis keeps no AOF (its default): the log then survives the service,
        but not Redis itself, which loses everything since its last RDB save."""
        if not int(self._client.info("persistence").get("aof_enabled", 0)):
            log.warning(
                "Redis has no append-only file ('appendonly no'): the log survives this "
                "service's crash, but if Redis itself stops, every learn since its last RDB "
                "save is lost. Set 'appendonly yes' (docs/durability.md).")

    def _replicas_acknowledging_a_write(self) -> int:
        """How many replicas acknowledge a write (of a short-lived probe key) in time."""
        return int(self._probed(self._wait_for_replicas())[0][0])

    def _probed(self, *confirmations: tuple[Any, ...]) -> tuple[list[Any], float]:
        """Write the probe key (it expires; see the layout above), then run
        ``confirmations`` on the same connection, as an append does: their replies and
        seconds."""
        pipe = self._client.pipeline(transaction=False)
        pipe.set(f"{self.key_prefix}:wal-probe", b"1", px=10_000)
        for confirmation in confirmations:
            pipe.execute_command(*confirmation)
        start = time.perf_counter()
        replies = pipe.execute()[1:]
        return replies, time.perf_counter() - start

    def _wait_for_aof(self) -> tuple[Any, ...]:
        """The command that waits for the local AOF's fsync (``waitaof``)."""
        return ("WAITAOF", 1, 0, _milliseconds(self.waitaof_timeout_s))

    def _wait_for_replicas(self) -> tuple[Any, ...]:
        """The command that waits for ``replicas`` replicas to have what was written."""
        return ("WAIT", self.replicas, _milliseconds(self.replica_timeout_s))

    def _fsync_problems(self) -> list[str]:
        """What keeps the server from fsyncing as ``always`` or ``waitaof`` needs."""
        version_text = str(self._client.info("server").get("redis_version", "0"))
        problems = []
        if not int(self._client.info("persistence").get("aof_enabled", 0)):
            problems.append("AOF is off (needs 'appendonly yes')")
        if self.durability == "waitaof" and _server_version(version_text) < (7, 2):
            problems.append(f"WAITAOF needs Redis >= 7.2, the server is {version_text}")
        if self.durability == "always":
            try:
                found = self._client.config_get("appendfsync")
            except redis.ResponseError as exc:  # CONFIG renamed or forbidden (managed Redis)
                problems.append(f"cannot read 'appendfsync' with CONFIG GET ({exc})")
            else:
                fsync = found.get("appendfsync", found.get(b"appendfsync"))
                fsync = fsync.decode() if isinstance(fsync, bytes) else fsync
                if fsync != "always":
                    problems.append(f"'appendfsync' is {fsync!r}, not 'always'")
        return problems

    def _warn_if_waitaof_is_slow(self) -> None:
        """Time three WAITAOFs and log a warning where they wait long.

        Redis may run the fsync that a WAITAOF waits for on its cron ticks, ``hz`` a second:
        measured on a primary without replicas at the default hz 10, every append waited about
        100 ms (200 ms under load) and learning fell to about 140 requests/s with 32 clients;
        with a replica connected it did not wait (docs/durability.md). So it is measured.
        """
        waited = sorted(self._probed(self._wait_for_aof())[1] for _ in range(3))[1]
        if waited > WAITAOF_SLOW_S:
            log.warning(
                "durability='waitaof': a WAITAOF here took %.0f ms (median of 3), and every "
                "append (every learn request) waits about that long: Redis runs the fsync it "
                "waits for on its cron ticks. Raise Redis' hz (CONFIG SET hz 100, or 'hz 100' "
                "in redis.conf), or run Redis with 'appendfsync always' and use "
                "durability='always' (see docs/durability.md).", 1e3 * waited,
            )

    # -- the interface --------------------------------------------------------------------

    def _write(
        self, name: str, header: dict[str, Any], x: bytes, y: bytes,
        keys: list[str | None], digests: list[str | None], now: float, follows: str | None,
    ) -> str:
        """XADD the entry and SET its idempotency keys in one atomic script; the entry id.

        With ``durability="waitaof"`` a ``WAITAOF`` follows in the same pipeline (same
        connection, one round trip) and waits for the AOF fsync, and with ``replicas`` a
        ``WAIT`` for that many replicas; if either does not come in time, WalDurabilityError
        says so (the entry *is* logged and will be replayed, so report the request as failed
        and let its idempotency key catch a retry).
        """
        stream = self._stream_key(name)
        if not self._checked:
            with self._check_lock:
                if not self._checked:
                    self.check_durability()
        ttl_ms = _milliseconds(self.idempotency_ttl_s)
        keyed = [(key, digest) for key, digest in zip(keys, digests, strict=True)
                 if key is not None]
        idem = [f"{stream}:key:{key}" for key, _ in keyed]
        idem_digests = [digest or "" for _, digest in keyed]
        # One connection for every command: WAITAOF and WAIT wait for *this connection's*
        # writes.
        primary = self._primary_token()
        pipe = self._client.pipeline(transaction=False)
        self._append_script(
            keys=[stream, f"{stream}:last", *idem],
            args=[ttl_ms, json.dumps(header).encode(), x, y, "" if follows is None else follows,
                  *idem_digests],
            client=pipe,
        )
        for confirmation in self._confirmations():
            pipe.execute_command(*confirmation)
        replies = pipe.execute(raise_on_error=False)
        self._check_refusal(name, follows, replies[0])
        entry_id = replies[0].decode()
        self._check_confirmations(replies[1:], f"entry {entry_id} of {name!r}", primary)
        return entry_id

    def _check_refusal(self, name: str, follows: str | None, reply: Any) -> None:
        """Raise what the append script's error reply says (WalDivergedError), if it is one."""
        if isinstance(reply, redis.ResponseError):
            refusal = str(reply).split(" ", 2)  # the error, the last id, the key (if any)
            if refusal[0] != _DIVERGED:
                raise reply
            found = refusal[1] if len(refusal) > 1 and refusal[1] else None
            known_key = refusal[2].rpartition(":key:")[2] if len(refusal) > 2 else None
            raise WalDivergedError(name, follows, found, known_key)

    def _check_confirmations(self, replies: list[Any], what: str, primary: int | None) -> None:
        """WalDurabilityError unless the replies to :meth:`_confirmations` (in its order)
        confirm ``what`` as the durability asks: checked on every append, so a Redis whose
        configuration changed under a running service (``CONFIG SET appendonly no``) stops
        acknowledging at once instead of losing what it acknowledged at its next crash.

        Through a Sentinel URL, also unless the server written to is still the primary the
        Sentinels named when ``primary`` (:meth:`_primary_token`) was taken, before the
        write, with no failover heard of since: a primary that paused while a replica was
        promoted takes writes when it resumes, and a replica still attached to it answers
        their ``WAIT``, but the Sentinels then repoint both, and the writes are gone. This
        check comes after the replies, so it covers the whole of the write and its waits."""
        for reply in replies:  # refused: WAITAOF with the AOF off, WAIT on a replica, ...
            if isinstance(reply, redis.ResponseError):
                raise WalDurabilityError(f"{what}: Redis refused to confirm it ({reply})")
        replies = list(replies)
        if self.durability == "waitaof" and int(replies.pop(0)[0]) < 1:
            raise WalDurabilityError(
                f"{what} was not fsynced to the AOF within {self.waitaof_timeout_s} s"
            )
        if self.durability == "always":
            setting = {**_setting(replies.pop(0)), **_setting(replies.pop(0))}
            if setting.get("appendonly") != "yes" or setting.get("appendfsync") != "always":
                raise WalDurabilityError(
                    f"{what} is not fsynced: Redis now runs with appendonly "
                    f"{setting.get('appendonly')!r}, appendfsync {setting.get('appendfsync')!r} "
                    "(durability='always' needs 'yes' and 'always')"
                )
        if self.replicas and int(replies[-1]) < self.replicas:
            raise WalDurabilityError(
                f"{what} reached {int(replies[-1])} of the {self.replicas} replica(s) it "
                f"needs within {self.replica_timeout_s} s"
            )
        if (unconfirmed := self._primary_unconfirmed(primary)) is not None:
            raise WalDurabilityError(
                f"{what} may not stay where it was written: {unconfirmed}")

    def _confirmations(self) -> list[tuple[Any, ...]]:
        """The commands that wait until what a connection wrote is as durable as the log is
        configured to be, or (``always``) read back that Redis still fsyncs every write; none
        for ``everysec`` without replicas."""
        commands: list[tuple[Any, ...]] = []
        if self.durability == "waitaof":
            commands.append(self._wait_for_aof())
        if self.durability == "always":  # two reads: CONFIG GET of several names is 7.0's
            commands += [("CONFIG", "GET", "appendonly"), ("CONFIG", "GET", "appendfsync")]
        if self.replicas:
            commands.append(self._wait_for_replicas())
        return commands

    def wait_durable(self) -> None:
        """Write the probe key and wait for it as an append waits (replicas, AOF fsync):
        replication and the AOF keep their order, so everything logged before it is then as
        durable, and (through a Sentinel URL) on the primary the Sentinels name with no
        failover in sight. WalDurabilityError if not; a no-op for ``everysec`` alone on a
        single server."""
        confirmations = self._confirmations()
        primary = self._primary_token()
        if confirmations or self._watch is not None:
            replies, _ = self._probed(*confirmations)
            self._check_confirmations(replies, "what the log holds", primary)

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

    def continue_after(self, name: str, entry_id: str) -> None:
        """Add an entry of id ``entry_id`` (the stream then generates only later ids, even
        with the clock behind it) and trim through it, marking it the newest and the trimmed
        through, in one MULTI/EXEC; nothing if the stream already reaches it."""
        wanted = _parse_redis_id(entry_id)
        if self.reaches(name, entry_id):
            return
        stream = self._stream_key(name)
        cut_id = f"{wanted[0]}-{wanted[1]}"
        pipe = self._client.pipeline(transaction=True)
        pipe.xadd(stream, {"meta": b"", "x": b"", "y": b""}, id=cut_id)
        pipe.xtrim(stream, minid=_next_redis_id(cut_id), approximate=False)
        pipe.set(f"{stream}:last", cut_id)
        pipe.set(f"{stream}:trimmed", cut_id)
        pipe.execute()

    def last_id(self, name: str) -> str | None:
        """The stream's last generated id (it survives XTRIM), None without a stream."""
        stream = self._stream_key(name)
        found = self._stream_ids(keys=[stream, f"{stream}:last"])
        if not found or found == b"0-0":
            return None
        return found.decode()

    def reaches(self, name: str, entry_id: str) -> bool:
        """True when the stream's newest id is ``entry_id`` or later."""
        wanted = _parse_redis_id(entry_id)
        last = self.last_id(name)
        return last is not None and _parse_redis_id(last) >= wanted

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

    def names(self) -> list[str]:
        """The models whose streams hold entries, sorted (:class:`ModelListing`): the streams
        under ``p:wal:`` found with SCAN (a model name has no ``:``), then their lengths."""
        start = f"{self.key_prefix}:wal:"
        found = [key.decode()[len(start):]
                 for key in self._client.scan_iter(match=f"{_glob_escape(start)}*",
                                                   count=1000, _type="STREAM")]
        found = [name for name in found if ":" not in name]
        pipe = self._client.pipeline(transaction=False)
        for name in found:
            pipe.xlen(start + name)
        return sorted(name for name, length in zip(found, pipe.execute(), strict=True) if length)

    def delete(self, name: str) -> None:
        """DEL the stream and trim marker, then every remembered key (found with SCAN)."""
        stream = self._stream_key(name)
        self._client.delete(stream, f"{stream}:trimmed", f"{stream}:last")
        pattern = f"{_glob_escape(stream)}:key:*"
        batch: list[bytes] = []
        for key in self._client.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                self._client.delete(*batch)
                batch = []
        if batch:
            self._client.delete(*batch)


def _setting(reply: Any) -> dict[str, str]:
    """A CONFIG GET reply (a dict, or a flat list of names and values) as text."""
    pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2], strict=True)
    return {_text(name): _text(value) for name, value in pairs}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
