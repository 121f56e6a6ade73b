"""Private ``nats-server`` processes with JetStream that tests and benchmarks can stop, pause,
kill and restart: the NATS twin of tests/redis_process.py.

:class:`NatsProcess` is one server, with JetStream storing in its own directory::

    with NatsProcess(tmp_dir) as server:          # a single server (streams of one replica)
        wal = NatsWriteAheadLog(server.url)

:func:`nats_cluster` runs three (or more) servers routed into one JetStream cluster; each node
can be paused (SIGSTOP), resumed (SIGCONT), killed (SIGKILL) and started again on its ports and
directory, which then catches up from the others. :meth:`NatsCluster.leader_of` names the
node that leads a stream now, read off each server's monitoring port (``/jsz``).

The binary is ``nats-server`` from ``PATH`` (Debian's package installs it in /usr/sbin);
FileNotFoundError where there is none, which callers turn into a skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Self

import httpx

from tests.support.child_server import ChildServer, free_port

# Learn chunks of the MNIST model reach 31 MB; NATS' default limit on a message is 1 MB and 64 MB
# its largest (docs/durability.md).
MAX_PAYLOAD = "64MB"


def find_nats_server() -> str:
    """Path of a ``nats-server`` binary on PATH (or /usr/sbin); FileNotFoundError if none."""
    found = shutil.which("nats-server") or shutil.which("nats-server", path="/usr/sbin")
    if found:
        return found
    raise FileNotFoundError("no nats-server found on PATH (install the nats-server package)")


class NatsProcess(ChildServer):
    """One ``nats-server`` on 127.0.0.1 with JetStream in ``directory``.

    ``name`` is its server name, ``routes`` the cluster ports of its peers (empty: a server of
    its own), ``max_payload`` the largest message it takes. The client, cluster and
    monitoring ports are picked once and kept by every restart, so clients holding
    :attr:`url` reach the restarted server. Its log is ``directory/nats.log``.
    """

    log_name = "nats.log"

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        name: str = "n1",
        cluster_port: int | None = None,
        routes: tuple[int, ...] = (),
        binary: str | None = None,
        max_payload: str = MAX_PAYLOAD,
    ) -> None:
        super().__init__(Path(directory))
        self.directory.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.what = f"nats-server {name}"
        self.binary = binary or find_nats_server()
        self.port = free_port()
        self.monitor_port = free_port()
        self.cluster_port = cluster_port
        self.routes = tuple(routes)
        self.max_payload = max_payload

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def _command(self) -> list[str]:
        config = self.directory / "nats.conf"
        lines = [
            f"server_name: {self.name}",
            "host: 127.0.0.1",
            f"port: {self.port}",
            f"http_port: {self.monitor_port}",
            f"max_payload: {self.max_payload}",
            "jetstream {",
            f"  store_dir: {str(self.directory / 'jetstream')!r}",
            "  max_memory_store: 64MB",
            "  max_file_store: 4GB",
            "}",
        ]
        if self.cluster_port is not None:
            routes = ", ".join(f"nats-route://127.0.0.1:{port}" for port in self.routes)
            lines += ["cluster {", "  name: gln", f"  listen: 127.0.0.1:{self.cluster_port}",
                      f"  routes: [{routes}]", "}"]
        config.write_text("\n".join(lines) + "\n")
        return [self.binary, "-c", str(config)]

    def _monitor(self, path: str) -> httpx.Response:
        return httpx.get(f"http://127.0.0.1:{self.monitor_port}{path}", timeout=1.0)

    def _answers(self) -> bool:
        """True when the server says JetStream is up (``/healthz``, which in a cluster waits
        for the node to have caught up with its peers)."""
        try:
            return self._monitor("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def stream_leader(self, stream: str) -> str | None:
        """The server name this node reports as ``stream``'s leader, None if it knows none."""
        jsz = self._monitor("/jsz?accounts=true&streams=true").json()
        for account in jsz.get("account_details") or ():
            for detail in account.get("stream_detail") or ():
                if detail.get("name") == stream:
                    return (detail.get("cluster") or {}).get("leader") or None
        return None

class NatsCluster:
    """``size`` :class:`NatsProcess` nodes routed into one JetStream cluster."""

    def __init__(self, directory: str | os.PathLike[str], size: int = 3) -> None:
        root = Path(directory)
        ports = [free_port() for _ in range(size)]
        self.nodes = [
            NatsProcess(root / f"n{i + 1}", name=f"n{i + 1}", cluster_port=port,
                        routes=tuple(p for p in ports if p != port))
            for i, port in enumerate(ports)
        ]

    @property
    def url(self) -> str:
        """Every node, as the service's ``GLN_WAL_URL`` lists them."""
        return "nats://" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    def node(self, name: str) -> NatsProcess:
        return next(node for node in self.nodes if node.name == name)

    def start(self, timeout_s: float = 60.0) -> Self:
        """Start every node at once (each waits for its peers), then wait until all are
        healthy: JetStream's meta group has a leader and every node has caught up."""
        for node in self.nodes:
            node.launch()
        for node in self.nodes:
            node.wait_until_answering(timeout_s)
        return self

    def leader_of(self, stream: str, timeout_s: float = 30.0,
                  other_than: str | None = None) -> NatsProcess:
        """The node that leads ``stream`` (as a running, unpaused node reports it), waiting
        until there is one (and, with ``other_than``, until it is not that node)."""
        deadline = time.monotonic() + timeout_s
        while True:
            for node in self.nodes:
                if not node.running or node.paused:
                    continue
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    leader = node.stream_leader(stream)
                    if leader and leader != other_than:
                        return self.node(leader)
            if time.monotonic() > deadline:
                raise TimeoutError(f"no leader of stream {stream!r} within {timeout_s} s")
            time.sleep(0.05)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@contextlib.contextmanager
def nats_cluster(directory: str | os.PathLike[str], size: int = 3) -> Iterator[NatsCluster]:
    """A started :class:`NatsCluster` of ``size`` nodes, stopped at the end (paused nodes
    resumed first). FileNotFoundError if there is no ``nats-server``."""
    cluster = NatsCluster(directory, size)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def nats_subjects(url: str, streams: list[str]) -> list[str]:
    """Every subject that holds a message in ``streams`` (those that exist), sorted: what a
    log leaves behind. Asked with nats-py on a thread of its own (any loop may be running)."""
    import asyncio
    import concurrent.futures

    import nats
    import nats.js.errors

    async def subjects() -> list[str]:
        nc = await nats.connect(url)
        try:
            js, found = nc.jetstream(), []
            for stream in streams:
                try:
                    info = await js.stream_info(stream, subjects_filter=">")
                except nats.js.errors.NotFoundError:
                    continue
                found += [s for s, count in (info.state.subjects or {}).items() if count]
            return sorted(found)
        finally:
            await nc.close()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, subjects()).result(30)
