"""A real server process and a client that insists on exactly-once learning.

Shared by tests/service/test_crash_recovery.py and benchmarks/fault_load.py (and
benchmarks/recovery_time.py):

* :class:`ServerProcess` runs ``python -m service`` on a free (or given) port with ``GLN_*``
  variables, logs to a file, waits for ``/readyz`` 200, and can be SIGKILLed or SIGTERMed.
* :class:`DurableLearners` posts learn requests (1-5 random rows each, seeded) to one model
  from several threads. Every request has its own ``Idempotency-Key``; on a connection error
  or a 5xx the *same* request is sent again with the *same* key until it is acknowledged
  (200), so a client never gives up on an example. Every acknowledgement is recorded.
* :func:`check_exactly_once` checks that the acknowledged requests' sequences tile
  ``0 .. examples_seen - 1`` exactly, and :func:`reference_bytes` learns the acknowledged rows
  in that order on a fresh model: the bytes a server that lost and repeated nothing must hold.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import httpx
import numpy as np

from gln import GLN
from tests.support.redis_process import free_port

REPO = Path(__file__).resolve().parents[2]


# -- the server -----------------------------------------------------------------------------------
class ServerProcess:
    """``python -m service`` in a subprocess; ``start()`` returns once ``/readyz`` answers 200.

    ``env`` holds ``GLN_*`` settings (the parent's own ``GLN_*`` variables are dropped);
    ``GLN_HOST``/``GLN_PORT`` are set here. The port is kept by every ``start()``, so clients
    holding :attr:`url` reach the restarted server. stdout and stderr are appended to
    ``log_path``. After ``start()``, ``listening_s`` and ``ready_s`` are the seconds from
    process start to the first HTTP answer and to the first ``/readyz`` 200.
    """

    def __init__(
        self, env: Mapping[str, str], log_path: str | os.PathLike[str], port: int | None = None
    ) -> None:
        self.port = port or free_port()
        self.log_path = Path(log_path)
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("GLN_")},
            "GLN_HOST": "127.0.0.1",
            "GLN_LOG_LEVEL": "info",
            **env,
            "GLN_PORT": str(self.port),
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.listening_s: float | None = None
        self.ready_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, ready_timeout_s: float = 60.0) -> Self:
        """Start the process; wait (polling every 10 ms) for ``/readyz`` 200."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("the server is already running")
        self.listening_s = self.ready_s = None
        with open(self.log_path, "ab") as log:
            t0 = time.perf_counter()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "service"], cwd=REPO, env=self.env,
                stdout=log, stderr=subprocess.STDOUT,
            )
        with httpx.Client(base_url=self.url, timeout=5) as client:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"server exited with {self.proc.returncode}:\n{self.log_text()[-3000:]}"
                    )
                try:
                    status = client.get("/readyz").status_code
                except httpx.TransportError:
                    status = None
                elapsed = time.perf_counter() - t0
                if status is not None and self.listening_s is None:
                    self.listening_s = elapsed
                if status == 200:
                    self.ready_s = elapsed
                    return self
                if elapsed > ready_timeout_s:
                    self.kill()
                    raise TimeoutError(
                        f"/readyz not 200 within {ready_timeout_s} s (last {status}):\n"
                        f"{self.log_text()[-3000:]}"
                    )
                time.sleep(0.01)

    def kill(self) -> None:
        """SIGKILL (a crash: no shutdown snapshot, nothing flushed), and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def terminate(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM (graceful: drain, snapshot), wait; the exit status (SIGKILL if stuck)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def start_server(
    env: Mapping[str, str], log_path: str | os.PathLike[str], *, port: int | None = None,
    ready_timeout_s: float = 60.0,
) -> ServerProcess:
    """A started :class:`ServerProcess` (``/readyz`` already 200)."""
    return ServerProcess(env, log_path, port).start(ready_timeout_s)


def learn_on_a_new_model(server: ServerProcess, config: Mapping[str, Any], *, seed: int,
                         threads: int = 4) -> DurableLearners:
    """Create model "m" of ``config`` on the started ``server`` and start ``threads`` keyed
    learners on it (:class:`DurableLearners`, stopped by the caller)."""
    r = httpx.post(f"{server.url}/v1/models", json={"name": "m", "config": dict(config)})
    assert r.status_code == 201, r.text
    return DurableLearners(server.url, "m", config["num_features"], config["num_classes"],
                           threads=threads, seed=seed).start()


# -- the client -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ack:
    """One acknowledged learn request: what was sent and what the 200 answer said."""

    key: str
    rows: np.ndarray  # (n, num_features) float64, exactly as sent (JSON floats round-trip)
    labels: np.ndarray  # (n,) int64
    sequence: int | None  # None: a duplicate whose original answer the server no longer had
    duplicate: bool
    attempts: int  # 1 when the first try was acknowledged
    placed: bool = False  # sequence inferred by check_exactly_once (not from the server)


class DurableLearners:
    """``threads`` threads posting learn requests to ``url``'s model ``name`` until stopped.

    Each thread has its own ``httpx.Client`` and its own seeded generator; each request has
    1-``max_rows`` random rows and a unique ``Idempotency-Key``. A request is sent again, with
    the same body and key, after a connection error or a 5xx (``retry_s`` apart) until it is
    acknowledged; a 4xx is a bug and stops the thread (``failures``). ``stop()`` lets every
    thread finish the request it holds (``give_up_s`` at most, else it lands in
    ``abandoned``) and start no other. ``pause()`` holds every thread before its next send.

    ``errors`` counts every unsuccessful try: by status (``"503"``) or exception type
    (``"ConnectError"``). ``on_ack(ack)`` is called from the threads after each ack.
    """

    def __init__(
        self,
        url: str,
        name: str,
        num_features: int,
        num_classes: int,
        *,
        threads: int = 4,
        seed: int = 0,
        max_rows: int = 5,
        timeout_s: float = 30.0,
        retry_s: float = 0.02,
        give_up_s: float = 60.0,
        on_ack: Callable[[Ack], None] | None = None,
    ) -> None:
        self.url, self.name = url, name
        self.num_features, self.num_classes = num_features, num_classes
        self.threads, self.seed, self.max_rows = threads, seed, max_rows
        self.timeout_s, self.retry_s, self.give_up_s = timeout_s, retry_s, give_up_s
        self.on_ack = on_ack
        self.run_id = uuid.uuid4().hex[:12]  # keys never collide with another run's
        self.acks: list[Ack] = []
        self.errors: Counter[str] = Counter()
        self.failures: list[str] = []
        self.abandoned: list[str] = []  # keys never acknowledged before give_up_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._go = threading.Event()
        self._go.set()
        self._parked = 0  # threads waiting in pause, or finished
        self._parked_changed = threading.Condition(self._lock)
        self._threads: list[threading.Thread] = []

    # -- control --
    def start(self) -> Self:
        for index in range(self.threads):
            thread = threading.Thread(target=self._thread, args=(index,), daemon=True,
                                      name=f"learner-{index}")
            thread.start()
            self._threads.append(thread)
        return self

    def pause(self, timeout_s: float = 30.0) -> None:
        """Hold every thread before its next try; returns once none is sending."""
        self._go.clear()
        with self._parked_changed:
            if not self._parked_changed.wait_for(
                lambda: self._parked == self.threads, timeout=timeout_s
            ):
                raise TimeoutError("learners did not pause")

    def resume(self) -> None:
        self._go.set()

    def stop(self, timeout_s: float | None = None) -> None:
        """Start no new request; finish (retry) the ones held; join the threads."""
        self._stop.set()
        self._go.set()
        for thread in self._threads:
            thread.join(timeout_s)

    def wait_for_acks(self, count: int, timeout_s: float) -> None:
        """Block until ``count`` requests are acknowledged (TimeoutError after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while len(self.acks) < count:
            if self.failures:
                raise RuntimeError(f"learner failed: {self.failures[0]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.acks)} of {count} acks after {timeout_s} s")
            time.sleep(0.01)

    # -- the threads --
    def _park(self, delta: int) -> None:
        with self._parked_changed:
            self._parked += delta
            self._parked_changed.notify_all()

    def _thread(self, index: int) -> None:
        rng = np.random.default_rng([self.seed, index])
        try:
            with httpx.Client(base_url=self.url, timeout=self.timeout_s) as client:
                for i in itertools.count():
                    if self._stop.is_set():
                        return
                    n = int(rng.integers(1, self.max_rows + 1))
                    rows = rng.normal(size=(n, self.num_features))
                    labels = rng.integers(0, self.num_classes, size=n)
                    key = f"{self.run_id}-{index}-{i}"
                    ack = self._until_acknowledged(client, key, rows, labels)
                    if ack is None:
                        with self._lock:
                            self.abandoned.append(key)
                        return
                    with self._lock:
                        self.acks.append(ack)
                    if self.on_ack is not None:
                        self.on_ack(ack)
        except Exception as exc:  # a 4xx, or a bug here: never hang the caller
            with self._lock:
                self.failures.append(f"{type(exc).__name__}: {exc}")
        finally:
            self._park(+1)

    def _until_acknowledged(
        self, client: httpx.Client, key: str, rows: np.ndarray, labels: np.ndarray
    ) -> Ack | None:
        body = json.dumps({"features": rows.tolist(), "labels": labels.tolist()}).encode()
        headers = {"content-type": "application/json", "idempotency-key": key}
        path = f"/v1/models/{self.name}/learn"
        give_up_at = None
        for attempt in itertools.count(1):
            if not self._go.is_set():
                self._park(+1)
                self._go.wait()
                self._park(-1)
            if self._stop.is_set():
                give_up_at = give_up_at or time.monotonic() + self.give_up_s
                if time.monotonic() > give_up_at:
                    return None
            try:
                response = client.post(path, content=body, headers=headers)
            except httpx.TransportError as exc:
                what = type(exc).__name__
            else:
                if response.status_code == 200:
                    answer = response.json()
                    if answer["examples"] != len(labels):
                        raise AssertionError(f"{key}: {answer['examples']} examples acknowledged")
                    return Ack(key, rows, labels.astype(np.int64), answer["sequence"],
                               bool(answer["duplicate"]), attempt)
                what = str(response.status_code)
                if response.status_code < 500:
                    raise RuntimeError(f"{key}: learn answered {what}: {response.text[:300]}")
            with self._lock:
                self.errors[what] += 1
            time.sleep(self.retry_s)
        raise AssertionError("unreachable")


# -- the checks -----------------------------------------------------------------------------------
@dataclass
class ExactlyOnce:
    """What :func:`check_exactly_once` found. ``ok`` when nothing was lost or duplicated.

    ``lost``: acknowledged examples the model does not hold as their own: they overlap
    another acknowledged request's sequences, or lie past ``examples_seen``.
    ``duplicated``: examples the model learned that no acknowledged request accounts for:
    a retry learned a second time (or a request learned that was never acknowledged).
    ``unexplained``: duplicate answers without a sequence that could not be placed.
    ``order``: the acknowledged requests in stream order (placed ones have ``placed``).
    """

    requests: int
    examples: int
    examples_seen: int
    lost: int
    duplicated: int
    unexplained: int
    placed: int
    order: list[Ack]

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and self.unexplained == 0

    def summary(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "order"}


def check_exactly_once(acks: list[Ack], examples_seen: int) -> ExactlyOnce:
    """Do the acknowledged requests' sequences partition ``0 .. examples_seen - 1`` exactly?

    A duplicate answered without a sequence (its original answer was no longer in the
    server's memory, e.g. its entry was trimmed by a snapshot before the crash) is placed
    into the stretches no other request covers, when its row count fits only one way; else
    it counts as ``unexplained``.
    """
    cover = np.zeros(examples_seen, dtype=np.int64)
    lost = 0
    known = [a for a in acks if a.sequence is not None]
    unknown = [a for a in acks if a.sequence is None]
    for ack in known:
        start, end = ack.sequence, ack.sequence + len(ack.labels)
        lost += max(0, end - max(start, examples_seen))  # past what the model holds
        cover[start:min(end, examples_seen)] += 1
    lost += int(np.maximum(cover - 1, 0).sum())
    placed = _place(unknown, _uncovered_runs(cover)) if unknown else {}
    order = known + [dataclasses.replace(a, sequence=placed[a.key], placed=True)
                     for a in unknown if a.key in placed]
    for ack in order[len(known):]:
        cover[ack.sequence:ack.sequence + len(ack.labels)] += 1
    order.sort(key=lambda a: a.sequence)
    return ExactlyOnce(
        requests=len(acks), examples=sum(len(a.labels) for a in acks),
        examples_seen=examples_seen, lost=lost, duplicated=int((cover == 0).sum()),
        unexplained=len(unknown) - len(placed), placed=len(placed), order=order,
    )


def _uncovered_runs(cover: np.ndarray) -> list[tuple[int, int]]:
    """(start, length) of every maximal run of zeros in ``cover``."""
    zero = np.concatenate([[False], cover == 0, [False]])
    edges = np.flatnonzero(np.diff(zero.astype(np.int8)))
    return [(int(s), int(e - s)) for s, e in zip(edges[::2], edges[1::2], strict=True)]


def _place(unknown: list[Ack], runs: list[tuple[int, int]]) -> dict[str, int]:
    """key -> sequence, if the requests tile the uncovered runs in exactly one way; else {}."""
    if not runs or len(unknown) > 7:
        return {}
    tilings = set()
    for perm in itertools.permutations(unknown):
        it, tiling = iter(perm), []
        for start, length in runs:
            pos = start
            while pos < start + length:
                ack = next(it, None)
                if ack is None:
                    break
                tiling.append((ack.key, pos))
                pos += len(ack.labels)
            if pos != start + length:
                break
        else:
            if next(it, None) is None:
                tilings.add(tuple(sorted(tiling)))
    return dict(tilings.pop()) if len(tilings) == 1 else {}


def reference_bytes(config: dict[str, Any], acks: list[Ack]) -> bytes:
    """``GLN(**config)`` after learning the acknowledged rows in sequence order: its bytes."""
    order = sorted(acks, key=lambda a: a.sequence)  # TypeError if a sequence is None
    model = GLN(**config)
    if order:
        model.learn(np.concatenate([a.rows for a in order]),
                    np.concatenate([a.labels for a in order]))
    return model.to_bytes()
