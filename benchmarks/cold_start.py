"""What a server's first model costs with Numba's cache precompiled and with it empty.

    python benchmarks/cold_start.py

Fills a fresh cache with ``python -m gln.kernels.precompile`` (as the CPU image does while it is
built), then starts a server on it and one on an empty cache, in turn, and times over HTTP the
first create of the MNIST network, its first one-row learn and its first 100-row learn. Prints
one JSON line per server.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.service_load import MODELS, REPO, own_server  # noqa: E402


def first_calls(url: str) -> dict[str, float]:
    """Seconds of the first create, one-row learn and 100-row learn of the MNIST network."""
    config = MODELS["mnist"]
    row = [0.5] * config["num_features"]
    calls = {
        "create_s": ("/v1/models", {"name": "cold", "config": config}),
        "first_learn_1_row_s": ("/v1/models/cold/learn", {"features": [row], "labels": [3]}),
        "first_learn_100_rows_s": ("/v1/models/cold/learn",
                                   {"features": [row] * 100, "labels": [3] * 100}),
    }
    seconds = {}
    with httpx.Client(base_url=url, timeout=120) as client:
        for name, (path, body) in calls.items():
            start = time.perf_counter()
            client.post(path, json=body).raise_for_status()
            seconds[name] = round(time.perf_counter() - start, 3)
    return seconds


def main(argv: list[str] | None = None) -> list[dict]:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="gln-numba-") as caches:
        precompiled, empty = Path(caches, "precompiled"), Path(caches, "empty")
        subprocess.run([sys.executable, "-m", "gln.kernels.precompile"], cwd=REPO, check=True,
                       env={**os.environ, "NUMBA_CACHE_DIR": str(precompiled)},
                       stdout=subprocess.DEVNULL)
        for cache in (precompiled, empty):
            with own_server(None, {"NUMBA_CACHE_DIR": str(cache)}) as url:
                result = {"benchmark": "cold_start", "cache": cache.name, **first_calls(url)}
            print(json.dumps(result), flush=True)
            results.append(result)
    return results


if __name__ == "__main__":
    main()
