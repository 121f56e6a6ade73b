"""Load test of the HTTP service: requests/s and latency of learn and predict.

Scenarios: two models (a small one, 20 features and layers [32, 32, 1]; the MNIST-sized one,
784 features, 10 classes, [128, 128, 1], context_dim 4) x three verbs (learn, predict, and
predict-ids: predict with ids, so the rows wait for labels, which logs them) x two batch sizes
(1 and 100 rows per request) in JSON, and binary rows (``.npz``): learn in 1,000-row requests,
predict in 4,096-row requests, and a learning stream (a WebSocket per connection, 1,000-row
batches, ``--stream-in-flight`` batches ahead of their answers). Each scenario runs
``--connections`` concurrent keep-alive connections for ``--duration`` seconds (after
``--warmup``), and prints one JSON line: requests/s, examples/s, p50/p99/p99.9/max/mean
latency in ms, errors.

By default it starts a server itself (``python -m service`` on a free port, snapshots in a
temporary directory) and stops it at the end, once per ``--workers`` value (GLN_WORKERS), so
that one run sets the multi-process service beside the single process; ``--url`` targets a
running one instead.

The client is a few lines of plain asyncio speaking HTTP/1.1 on raw sockets, with every
request body encoded before the clock starts: on a small machine the client shares the cores
with the server, and a lighter client leaves more of them to what is being measured.
``--client httpx`` uses ``httpx.AsyncClient`` (pool limited to ``--connections``) instead.

    python benchmarks/service_load.py                      # all scenarios, own server
    python benchmarks/service_load.py --only small --duration 5
    python benchmarks/service_load.py --only small-learn-1 --server-env GLN_WAL_ENABLED=false
    python benchmarks/service_load.py --only small-learn-1 --keyed \
        --server-env GLN_WAL_URL=nats://127.0.0.1:4222,127.0.0.1:4223,127.0.0.1:4224
    python benchmarks/service_load.py --only small-learn-1 small-learn-1000-npz --workers 1 2
    python benchmarks/service_load.py --url http://127.0.0.1:8000 --token "$GLN_API_TOKEN"
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]

MODELS = {
    "small": {"num_features": 20, "num_classes": 2, "layer_sizes": [32, 32, 1],
              "context_dim": 4},
    "mnist": {"num_features": 784, "num_classes": 10, "layer_sizes": [128, 128, 1],
              "context_dim": 4, "learning_rate": {"schedule": "inverse_time", "scale": 100.0,
                                                  "cap": 0.01}},
}
VERBS = ("learn", "predict", "predict-ids")
ROUTES = {"learn": "learn", "predict": "predict", "predict-ids": "predict", "stream": "stream"}
BATCHES = (1, 100)
# Binary rows: (verb, rows a request), each in .npz bodies.
BINARY = (("learn", 1000), ("predict", 4096), ("stream", 1000))
DISTINCT_BODIES = 16  # requests cycle through this many pre-encoded bodies
NPZ = "application/x-npz"


@dataclass
class Scenario:
    model: str
    verb: str
    batch: int
    binary: bool = False

    @property
    def name(self) -> str:
        return f"{self.model}-{self.verb}-{self.batch}" + ("-npz" if self.binary else "")


def encode_bodies(config: dict, verb: str, batch: int, seed: int,
                  binary: bool = False) -> list[bytes]:
    """Bodies with random rows (and labels for learn), encoded once up front: JSON, or
    ``.npz`` of float32 rows."""
    rng = np.random.default_rng(seed)
    d, k = config["num_features"], config["num_classes"]
    bodies = []
    for b in range(DISTINCT_BODIES):
        X = np.round(rng.normal(size=(batch, d)), 4)
        arrays = {"features": X.astype(np.float32)}
        if verb in ("learn", "stream"):
            arrays["labels"] = rng.integers(0, k, size=batch)
        if verb == "predict-ids":  # a body sent again replaces its rows: a bounded wait
            arrays["ids"] = np.array([f"row-{b}-{i}" for i in range(batch)])
        if binary:
            buffer = io.BytesIO()
            np.savez(buffer, **arrays)
            bodies.append(buffer.getvalue())
        else:
            body = {key: value.tolist() for key, value in arrays.items()}
            body["features"] = X.tolist()
            bodies.append(json.dumps(body, separators=(",", ":")).encode())
    return bodies


# -- clients --------------------------------------------------------------------------------------
class RawConnection:
    """One keep-alive HTTP/1.1 connection on asyncio streams; enough for this server."""

    def __init__(self, host: str, port: int, token: str | None,
                 content_type: str = "application/json") -> None:
        self.host, self.port, self.content_type = host, port, content_type
        self.auth = f"Authorization: Bearer {token}\r\n".encode() if token else b""
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        sock = self.writer.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def request_bytes(self, path: str, body: bytes, key: str | None = None) -> bytes:
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Content-Type: {self.content_type}\r\nContent-Length: {len(body)}\r\n").encode()
        if key is not None:
            head += f"Idempotency-Key: {key}\r\n".encode()
        return head + self.auth + b"\r\n" + body

    async def send(self, raw: bytes) -> int:
        """Send one pre-built request; return the response status (body read and dropped)."""
        assert self.reader is not None and self.writer is not None
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
                break
        if length:
            await self.reader.readexactly(length)
        return status

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except OSError:
                pass


async def _drive(senders: list[Callable[[int], Awaitable[int]]], warmup: float,
                 duration: float) -> tuple[list[float], int]:
    """Run every sender in a closed loop; latencies and non-200 count after the warm-up.

    ``sender(i)`` sends the i-th request body and returns the response status.
    """
    latencies: list[float] = []
    errors = 0
    measure_from = time.perf_counter() + warmup
    stop_at = measure_from + duration

    async def worker(send: Callable[[int], Awaitable[int]], offset: int) -> None:
        nonlocal errors
        i = offset
        while True:
            t0 = time.perf_counter()
            if t0 >= stop_at:
                return
            status = await send(i)
            t1 = time.perf_counter()
            i += 1
            if t0 >= measure_from:
                latencies.append(t1 - t0)
                if status != 200:
                    errors += 1

    await asyncio.gather(*(worker(send, k * 7) for k, send in enumerate(senders)))
    return latencies, errors


async def run_raw(url: str, path: str, bodies: list[bytes], connections: int,
                  warmup: float, duration: float, token: str | None,
                  content_type: str = "application/json",
                  keyed: bool = False) -> tuple[list[float], int]:
    """``keyed``: every request carries an Idempotency-Key of its own."""
    parts = urlsplit(url)
    conns = [RawConnection(parts.hostname or "127.0.0.1", parts.port or 80, token, content_type)
             for _ in range(connections)]
    await asyncio.gather(*(c.open() for c in conns))
    raws = [conns[0].request_bytes(path, b) for b in bodies]
    run = f"{time.time_ns():x}"

    def sender(conn: RawConnection) -> Callable[[int], Awaitable[int]]:
        if keyed:
            return lambda i: conn.send(conn.request_bytes(
                path, bodies[i % len(bodies)], f"{run}-{id(conn):x}-{i}"))
        return lambda i: conn.send(raws[i % len(raws)])

    try:
        return await _drive([sender(c) for c in conns], warmup, duration)
    finally:
        await asyncio.gather(*(c.close() for c in conns))


async def run_stream(url: str, path: str, bodies: list[bytes], connections: int,
                     warmup: float, duration: float, token: str | None,
                     in_flight: int = 8) -> tuple[list[float], int]:
    """One learning stream per connection, ``in_flight`` batches ahead of their answers; each
    answer's latency from its batch's send, and the answers that carry an error."""
    import websockets  # noqa: PLC0415 - uvicorn[standard] installs it; only this needs it

    headers = {"authorization": f"Bearer {token}"} if token else {}
    ws_url = url.replace("http://", "ws://", 1) + path
    latencies: list[float] = []
    errors = 0
    loop = asyncio.get_running_loop()
    start = loop.time()
    measure_from, stop_at = start + warmup, start + warmup + duration

    async def one(offset: int) -> None:
        nonlocal errors
        async with websockets.connect(ws_url, additional_headers=headers, max_size=None,
                                      compression=None) as ws:
            sent: asyncio.Queue[float] = asyncio.Queue()
            slots = asyncio.Semaphore(in_flight)

            async def send() -> None:
                i = offset
                while loop.time() < stop_at:
                    await slots.acquire()
                    sent.put_nowait(loop.time())
                    await ws.send(bodies[i % len(bodies)])
                    i += 1
                sent.put_nowait(-1.0)

            sender = asyncio.create_task(send())
            while (t0 := await sent.get()) >= 0:
                answer = await ws.recv()
                slots.release()
                t1 = loop.time()
                if measure_from <= t0 and t1 <= stop_at:
                    latencies.append(t1 - t0)
                    errors += answer[:1] == b"{"  # an error's JSON, not an .npz
            await sender

    await asyncio.gather(*(one(k * 7) for k in range(connections)))
    return latencies, errors


async def run_httpx(url: str, path: str, bodies: list[bytes], connections: int,
                    warmup: float, duration: float, token: str | None) -> tuple[list[float], int]:
    headers = {"content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    async with httpx.AsyncClient(base_url=url, limits=limits, headers=headers,
                                 timeout=60) as client:

        async def send(i: int) -> int:
            response = await client.post(path, content=bodies[i % len(bodies)])
            return response.status_code

        return await _drive([send] * connections, warmup, duration)


# -- the server -----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def own_server(token: str | None, extra_env: dict[str, str] | None = None) -> Iterator[str]:
    """``python -m service`` on a free port with a throwaway snapshot directory.

    ``extra_env`` adds ``GLN_*`` settings (e.g. ``GLN_WAL_ENABLED=false``).
    """
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="gln-bench-") as snapshots:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GLN_")}
        env.update(GLN_PORT=str(port), GLN_SNAPSHOT_DIR=snapshots,
                   GLN_SNAPSHOT_INTERVAL_S="3600", GLN_LOG_LEVEL="warning")
        if token:
            env["GLN_API_TOKEN"] = token
        env.update(extra_env or {})
        proc = subprocess.Popen([sys.executable, "-m", "service"], cwd=REPO, env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited with {proc.returncode}")
                try:
                    if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("server did not start within 60 s")
                time.sleep(0.1)
            yield url
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


# -- main -----------------------------------------------------------------------------------------
def percentile_ms(sorted_s: list[float], q: float) -> float:
    if not sorted_s:
        return float("nan")
    return 1000 * sorted_s[min(len(sorted_s) - 1, int(q * len(sorted_s)))]


def run_scenario(url: str, scenario: Scenario, args: argparse.Namespace) -> dict:
    headers = {"authorization": f"Bearer {args.token}"} if args.token else {}
    name = f"bench-{scenario.model}"
    config = MODELS[scenario.model]
    with httpx.Client(base_url=url, headers=headers, timeout=120) as client:
        client.delete(f"/v1/models/{name}")
        r = client.post("/v1/models", json={"name": name, "config": config})
        r.raise_for_status()
        if scenario.verb not in ("learn", "stream"):  # predict a model that has learned
            for body in encode_bodies(config, "learn", 100, seed=1)[:5]:
                client.post(f"/v1/models/{name}/learn", content=body,
                            headers={"content-type": "application/json"}).raise_for_status()
    bodies = encode_bodies(config, scenario.verb, scenario.batch, seed=2, binary=scenario.binary)
    path = f"/v1/models/{name}/{ROUTES[scenario.verb]}"
    if scenario.verb == "stream":
        run = run_stream(url, path, bodies, args.connections, args.warmup, args.duration,
                         args.token, args.stream_in_flight)
    elif args.client == "raw":
        run = run_raw(url, path, bodies, args.connections, args.warmup, args.duration,
                      args.token, NPZ if scenario.binary else "application/json", args.keyed)
    else:
        run = run_httpx(url, path, bodies, args.connections, args.warmup, args.duration,
                        args.token)
    latencies, errors = asyncio.run(run)
    with httpx.Client(base_url=url, headers=headers, timeout=120) as client:
        client.delete(f"/v1/models/{name}")
    latencies.sort()
    n = len(latencies)
    return {
        "scenario": scenario.name,
        "workers": args.workers_now,
        "model": scenario.model,
        "verb": scenario.verb,
        "batch": scenario.batch,
        "connections": args.connections,
        "client": args.client,
        "keyed": args.keyed,
        "duration_s": args.duration,
        "requests": n,
        "errors": errors,
        "requests_per_s": round(n / args.duration, 1),
        "examples_per_s": round(n * scenario.batch / args.duration, 1),
        "p50_ms": round(percentile_ms(latencies, 0.50), 3),
        "p99_ms": round(percentile_ms(latencies, 0.99), 3),
        "p999_ms": round(percentile_ms(latencies, 0.999), 3),
        "max_ms": round(1000 * latencies[-1], 3) if n else None,
        "mean_ms": round(1000 * sum(latencies) / n, 3) if n else None,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running server; default: start one")
    parser.add_argument("--token", default=os.environ.get("GLN_API_TOKEN"),
                        help="bearer token (default $GLN_API_TOKEN)")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds measured")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring")
    parser.add_argument("--client", choices=["raw", "httpx"], default="raw")
    parser.add_argument("--only", nargs="*", default=[],
                        help="scenarios to run: exact names (small-learn-1) or parts of names "
                        "(small, learn)")
    parser.add_argument("--server-env", nargs="*", default=[], metavar="GLN_X=VALUE",
                        help="settings for the server this starts, e.g. GLN_WAL_ENABLED=false")
    parser.add_argument("--workers", type=int, nargs="*", default=[1],
                        help="GLN_WORKERS of the servers this starts, one after the other "
                        "(e.g. 1 4: the single process beside four HTTP workers)")
    parser.add_argument("--keyed", action="store_true",
                        help="every request with an Idempotency-Key of its own (raw client)")
    parser.add_argument("--stream-in-flight", type=int, default=8,
                        help="batches a stream sends ahead of their answers")
    args = parser.parse_args(argv)
    if args.keyed and args.client != "raw":
        parser.error("--keyed needs the raw client")
    extra_env = dict(item.split("=", 1) for item in args.server_env)

    scenarios = [Scenario(m, v, b) for m in MODELS for v in VERBS for b in BATCHES]
    scenarios += [Scenario(m, v, b, binary=True) for m in MODELS for v, b in BINARY]
    if args.only:  # an exact scenario name selects just it; anything else, by substring
        names = {s.name for s in scenarios}
        scenarios = [s for s in scenarios
                     if any(w == s.name or (w not in names and w in s.name) for w in args.only)]
    if args.url:
        args.workers_now = None  # not known
        for s in scenarios:
            print(json.dumps(run_scenario(args.url, s, args)), flush=True)
        return
    for workers in args.workers:
        args.workers_now = workers
        with own_server(args.token, {**extra_env, "GLN_WORKERS": str(workers)}) as url:
            for s in scenarios:
                print(json.dumps(run_scenario(url, s, args)), flush=True)


if __name__ == "__main__":
    main()
