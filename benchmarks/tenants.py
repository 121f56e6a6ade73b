"""Many tenants on one server: a small model per customer, each learning one example at a time.

On a server it starts (``python -m service``, file log and snapshots in a temporary directory),
this creates ``--models`` small models (20 features, layers [32, 32, 1]), timing each create;
sends single-example learns, each with its own Idempotency-Key, over ``--connections``
keep-alive connections for ``--duration`` seconds, first each to a random model, then all to
one model (the rate the spread load is set beside); scrapes ``/metrics`` (time, size, series);
reads the server's memory and open files; stops it with SIGTERM (the time to exit is the
shutdown snapshots') and starts it again (the time to ``/readyz`` ready is the restore). It
prints one JSON line.

    python benchmarks/tenants.py --models 10000
    python benchmarks/tenants.py --models 1000 --duration 5 --server-env GLN_WORKERS=2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.service_load import (  # noqa: E402
    RawConnection,
    _drive,
    free_port,
    percentile_ms,
)

REPO = Path(__file__).resolve().parents[1]
CONFIG = {"num_features": 20, "num_classes": 2, "layer_sizes": [32, 32, 1], "context_dim": 4}


class Server:
    """``python -m service`` on a port and a data directory that outlive a restart."""

    def __init__(self, data_dir: str, extra_env: dict[str, str], models: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("GLN_")}
        self.env.update(GLN_PORT=str(self.port), GLN_SNAPSHOT_DIR=data_dir,
                        GLN_SNAPSHOT_INTERVAL_S="3600", GLN_LOG_LEVEL="warning",
                        GLN_MAX_MODELS=str(max(models, 1000)), GLN_MAX_CONNECTIONS="10000")
        self.env.update(extra_env)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        """Start it; seconds until ``/readyz`` answers ready (every stored model restored)."""
        t0 = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-m", "service"], cwd=REPO, env=self.env)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200:
                    return time.perf_counter() - t0
            except httpx.TransportError:
                pass
            time.sleep(0.02)
        raise RuntimeError("server not ready within 600 s")

    def stop(self) -> float:
        """SIGTERM; seconds until it exited (its shutdown snapshots included)."""
        assert self.proc is not None
        t0 = time.perf_counter()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return time.perf_counter() - t0

    def resources(self) -> dict[str, Any]:
        """Resident memory (MiB) and open file descriptors of the server process."""
        assert self.proc is not None
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        rss_kib = next(int(line.split()[1]) for line in status.splitlines()
                       if line.startswith("VmRSS:"))
        return {"rss_mib": round(rss_kib / 1024, 1),
                "open_files": len(os.listdir(f"/proc/{self.proc.pid}/fd"))}


def create_models(url: str, count: int) -> list[float]:
    """Create ``count`` models one after another; each create's seconds."""
    times = []
    with httpx.Client(base_url=url, timeout=120) as client:
        for i in tqdm(range(count), desc="create", unit="model", file=sys.stderr):
            t0 = time.perf_counter()
            r = client.post("/v1/models", json={"name": f"t{i}", "config": CONFIG})
            times.append(time.perf_counter() - t0)
            r.raise_for_status()
    return times


async def learn_load(url: str, models: list[str], connections: int, warmup: float,
                     duration: float, seed: int) -> tuple[list[float], int]:
    """Single-example learns, each to a model drawn from ``models``, each with its own key."""
    rng = np.random.default_rng(seed)
    rows = rng.normal(size=(256, CONFIG["num_features"])).round(4)
    bodies = [json.dumps({"features": [row.tolist()], "labels": [int(row[0] > 0)]}).encode()
              for row in rows]
    conns = [RawConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), None)
             for _ in range(connections)]
    await asyncio.gather(*(c.open() for c in conns))
    picks = rng.integers(0, len(models), size=1 << 16)
    prefix = str(rng.integers(1 << 62))

    def sender(k: int, conn: RawConnection) -> Any:
        def send(i: int) -> Any:
            body = bodies[i % len(bodies)]
            name = models[picks[i % len(picks)]]
            head = (f"POST /v1/models/{name}/learn HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                    f"Idempotency-Key: {prefix}-{k}-{i}\r\n\r\n").encode()
            return conn.send(head + body)
        return send

    try:
        return await _drive([sender(k, c) for k, c in enumerate(conns)], warmup, duration)
    finally:
        await asyncio.gather(*(c.close() for c in conns))


def load_figures(latencies: list[float], errors: int, duration: float) -> dict[str, Any]:
    latencies.sort()
    return {"requests_per_s": round(len(latencies) / duration, 1), "errors": errors,
            "p50_ms": round(percentile_ms(latencies, 0.50), 2),
            "p99_ms": round(percentile_ms(latencies, 0.99), 2)}


def scrape(url: str) -> dict[str, Any]:
    """/metrics three times: the median time, the page's size and its series."""
    times, page = [], ""
    with httpx.Client(base_url=url, timeout=120) as client:
        for _ in range(3):
            t0 = time.perf_counter()
            page = client.get("/metrics").text
            times.append(time.perf_counter() - t0)
    series = sum(1 for line in page.splitlines() if line and not line.startswith("#"))
    return {"metrics_ms": round(1000 * sorted(times)[1], 1), "metrics_bytes": len(page),
            "metrics_series": series}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds measured")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring")
    parser.add_argument("--server-env", nargs="*", default=[], metavar="GLN_X=VALUE",
                        help="settings for the server, e.g. GLN_WORKERS=2")
    args = parser.parse_args(argv)
    extra_env = dict(item.split("=", 1) for item in args.server_env)
    with tempfile.TemporaryDirectory(prefix="gln-tenants-") as data_dir:
        server = Server(data_dir, extra_env, args.models)
        server.start()
        try:
            creates = create_models(server.url, args.models)
            names = [f"t{i}" for i in range(args.models)]
            spread = asyncio.run(learn_load(server.url, names, args.connections, args.warmup,
                                            args.duration, seed=1))
            one = asyncio.run(learn_load(server.url, names[:1], args.connections,
                                         args.warmup, args.duration, seed=2))
            figures = scrape(server.url)
            figures.update(server.resources())
        finally:
            stop_s = server.stop()
        ready_s = server.start()
        server.stop()
    tail = sorted(creates[-max(1, len(creates) // 10):])
    row = {
        "models": args.models, "connections": args.connections, "duration_s": args.duration,
        "server_env": extra_env,
        "create_p50_ms": round(1000 * float(np.median(creates)), 2),
        "create_last_tenth_p99_ms": round(percentile_ms(tail, 0.99), 2),
        "random_model": load_figures(*spread, args.duration),
        "one_model": load_figures(*one, args.duration),
        **figures,
        "sigterm_to_exit_s": round(stop_s, 2), "restart_to_ready_s": round(ready_s, 2),
        "cpus": os.cpu_count(), "python": platform.python_version(),
    }
    row["random_over_one"] = round(row["random_model"]["requests_per_s"]
                                   / max(row["one_model"]["requests_per_s"], 1e-9), 3)
    print(json.dumps(row), flush=True)
    return row


if __name__ == "__main__":
    main()
