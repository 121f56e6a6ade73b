"""Time to recover from ``kill -9``: a ~100 MB model, its snapshot, and a log tail to replay.

For each store (a directory, then a private Redis with AOF): start ``python -m service``,
create an MNIST-sized model (784 features, 10 classes, layers [128, 128, 1], context_dim 4:
107 MB of arrays), learn ``--warm`` examples, take a snapshot, learn ``--tail`` more examples
in ``--rows``-row requests (one client, so one log entry per request), ``kill -9`` the server
and start it again. Measured from the new process's start:

* ``seconds_to_listening``: the first HTTP answer (imports, app start-up);
* ``seconds_to_ready``: the first ``/readyz`` 200, i.e. every model restored and replayed;
* ``replay_s``: the log replay alone, from the server's line "restored 'm': snapshot version
  %d, then %d log entries in %.3f s";
* ``snapshot_load_s``: ready - listening - replay (reading and decoding the snapshot),
  approximately (the restore starts at about the time the server starts listening).

Then, on the restored server, the same model moved over HTTP: ``export_s`` for
``GET /v1/models/m/export`` (the bytes, received) and ``import_s`` for posting them back as a
new model (upload, load, warm-up and its first snapshot in the store), whose predictions must
equal the original's.

Prints one JSON line.

    python benchmarks/recovery_time.py
    python benchmarks/recovery_time.py --tail 5000 --stores redis
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gln import GLN  # noqa: E402
from tests.service.durable_client import ServerProcess  # noqa: E402
from tests.support.redis_process import RedisProcess  # noqa: E402

CONFIG = {"num_features": 784, "num_classes": 10, "layer_sizes": [128, 128, 1],
          "context_dim": 4, "learning_rate": {"schedule": "inverse_time", "scale": 100.0,
                                              "cap": 0.01}, "seed": 0}
RESTORED = re.compile(
    r"restored 'm': snapshot version (\d+), then (\d+) log entries in ([\d.]+) s"
)


def learn(client: httpx.Client, rng: np.random.Generator, examples: int, rows: int) -> int:
    """Post ``examples`` random pixel rows in ``rows``-row requests; how many requests."""
    requests = 0
    for start in range(0, examples, rows):
        n = min(rows, examples - start)
        body = {"features": np.round(rng.random((n, CONFIG["num_features"])), 3).tolist(),
                "labels": rng.integers(0, CONFIG["num_classes"], size=n).tolist()}
        r = client.post("/v1/models/m/learn", json=body)
        r.raise_for_status()
        requests += 1
    return requests


def measure(env: dict[str, str], workdir: Path, args: argparse.Namespace) -> dict:
    """Build the model, snapshot, learn the tail, kill -9, restart; the timings."""
    rng = np.random.default_rng(args.seed)
    server = ServerProcess({**env, "GLN_SNAPSHOT_INTERVAL_S": "3600"}, workdir / "server.log")
    with server:
        server.start()
        with httpx.Client(base_url=server.url, timeout=600) as client:
            client.post("/v1/models", json={"name": "m", "config": CONFIG}).raise_for_status()
            learn(client, rng, args.warm, args.rows)
            snap = client.post("/v1/models/m/snapshot").json()
            entries = learn(client, rng, args.tail, args.rows)
        server.kill()
        server.start(ready_timeout_s=600)
        info = httpx.get(f"{server.url}/v1/models/m", timeout=60).json()
        found = RESTORED.findall(server.log_text())
        with httpx.Client(base_url=server.url, timeout=600) as client:
            moved = move(client, rng)
        server.kill()  # a graceful stop would write another 100 MB snapshot; not measured
    if info["examples_seen"] != args.warm + args.tail:
        raise AssertionError(f"restored {info['examples_seen']} examples, "
                             f"expected {args.warm + args.tail}")
    version, replayed, replay_s = found[-1]
    if (int(version), int(replayed)) != (snap["version"], entries):
        raise AssertionError(f"restored snapshot {version} + {replayed} entries, expected "
                             f"{snap['version']} + {entries}")
    assert server.listening_s is not None and server.ready_s is not None
    restore_s = server.ready_s - server.listening_s
    return {
        "snapshot_bytes": snap["nbytes"],
        "log_entries_replayed": int(replayed),
        "seconds_to_listening": round(server.listening_s, 3),
        "seconds_to_ready": round(server.ready_s, 3),
        "replay_s": float(replay_s),
        "snapshot_load_s": round(max(0.0, restore_s - float(replay_s)), 3),
        **moved,
    }


def move(client: httpx.Client, rng: np.random.Generator) -> dict:
    """Export model m and import its bytes as model "moved": the seconds each took."""
    start = time.perf_counter()
    blob = client.get("/v1/models/m/export").raise_for_status().content
    exported = time.perf_counter()
    client.post("/v1/models/moved/import", content=blob,
                headers={"content-type": "application/octet-stream"}).raise_for_status()
    imported = time.perf_counter()
    probe = {"features": np.round(rng.random((4, CONFIG["num_features"])), 3).tolist()}
    answers = [client.post(f"/v1/models/{name}/predict", json=probe).json()
               for name in ("m", "moved")]
    if answers[0] != answers[1]:
        raise AssertionError("the imported model predicts otherwise than the exported one")
    return {"export_bytes": len(blob), "export_s": round(exported - start, 3),
            "import_s": round(imported - exported, 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warm", type=int, default=1000, help="examples before the snapshot")
    parser.add_argument("--tail", type=int, default=2000, help="examples after it (replayed)")
    parser.add_argument("--rows", type=int, default=100, help="rows per learn request")
    parser.add_argument("--stores", default="directory,redis", help="comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    results = {}
    with tempfile.TemporaryDirectory(prefix="gln-recovery-") as tmp:
        for store in args.stores.split(","):
            workdir = Path(tmp) / store
            workdir.mkdir()
            print(f"recovery_time: {store} ...", file=sys.stderr)
            if store == "directory":
                results[store] = measure({"GLN_SNAPSHOT_DIR": str(workdir / "snapshots")},
                                         workdir, args)
            elif store == "redis":
                with RedisProcess(workdir / "redis") as redis_server:
                    env = {"GLN_REDIS_URL": redis_server.url,
                           "GLN_SNAPSHOT_DIR": str(workdir / "unused")}
                    results[store] = measure(env, workdir, args)
                    results[store]["redis"] = "appendonly yes, appendfsync everysec"
            else:
                parser.error(f"unknown store {store!r}")
    print(json.dumps({
        "benchmark": "recovery_time",
        "model_bytes": GLN.estimate_nbytes(CONFIG),
        "layer_sizes": CONFIG["layer_sizes"],
        "warm_examples": args.warm,
        "tail_examples_replayed": args.tail,
        "rows_per_request": args.rows,
        "stores": results,
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cpus",
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
