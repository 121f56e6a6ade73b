"""What the snapshot stores (``service/storage/store/``) and the write-ahead logs
(``service/storage/wal/``) build on alike: model names that are safe as Redis key parts and
directory names, one Redis client per store or log (of one server, or of the primary that Redis
Sentinel names, followed by a :class:`~service.storage.primary_watch.PrimaryWatch`), and files
replaced atomically and durably."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Self
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.connection import ConnectionPool
from redis.retry import Retry
from redis.sentinel import SentinelConnectionPool

from service.storage.primary_watch import PrimaryWatch, SentinelTarget

_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# The URL scheme of a Redis primary found through Redis Sentinel (redis_client).
SENTINEL_SCHEME = "redis+sentinel"
DEFAULT_SENTINEL_PORT = 26379

log = logging.getLogger(__name__)


def is_model_name(text: object) -> bool:
    """True for a safe model name: 1-64 characters from [A-Za-z0-9_.-], not '.' or '..'."""
    return isinstance(text, str) and bool(_NAME_RE.fullmatch(text)) and text not in {".", ".."}


def check_name(name: str) -> str:
    """Return ``name`` if it is a safe model name, else raise ValueError.

    The service validates names already; this is defence in depth, because a name becomes a
    Redis key part and a directory name (``..`` or ``a/b`` must never reach the filesystem).
    """
    if not is_model_name(name):
        raise ValueError(
            f"name must be 1-64 characters from [A-Za-z0-9_.-] and not '.' or '..', "
            f"got {name!r}"
        )
    return name


# A model's file log in its directory, as the file log kept it before one log held every
# model (service.storage.wal.file_log carries such files in).
LOG_FILE_NAME = "wal.log"


def model_dir_in(root: Path, name: str) -> Path:
    """``root / name`` for a checked model name, refusing anything that resolves elsewhere."""
    model_dir = root / check_name(name)
    # Defence in depth: the name check already rules this out.
    if model_dir.resolve().parent != root.resolve():
        raise ValueError(f"name {name!r} escapes the directory {root}")
    return model_dir


class ClosingMixin:
    """``with store:`` closes the store at the end of the block."""

    def close(self) -> None:  # pragma: no cover - overridden
        """Release resources."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# A health check's write waits this long at most: a hung Redis must not hold its caller for the
# minute a snapshot's write may take.
PING_TIMEOUT_S = 2.0


# A Sentinel that does not answer within this long is passed over (connecting, asking, or
# hearing its events), so that a dead one delays neither a failover's notice nor a connection.
SENTINEL_TIMEOUT_S = 1.0


# The key a health check writes (under the key prefix), and how long it outlives the last check.
HEALTH_KEY = "health"
HEALTH_KEY_TTL_MS = 60_000


class PrimaryUnconfirmedError(redis.ConnectionError):
    """A write went to a Redis primary that a failover may take it from (the Sentinels are
    failing it over, or named another meanwhile): it is not to be relied on."""


class RedisClient(ClosingMixin):
    """What every Redis-backed class here shares: one client, health by a small write (on a
    client of its own, with short timeouts), closing; through a Sentinel URL, the watch of
    the primary that both clients follow (:class:`PrimaryWatch`): on a failover it drops
    their idle connections at once, and it tells whether what was written since a
    :meth:`_primary_token` stays (:meth:`_primary_unconfirmed`)."""

    _client: redis.Redis

    def __init__(
        self, url: str, key_prefix: str, socket_connect_timeout: float,
        socket_timeout: float | None,
    ) -> None:
        """Check the key prefix and make the client (it connects on first use)."""
        if not isinstance(key_prefix, str) or not key_prefix:
            raise ValueError(f"key_prefix must be a non-empty str, got {key_prefix!r}")
        self.url = url
        self.key_prefix = key_prefix
        self._watch = None
        if url.startswith(f"{SENTINEL_SCHEME}://"):
            self._watch = PrimaryWatch(parse_sentinel_url(url),
                                       min(socket_connect_timeout, SENTINEL_TIMEOUT_S))
        self._client = redis_client(url, socket_connect_timeout, socket_timeout, self._watch)
        ping_timeout = min(socket_connect_timeout, PING_TIMEOUT_S)
        self._ping_client = redis_client(url, ping_timeout, PING_TIMEOUT_S, self._watch)
        if self._watch is not None:
            self._watch.on_change(self.reconnect)

    def ping(self) -> bool:
        """True when Redis takes a write within ``PING_TIMEOUT_S`` (``HEALTH_KEY`` under the
        prefix, expiring); False on any connection or server error, or a Redis that does not
        answer in time. A write, not PING: a Redis out of memory (``noeviction``), one whose
        last background save failed (``MISCONF``) or a read-only replica answers PING but
        refuses every snapshot and log append."""
        try:
            return bool(self._ping_client.set(f"{self.key_prefix}:{HEALTH_KEY}", b"1",
                                              px=HEALTH_KEY_TTL_MS))
        except (redis.RedisError, OSError):
            return False

    def reconnect(self) -> None:
        """Drop the idle connections: the next call connects afresh, and through a Sentinel
        URL to the primary the watch names now (the watch calls this on every failover it
        hears of). Connections in use by other threads finish their call; the pool then
        drops those that reach a primary the watch no longer names, instead of taking them
        back, and reconnects any taken that does. The ping's client too, so that health is
        that of the primary the writes reach."""
        for client in (self._client, self._ping_client):
            client.connection_pool.disconnect(inuse_connections=False)

    def _primary_token(self) -> int | None:
        """Taken before a write that must stay (an append, a snapshot): see
        :meth:`_primary_unconfirmed`. None without a Sentinel URL, or while a failover may be
        under way."""
        return None if self._watch is None else self._watch.token()

    def _primary_unconfirmed(self, token: int | None) -> str | None:
        """None when what was written since ``token`` was taken stays, as far as the
        Sentinels can tell: always for a single server; through a Sentinel URL, when no
        failover was heard of since and the primary named then is named still (the
        connection written on was to it: the pool sees to that). Else why not, in words.
        No round trip: the watch's threads keep the answer."""
        if self._watch is None or self._watch.confirms(token):
            return None
        return self._watch.why_not()

    def _wait_for_sentinels(self, timeout_s: float) -> None:
        """At start-up: give the watch up to ``timeout_s`` to hear the Sentinels, so that the
        first writes are not refused for want of it (they are, and say why, if it cannot)."""
        if self._watch is not None and not self._watch.wait_settled(timeout_s):
            log.warning("the Sentinels are not heard yet: %s", self._watch.why_not())

    def close(self) -> None:
        """Close the clients' connections, and stop the watch."""
        for client in (self._client, self._ping_client):
            client.close()
            client.connection_pool.disconnect()
        if self._watch is not None:
            self._watch.close()


def parse_sentinel_url(url: str) -> SentinelTarget:
    """Read ``redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/name[/db]``,
    optionally with ``?sentinel_password=...``.

    Each host is a Sentinel (port 26379 when left out); ``name`` is the primary's name in
    their ``sentinel monitor`` line; the user and password are the primary's, and
    ``sentinel_password`` the Sentinels' own (their ``requirepass``; without it they are
    asked without one). ``ValueError`` names what is wrong.

    >>> parse_sentinel_url("redis+sentinel://:secret@10.0.0.1,10.0.0.2:26380/gln/2")
    SentinelTarget(sentinels=(('10.0.0.1', 26379), ('10.0.0.2', 26380)), service_name='gln', \
db=2, username=None, password='secret', sentinel_password=None)
    """
    parts = urlsplit(url)
    shape = (f"{SENTINEL_SCHEME}://[[user]:password@]host[:port][,host[:port]...]/name[/db]"
             "[?sentinel_password=...]")
    if parts.scheme != SENTINEL_SCHEME:
        raise ValueError(f"a Sentinel URL starts with {SENTINEL_SCHEME}://, got {url!r}")
    try:
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:  # not name=value pairs: named below as it stands
        query = {parts.query: []}
    unknown = sorted(set(query) - {"sentinel_password"})
    if unknown or parts.fragment or any(len(values) > 1 for values in query.values()):
        raise ValueError(f"a Sentinel URL takes sentinel_password once and nothing else after "
                         f"its path (got {', '.join(unknown) or 'a repeat or a fragment'}): "
                         f"{shape}")
    credentials, _, hosts = parts.netloc.rpartition("@")
    username, _, password = credentials.partition(":")
    sentinels = tuple(_host_and_port(host, shape) for host in hosts.split(","))
    path = [unquote(piece) for piece in parts.path.strip("/").split("/") if piece]
    if not 1 <= len(path) <= 2:
        raise ValueError(f"a Sentinel URL names the primary (and perhaps a db): {shape}")
    if len(path) == 2 and not path[1].isdigit():
        raise ValueError(f"the database of a Sentinel URL is a number, got {path[1]!r}")
    return SentinelTarget(
        sentinels, path[0], int(path[1]) if len(path) == 2 else 0,
        unquote(username) or None, unquote(password) or None,
        query.get("sentinel_password", [""])[0] or None,
    )


def _host_and_port(text: str, shape: str) -> tuple[str, int]:
    """``host[:port]`` (``[v6 address]:port`` too) of one Sentinel."""
    host, port = text, str(DEFAULT_SENTINEL_PORT)
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            port = rest.removeprefix(":")
    elif ":" in text:
        host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"each Sentinel is host[:port], got {text!r}: {shape}")
    return host, int(port)


class _WatchedPool(SentinelConnectionPool):
    """Connections to the primary a :class:`PrimaryWatch` names (it is the pool's
    ``sentinel_manager``): a new connection asks the watch where to go, one made before the
    watch named another primary is reconnected when taken and dropped when given back."""

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        connection = super().get_connection(*args, **kwargs)
        named = self.sentinel_manager.address
        if named is not None and (connection.host, connection.port) != named:
            try:
                connection.disconnect()
                connection.connect()
            except BaseException:
                self.release(connection)
                raise
        return connection

    def owns_connection(self, connection: Any) -> bool:
        named = self.sentinel_manager.address
        return ((named is None or (connection.host, connection.port) == named)
                and ConnectionPool.owns_connection(self, connection))


def redis_client(
    url: str, socket_connect_timeout: float, socket_timeout: float | None,
    watch: PrimaryWatch | None = None,
) -> redis.Redis:
    """A client of raw bytes (snapshots and log entries are binary) for ``url``.

    ``redis://``, ``rediss://`` and ``unix://`` URLs are redis-py's. A ``redis+sentinel://``
    URL (:func:`parse_sentinel_url`) gives a client of the primary that ``watch`` (required
    then) names: a new connection goes where the Sentinels' latest word says, and one to a
    primary they no longer name is not used again.
    """
    # No retries inside the client: a command whose connection dropped after Redis ran it
    # would run twice (an append logged twice); the log's callers retry knowingly.
    timeouts = {"socket_connect_timeout": socket_connect_timeout,
                "socket_timeout": socket_timeout, "retry": Retry(NoBackoff(), 0)}
    if not url.startswith(f"{SENTINEL_SCHEME}://"):
        return redis.Redis.from_url(url, decode_responses=False, **timeouts)
    if watch is None:
        raise ValueError("a Sentinel URL's client needs the PrimaryWatch of its Sentinels")
    target = watch.target
    return redis.Redis(connection_pool=_WatchedPool(
        target.service_name, watch, is_master=True, db=target.db, username=target.username,
        password=target.password, decode_responses=False, **timeouts,
    ))


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (POSIX); silently skipped where unsupported."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def replace_atomically(
    path: Path, write: Callable[[BinaryIO], object], *, tmp_prefix: str = ".tmp-"
) -> None:
    """Replace ``path`` with what ``write`` writes, so readers see the old file or the new one.

    Temp file in the same directory, fsync, ``os.replace`` (atomic on POSIX and Windows),
    then fsync the directory so the rename itself survives a power cut. A failure leaves the
    old file and removes the temp file.
    """
    replace_all_atomically([(path, write)], tmp_prefix=tmp_prefix)


def replace_all_atomically(
    files: Sequence[tuple[Path, Callable[[BinaryIO], object]]], *, tmp_prefix: str = ".tmp-"
) -> None:
    """``replace_atomically`` for several files of one directory, with one fsync of it: each
    file is written to a temp file and fsynced, then all are renamed, then the directory is
    fsynced once. A crash may leave some of them replaced and not others; a failure removes
    the temp files not yet renamed."""
    temps: list[str] = []
    renamed = 0
    try:
        for path, write in files:
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=tmp_prefix, suffix=f"-{path.name}")
            temps.append(tmp)
            with os.fdopen(fd, "wb") as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
        for (path, _), tmp in zip(files, temps, strict=True):
            os.replace(tmp, path)
            renamed += 1
    except BaseException:
        for tmp in temps[renamed:]:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    fsync_dir(files[0][0].parent)


# The URL schemes of a NATS server (the write-ahead log in JetStream: wal/nats_log.py).
NATS_SCHEMES = ("nats", "tls")


def parse_nats_url(url: str) -> list[str]:
    """The servers of ``nats://[user:password@]host[:port][,host[:port]...]`` (or ``tls://``),
    one URL each as nats-py takes them; ValueError saying what is wrong."""
    if not isinstance(url, str) or "://" not in url:
        raise ValueError("a NATS URL looks like nats://host:4222[,host:4222...]")
    scheme, _, rest = url.partition("://")
    if scheme not in NATS_SCHEMES:
        raise ValueError(f"a NATS URL starts nats:// or tls://, not {scheme}://")
    user, _, hosts = rest.rpartition("@")
    hosts = hosts.rstrip("/")
    if not hosts or "/" in hosts or "?" in hosts:
        raise ValueError("a NATS URL names servers only: nats://host:4222[,host:4222...]")
    servers = []
    for host in hosts.split(","):
        parts = urlsplit(f"{scheme}://{host}")
        try:
            port = parts.port
        except ValueError:
            port = 0
        if not parts.hostname or port == 0:
            raise ValueError(f"each NATS server is host or host:port (1-65535), got {host!r}")
        auth = f"{user}@" if user else ""
        servers.append(f"{scheme}://{auth}{host}")
    return servers
