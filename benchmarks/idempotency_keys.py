"""What remembered idempotency keys cost the write-ahead logs, for one model.

    python benchmarks/idempotency_keys.py                      # a million keys, file log
    python benchmarks/idempotency_keys.py --redis-url redis://127.0.0.1:6379/15 --keys 300000

File log (``GLN_WAL_DIR``): the memory the keys take, the base record a trim writes them into,
the trim's time (the model cannot learn meanwhile) and the time to re-open the file at start-up.
Redis log (with ``--redis-url``): the time ``delete`` takes to find the keys with a SCAN and
delete them, as deleting or re-creating a model does. Every key carries a request digest, as
the service's keys do. Uses only its own temporary directory, or keys under its own prefix in
the given Redis database. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from service.storage.wal import FileWriteAheadLog, RedisWriteAheadLog  # noqa: E402

KEYS_PER_CHUNK = 1000


def _chunks(total: int):
    """Chunks of one-row requests, each with its key and a 64-character digest."""
    x = np.zeros((KEYS_PER_CHUNK, 2), np.float32)
    y = np.zeros(KEYS_PER_CHUNK, np.int64)
    for start in range(0, total, KEYS_PER_CHUNK):
        n = min(KEYS_PER_CHUNK, total - start)
        yield x[:n], y[:n], [f"request-{i:012d}" for i in range(start, start + n)], ["d" * 64] * n


def file_log(keys: int) -> dict:
    """Memory, base record, trim and re-open of ``keys`` keys in the file log."""
    with tempfile.TemporaryDirectory() as directory:
        wal = FileWriteAheadLog(directory, fsync=False)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        last = None
        for x, y, names, digests in _chunks(keys):
            last = wal.append("m", x, y, idempotency_keys=names, request_rows=[1] * len(y),
                              request_digests=digests)
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        start = time.perf_counter()
        wal.trim_through("m", last)
        trim = time.perf_counter() - start
        size = os.path.getsize(Path(directory) / "m" / "wal.log")
        start = time.perf_counter()
        FileWriteAheadLog(directory, fsync=False).last_id("m")
        reopen = time.perf_counter() - start
        wal.close()
    return {"peak_rss_growth_mb": round(grown / 1024, 1), "base_record_mb": round(size / 1e6, 1),
            "trim_s": round(trim, 3), "reopen_s": round(reopen, 3)}


def redis_log(keys: int, url: str) -> dict:
    """Time of deleting a model whose log remembers ``keys`` keys."""
    wal = RedisWriteAheadLog(url, key_prefix=f"bench-idempotency-{uuid.uuid4().hex[:8]}")
    try:
        for x, y, names, digests in _chunks(keys):
            wal.append("m", x, y, idempotency_keys=names, request_rows=[1] * len(y),
                       request_digests=digests)
        start = time.perf_counter()
        wal.delete("m")
        return {"delete_s": round(time.perf_counter() - start, 3)}
    finally:
        wal.delete("m")
        wal.close()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description="What remembered idempotency keys cost the write-ahead logs."
    )
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--redis-url", help="also time the Redis log's delete (a database "
                        "to use; only this run's keys are written and removed)")
    args = parser.parse_args(argv)
    result = {"keys": args.keys, "file_log": file_log(args.keys)}
    if args.redis_url:
        result["redis_log"] = redis_log(args.keys, args.redis_url)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
