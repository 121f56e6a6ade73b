"""Where a long float32 prediction's host time goes before the device can start, by staging
setting of ``gln.kernels.uploads``, on one GPU.

    python benchmarks/gpu_staging.py [--data-dir DIR] [--rows 4096] [--calls 7]

Why: on an H200, a 4,096-row float32 prediction's host spent about 1.45 ms sending its first
2,048-row chunk while the device waited, when a plain copy of as many rows into pinned memory
took about 0.7 ms (``gpu_stages.py``: ``call_timeline``, ``staging_bandwidth``); the device's
work on the two chunks took about 3.2 ms, so that send is most of what stands between the call
and 1M rows/s. Lines:

* ``send_parts``: per chunk of a float32 source larger than the caches, ``ChunkUploads.send``'s
  host microseconds, the part spent in the host's copies into pinned memory (summed over the
  staging threads), and the time until the chunk's copy to the device had finished, by
  (``STAGING_THREADS``, ``STAGING_PIECES``, ``STAGING_BYTES_PER_THREAD``); medians. Eight
  threads, one a 512 KiB, beside the library's four: whether a host with more cores than
  this project's copies a chunk faster with more of them;
* ``timeline_by_staging``: ``call_timeline`` of ``--calls`` float32 predictions of ``--rows``
  rows with each ``STAGING_THREADS`` x ``STAGE_AHEAD`` (and four threads with
  ``LAUNCH_WHILE_STAGING``, for the first chunk with the next staged ahead and for every
  chunk; and with each call's rows page-locked where they lie, ``SEND_REGISTERED``, locked
  whole before the first copy, and the first chunk's first and the rest on a thread of its
  own, unlocked after the call returns, ``LOCK_REST_AHEAD`` and ``UNLOCK_AFTER_RETURN``),
  ``ChunkUploads.stage_ahead`` traced as a stage: each call's time
  and its first send's, and the stages of the median call. With ``LAUNCH_WHILE_STAGING``
  also ``marks``: per call and chunk sent while staging, when its last piece was marked
  (from its first thread's start), and the most time one of its threads spent off the CPU
  between its start and its mark (its wall time less its CPU time): a thread done copying
  waits for the GIL to write its mark, and this says how long a caller busy launching kept it
  waiting, which the CPU measures only beside stand-ins (``staging_overlap.py``);
* ``registered_send``: per chunk, the host's microseconds to page-lock its rows where they lie
  (``cudaHostRegister``), to copy them from there to the device on a stream of their own until
  done, and to unlock them: whether a float32 chunk sent from where it lies (one DMA, no
  staging copy) could beat staging it into pinned memory (``send_parts``); an ``error`` in
  the line where the driver refused.

MNIST's rows with ``--data-dir`` (or ``GLN_DATA_DIR``), random pixels otherwise. Prints one JSON
line per measurement, naming the device. Needs CuPy and a GPU.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gpu_learn import NETWORK, device_name, load_data, module_constants  # noqa: E402
from benchmarks.gpu_stages import call_timeline  # noqa: E402
from gln import GLN  # noqa: E402

# (STAGING_THREADS, STAGING_PIECES, STAGING_BYTES_PER_THREAD)
SEND_SETTINGS = ((1, 1, 2 << 20), (1, 4, 2 << 20), (4, 1, 2 << 20), (4, 4, 2 << 20),
                 (8, 8, 1 << 19))
# (STAGING_THREADS, STAGE_AHEAD, LAUNCH_WHILE_STAGING, SEND_REGISTERED, and both of
# LOCK_REST_AHEAD and UNLOCK_AFTER_RETURN)
TIMELINE_SETTINGS = ((1, False, False, False, False), (1, True, False, False, False),
                     (4, False, False, False, False), (4, True, False, False, False),
                     (4, True, True, False, False), (4, False, True, False, False),
                     (4, True, False, True, False), (4, True, False, True, True))


def emit(record: dict, device: str) -> None:
    print(json.dumps({"benchmark": "gpu_staging", "device": device, **record}), flush=True)


def send_parts(cp, X: np.ndarray, rows: int, device: str) -> None:
    """``send_parts`` lines (see the module docstring)."""
    import gln.kernels.uploads as uploads  # noqa: PLC0415

    chunks = [X[start:start + rows] for start in range(0, len(X) - rows + 1, rows)]
    staged: list[float] = []
    stage = uploads._stage

    def timed_stage(host: np.ndarray, part: np.ndarray, copying=None) -> None:
        start = time.perf_counter()
        stage(host, part, copying)
        staged.append(time.perf_counter() - start)

    for threads, pieces, bytes_per_thread in SEND_SETTINGS:
        parts: dict[str, list[float]] = {"send": [], "staging": [], "until_copied": []}
        with module_constants(uploads, STAGING_THREADS=threads, STAGING_PIECES=pieces,
                              STAGING_BYTES_PER_THREAD=bytes_per_thread, _stage=timed_stage), \
                uploads.ChunkUploads(rows, X.shape[1]) as sender:
            for chunk in chunks:
                cp.cuda.Device().synchronize()
                staged.clear()
                start = time.perf_counter()
                sender.send(chunk)
                sent = time.perf_counter()
                cp.cuda.get_current_stream().synchronize()
                parts["until_copied"].append(time.perf_counter() - start)
                parts["send"].append(sent - start)
                parts["staging"].append(sum(staged))
                sender.consumed()
        emit({"measure": "send_parts", "rows": rows, "chunks": len(chunks),
              "staging_threads": threads, "staging_pieces": pieces,
              "staging_bytes_per_thread": bytes_per_thread,
              "median_us": {name: float(np.median(seconds)) * 1e6
                            for name, seconds in parts.items()}}, device)


def registered_sends(cp, X: np.ndarray, rows: int, device: str) -> None:
    """The ``registered_send`` line (see the module docstring)."""
    from gln.kernels.page_locks import pages_of  # noqa: PLC0415

    chunks = [np.ascontiguousarray(X[start:start + rows])
              for start in range(0, len(X) - rows + 1, rows)]
    target = cp.empty((rows, X.shape[1]), dtype=cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    runtime = cp.cuda.runtime
    parts: dict[str, list[float]] = {"register": [], "copy": [], "unregister": []}
    try:
        for chunk in chunks:
            first, size = pages_of(chunk)  # the whole pages, as the library locks them
            start = time.perf_counter()
            runtime.hostRegister(first, size, 0)
            registered = time.perf_counter()
            target.set(chunk, stream=stream)
            stream.synchronize()
            copied = time.perf_counter()
            runtime.hostUnregister(first)
            parts["register"].append(registered - start)
            parts["copy"].append(copied - registered)
            parts["unregister"].append(time.perf_counter() - copied)
    except Exception as exc:  # noqa: BLE001 - the driver's refusal is the finding
        emit({"measure": "registered_send", "rows": rows, "error": repr(exc)}, device)
        return
    emit({"measure": "registered_send", "rows": rows, "chunks": len(chunks),
          "median_us": {name: float(np.median(seconds)) * 1e6
                        for name, seconds in parts.items()}}, device)


@dataclass
class PieceMark:
    """One staging thread of a chunk sent while staging: the send's serial number, when the
    thread started and marked its piece (``time.perf_counter``), and its CPU time between."""

    serial: int
    started: float
    marked: float
    cpu: float


def traced_marks(stage_and_mark: Callable, marks: list[PieceMark]) -> Callable:
    """``uploads._stage_and_mark`` appending a ``PieceMark`` to ``marks`` for each piece."""
    @functools.wraps(stage_and_mark)
    def traced(host, rows, marks_array, piece, serial, copying) -> None:
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            stage_and_mark(host, rows, marks_array, piece, serial, copying)
        finally:
            marks.append(PieceMark(serial, started, time.perf_counter(),
                                   time.thread_time() - cpu))

    return traced


def marks_summary(calls: list[list[PieceMark]]) -> dict:
    """``timeline_by_staging``'s ``marks`` (see the module docstring): per call, a list over
    its chunks sent while staging of the microseconds from the chunk's first staging thread's
    start until its last mark, of the most any of its threads spent off the CPU between its
    start and its mark, and of its pieces."""
    summary: dict[str, list[list[float]]] = {"last_marked_us": [], "most_off_cpu_us": [],
                                             "pieces": []}
    for call in calls:
        chunks = [[m for m in call if m.serial == serial]
                  for serial in sorted({m.serial for m in call})]
        summary["last_marked_us"].append(
            [(max(m.marked for m in c) - min(m.started for m in c)) * 1e6 for c in chunks])
        summary["most_off_cpu_us"].append(
            [max(m.marked - m.started - m.cpu for m in c) * 1e6 for c in chunks])
        summary["pieces"].append([len(c) for c in chunks])
    return summary


def timelines_by_staging(cp, X: np.ndarray, y: np.ndarray, rows: int, calls: int,
                         device: str) -> None:
    """``timeline_by_staging`` lines (see the module docstring)."""
    import gln.kernels.uploads as uploads  # noqa: PLC0415
    from gln.kernels.page_locks import wait_for_unlocks  # noqa: PLC0415

    model = GLN(**NETWORK, device="cuda")
    model.learn(X[:rows], y[:rows])
    model.predict_proba(X[:rows])
    batches = [X[start:start + rows] for start in range(rows, len(X) - rows + 1, rows)]
    for threads, ahead, behind, locked, around in TIMELINE_SETTINGS:
        marks: list[PieceMark] = []
        by_call: list[list[PieceMark]] = []
        timelines = []
        with module_constants(uploads, STAGING_THREADS=threads, STAGE_AHEAD=ahead,
                              LAUNCH_WHILE_STAGING=behind, SEND_REGISTERED=locked,
                              LOCK_REST_AHEAD=around, UNLOCK_AFTER_RETURN=around,
                              _stage_and_mark=traced_marks(uploads._stage_and_mark, marks)):
            model.predict_proba(batches[0])  # the staging threads started
            for batch in itertools.islice(itertools.cycle(batches), calls):
                marks.clear()
                timelines.append(call_timeline(
                    cp, model, functools.partial(model.predict_proba, batch),
                    also=((uploads.ChunkUploads, "stage_ahead"),)))
                by_call.append(list(marks))
        first_sends = [next(s for s in t["stages"] if s["stage"] == "_sent") for t in timelines]
        median = sorted(timelines, key=lambda t: t["call_us"])[len(timelines) // 2]
        record = {"measure": "timeline_by_staging", "rows": rows, "staging_threads": threads,
                  "stage_ahead": ahead, "launch_while_staging": behind,
                  "send_registered": locked, "lock_rest_ahead": around,
                  "unlock_after_return": around, "call_us": [t["call_us"] for t in timelines],
                  "first_send_us": [s["host_left_us"] - s["host_entered_us"]
                                    for s in first_sends],
                  "median_call": median}
        if all(by_call):  # chunks were sent while staging
            record["marks"] = marks_summary(by_call)
        emit(record, device)
    wait_for_unlocks()  # none left locked for what follows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", help="directory of the MNIST IDX files (or GLN_DATA_DIR)")
    parser.add_argument("--rows", type=int, default=4096, help="rows per prediction call")
    parser.add_argument("--send-rows", type=int, default=2048, help="rows per sent chunk")
    parser.add_argument("--calls", type=int, default=7, help="timelines per setting")
    parser.add_argument("--examples", type=int, default=60_000, help="rows of the source")
    args = parser.parse_args(argv)

    import cupy as cp  # noqa: PLC0415 - the benchmark needs a GPU

    device = device_name(cp)
    X, y, _ = load_data(args, args.examples)
    send_parts(cp, X, args.send_rows, device)
    timelines_by_staging(cp, X, y, args.rows, args.calls, device)
    registered_sends(cp, X, args.send_rows, device)  # last: the driver may refuse it


if __name__ == "__main__":
    main()
