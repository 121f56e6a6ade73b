"""Whether a chunk staged on a thread of its own overlaps the caller's Python work, with and
without the caller waiting until the thread is inside its copy (no GPU needed).

    python benchmarks/staging_overlap.py [--rows 2048] [--features 784] [--work-ms 1.5]
                                         [--switch-interval-ms 5]

``gln.kernels.uploads.ChunkUploads.stage_ahead`` stages the next chunk of a long prediction
on a thread of its own while the caller launches the work of the chunk before, which is Python
that holds the GIL between its calls into CUDA. NumPy's copy runs without the GIL, but the
thread must take the GIL to start it, and a caller busy in Python lets go of it only when the
interpreter's switch interval has passed. This times, per chunk of a source larger than the
caches: the copy alone, the caller's work alone (``--work-ms`` of pure Python), and the two
together, the copy submitted first, with the caller going straight on (``no_handshake``) and
with the caller waiting until the thread is copying (``handshake``, as ``stage_ahead`` does).

``gln.kernels.uploads.LAUNCH_WHILE_STAGING`` has the staging thread write a mark, which needs
the GIL, as soon as its copy ends, while the caller launches: ``marked_*`` times, from the
submission with its handshake, when a thread staging the chunk could write its mark, with the
caller's pure Python beside it (``marked_beside_python``) and with a caller that lets go of the
GIL for a moment every 20 us, as CuPy's calls into the driver do (``marked_beside_launches``),
against the copy alone. ``--switch-interval-ms`` sets the interpreter's switch interval
(``sys.setswitchinterval``; Python's default is 5 ms): how soon a thread waiting for the GIL
asks a thread running Python to let go of it.

Prints one JSON line: milliseconds per chunk (medians).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gln.kernels.uploads import _stage  # noqa: E402


def python_work(seconds: float) -> None:
    """Pure Python for ``seconds``, holding the GIL as a caller launching kernels does."""
    start, count = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        count += 1


def launch_like_work(seconds: float, every: float = 20e-6) -> None:
    """Python for ``seconds`` that lets go of the GIL for a moment every ``every`` seconds, as
    a caller launching kernels does (CuPy calls the driver without the GIL)."""
    release = _C_LIBRARY.getpid  # any call through ctypes runs without the GIL
    start = due = time.perf_counter()
    while (now := time.perf_counter()) - start < seconds:
        if now >= due:
            release()
            due = now + every


_C_LIBRARY = ctypes.CDLL(None)


def source_chunks(rows: int, features: int, chunks: int) -> list[np.ndarray]:
    """``chunks`` float32 chunks of ``rows`` x ``features``, consecutive in one source array
    (larger than the caches at the defaults, as a pass over a data set is)."""
    source = np.random.default_rng(0).random((chunks * rows, features), dtype=np.float32)
    return [source[i * rows:(i + 1) * rows] for i in range(chunks)]


def timed(step: Callable[[np.ndarray], object]) -> Callable[[np.ndarray], float]:
    """``step`` returning the seconds it took."""
    def seconds(chunk: np.ndarray) -> float:
        start = time.perf_counter()
        step(chunk)
        return time.perf_counter() - start

    return seconds


def median_seconds(seconds: Callable[[np.ndarray], float], chunks: list[np.ndarray]) -> float:
    """The median over ``chunks`` of the seconds ``seconds`` returns for each."""
    return float(np.median([seconds(chunk) for chunk in chunks]))


def measure(rows: int, features: int, chunks: int, work_ms: float) -> dict:
    """Milliseconds per chunk of each way (see the module docstring)."""
    parts = source_chunks(rows, features, chunks)
    target = np.ones((rows, features), np.float32)
    work = work_ms / 1e3
    pool = concurrent.futures.ThreadPoolExecutor(1)

    def beside(chunk: np.ndarray, handshake: bool) -> None:
        copying = threading.Event() if handshake else None
        staged = pool.submit(_stage, target, chunk, copying)
        if copying is not None:
            copying.wait()
        python_work(work)
        staged.result()

    def marked(caller_work: Callable[[float], None]) -> Callable[[np.ndarray], float]:
        """Seconds from the submission until the staging thread, its copy done, runs Python
        again (where it would write its mark), with ``caller_work`` beside it."""
        def seconds(chunk: np.ndarray) -> float:
            copying, marked_at = threading.Event(), []
            start = time.perf_counter()
            staged = pool.submit(lambda: (_stage(target, chunk, copying),
                                          marked_at.append(time.perf_counter())))
            copying.wait()
            caller_work(work)
            staged.result()
            return marked_at[0] - start

        return seconds

    steps = {"copy": timed(lambda chunk: _stage(target, chunk)),
             "python_work": timed(lambda _: python_work(work)),
             "no_handshake": timed(lambda chunk: beside(chunk, False)),
             "handshake": timed(lambda chunk: beside(chunk, True)),
             "marked_beside_python": marked(python_work),
             "marked_beside_launches": marked(launch_like_work)}
    try:
        return {"benchmark": "staging_overlap", "rows": rows, "features": features,
                "chunks": chunks, "ms_per_chunk": {
                    name: median_seconds(step, parts) * 1e3
                    for name, step in steps.items()}}
    finally:
        pool.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2048, help="rows per chunk")
    parser.add_argument("--features", type=int, default=784)
    parser.add_argument("--chunks", type=int, default=64,
                        help="chunks of the source (64 of 2,048 x 784: 411 MB)")
    parser.add_argument("--work-ms", type=float, default=1.5,
                        help="the caller's Python per chunk, in milliseconds")
    parser.add_argument("--switch-interval-ms", type=float, default=None,
                        help="the interpreter's switch interval (default: as it is, 5 ms)")
    args = parser.parse_args(argv)
    interval = sys.getswitchinterval()
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1e3)
    try:
        record = measure(args.rows, args.features, args.chunks, args.work_ms)
        record["switch_interval_ms"] = round(sys.getswitchinterval() * 1e3, 6)
    finally:
        sys.setswitchinterval(interval)
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
