"""Sustained learn load through a Redis restart: nothing acknowledged is lost or learned twice.

Starts its own ``redis-server`` (AOF on, ``appendfsync everysec``) and a real server process
(``python -m service``) whose snapshots and write-ahead log go to that Redis. Several client
threads post learn requests (1-5 random rows, each with its own Idempotency-Key) to one small
model for ``--seconds`` seconds, retrying a request with the same key on any connection error
or 5xx until it is acknowledged. Half-way through, Redis is stopped (SHUTDOWN, which flushes
its AOF; ``--kill-redis`` sends SIGKILL instead) and started again ``--redis-down-s`` seconds
later on the same port and directory. Meanwhile learn requests cannot be logged, so they are
refused (503) and retried. With ``--hang-redis`` Redis is stopped with SIGSTOP instead (it keeps
its connections and answers nothing) and resumed with SIGCONT: learns are refused after
``GLN_WAL_TIMEOUT_S``, and a second, idle model is predicted every 50 ms throughout, whose
slowest answers while Redis hangs are reported (``predict_*_ms_while_hung``); ``--busy-models
N`` keeps N more models learning (a thread each, unchecked), so that more models wait on the
log than the server has model threads.

With ``--lose-primary`` Redis runs as a primary and a replica and the server with
``GLN_WAL_REPLICAS=1``; half-way through, the primary is SIGKILLed (its machine is lost), the
replica promoted (``REPLICAOF NO ONE``) and the server restarted on it, as an operator would.
With ``--sentinel`` there are two replicas and a Redis Sentinel, the server finds the primary
through it (``GLN_REDIS_URL=redis+sentinel://...``, ``GLN_WAL_REPLICAS=1``), and half-way
through the primary is SIGKILLed and nothing else is done: the Sentinel promotes a replica, the
other follows it, and the same server process learns on. ``--failover-again`` then has the
Sentinel fail over once more (``SENTINEL FAILOVER``) as soon as learning is acknowledged again:
to the other replica, while the new primary still takes writes, so that entries only it holds
are lost (the server must rebuild its model from the snapshot and the log). ``--sentinels 3``
runs three Sentinels (quorum 2, down after 1 s) and names them all in the URL;
``--pause-primary S`` SIGSTOPs the primary for S seconds and resumes it instead of killing it
(the Sentinels promote a replica meanwhile, and the old primary comes back still a primary);
``--min-replicas`` runs every server with ``min-replicas-to-write 1``. ``learning_outage_s``
is the longest time without an acknowledgement from the fault on.

With ``--nats pause`` or ``--nats kill`` the log is in NATS JetStream instead: a three-node
cluster, streams of three replicas (``GLN_WAL_URL``), snapshots in a directory. Half-way through,
the node leading the log's stream is stopped with SIGSTOP until the two others have elected a
leader (``--redis-down-s`` at least) and then resumed, or SIGKILLed and started again once
learning is acknowledged again. ``log_outage_s`` is the time from the fault until a request
sent after it was acknowledged.

At the end every acknowledged request's sequence must tile the model's stream exactly
(``examples_lost`` and ``examples_duplicated`` both 0), and the model's snapshot must equal,
byte for byte, a fresh model that learned the acknowledged rows in that order. Prints one
JSON line.

    python benchmarks/fault_load.py                      # 60 s, Redis down for ~2 s
    python benchmarks/fault_load.py --seconds 20 --redis-down-s 3
    python benchmarks/fault_load.py --seconds 20 --redis-down-s 4 --hang-redis --busy-models 6
    python benchmarks/fault_load.py --seconds 30 --lose-primary
    python benchmarks/fault_load.py --seconds 30 --sentinel
    python benchmarks/fault_load.py --seconds 30 --sentinel --failover-again
    python benchmarks/fault_load.py --seconds 20 --nats pause
    python benchmarks/fault_load.py --seconds 20 --nats kill
    python benchmarks/fault_load.py --seconds 20 --sentinel --sentinels 3 --min-replicas
    python benchmarks/fault_load.py --seconds 20 --sentinel --sentinels 3 --min-replicas \
        --pause-primary 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import redis
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gln import GLN  # noqa: E402
from service.storage.store import DirectorySnapshotStore, RedisSnapshotStore  # noqa: E402
from tests.service.durable_client import (  # noqa: E402
    DurableLearners,
    ServerProcess,
    check_exactly_once,
    reference_bytes,
)
from tests.support.nats_process import NatsCluster, nats_cluster  # noqa: E402
from tests.support.redis_process import (  # noqa: E402
    MIN_REPLICAS,
    RedisProcess,
    SentinelProcess,
    primary_and_replica,
    primary_and_replicas,
    sentinels_for,
    sentinels_url,
)

CONFIG = {"num_features": 6, "num_classes": 3, "layer_sizes": [8, 8, 1], "context_dim": 3,
          "learning_rate": 0.05, "seed": 7}
PREFIX = "fault-load"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the load")
    parser.add_argument("--redis-down-s", type=float, default=2.0,
                        help="how long Redis stays down, half-way through (--nats pause: the "
                        "least the NATS leader stays paused)")
    parser.add_argument("--kill-redis", action="store_true",
                        help="SIGKILL Redis instead of SHUTDOWN (then up to ~1 s of log "
                        "entries may be lost by Redis; the server's model keeps them)")
    parser.add_argument("--hang-redis", action="store_true",
                        help="SIGSTOP Redis for --redis-down-s instead of restarting it, and "
                        "time predictions of an idle model meanwhile")
    parser.add_argument("--busy-models", type=int, default=0,
                        help="more models kept learning, a thread each (not checked)")
    parser.add_argument("--lose-primary", action="store_true",
                        help="a primary and a replica, GLN_WAL_REPLICAS=1; half-way through the "
                        "primary is killed and the server restarted on the promoted replica")
    parser.add_argument("--sentinel", action="store_true",
                        help="a primary, two replicas and a Sentinel that the server asks for "
                        "the primary, GLN_WAL_REPLICAS=1; half-way through the primary is "
                        "killed, and the Sentinel fails over while the server runs on")
    parser.add_argument("--failover-again", action="store_true",
                        help="with --sentinel: once learning is acknowledged again, a second "
                        "failover (SENTINEL FAILOVER) to the other replica")
    parser.add_argument("--nats", choices=["pause", "kill"],
                        help="the log in a 3-node NATS JetStream cluster (R3), whose stream "
                        "leader is paused (SIGSTOP until another leads) or killed half-way")
    parser.add_argument("--sentinels", type=int, default=1,
                        help="with --sentinel: how many Sentinels (quorum: a majority)")
    parser.add_argument("--pause-primary", type=float, default=None, metavar="S",
                        help="with --sentinel: SIGSTOP the primary for S s, then SIGCONT, "
                        "instead of SIGKILL")
    parser.add_argument("--min-replicas", action="store_true",
                        help="every Redis server with min-replicas-to-write 1, "
                        "min-replicas-max-lag 10")
    parser.add_argument("--threads", type=int, default=4, help="client threads")
    parser.add_argument("--snapshot-interval-s", type=float, default=5.0,
                        help="GLN_SNAPSHOT_INTERVAL_S of the server (snapshot, then log trim)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="gln-fault-") as tmp, contextlib.ExitStack() as stack:
        replica = sentinel = cluster = None
        url = None
        extra = MIN_REPLICAS if args.min_replicas else ()
        if args.nats:
            cluster = stack.enter_context(nats_cluster(Path(tmp) / "nats"))
            server = ServerProcess({
                "GLN_WAL_URL": cluster.url,
                "GLN_SNAPSHOT_DIR": str(Path(tmp) / "snapshots"),
                "GLN_SNAPSHOT_INTERVAL_S": str(args.snapshot_interval_s),
            }, Path(tmp) / "server.log")
            with server:
                try:
                    result = run_nats(args, server, cluster)
                except BaseException:
                    print(server.log_text()[-5000:], file=sys.stderr)
                    raise
            print(json.dumps(result))
            ok = result["examples_lost"] == 0 and result["examples_duplicated"] == 0 and (
                result["model_equals_reference"])
            return 0 if ok else 1
        if args.sentinel:
            redis_server, _ = stack.enter_context(
                primary_and_replicas(Path(tmp) / "redis", 2, extra))
            if args.sentinels > 1:
                group = stack.enter_context(sentinels_for(
                    Path(tmp) / "sentinels", redis_server, count=args.sentinels,
                    quorum=args.sentinels // 2 + 1))
                sentinel, url = group[0], sentinels_url(group)
            else:
                sentinel = stack.enter_context(
                    SentinelProcess(Path(tmp) / "sentinel", redis_server).start(replicas=2))
                url = sentinel.url
        elif args.lose_primary:
            redis_server, replica = stack.enter_context(primary_and_replica(Path(tmp) / "redis"))
        else:
            redis_server = stack.enter_context(RedisProcess(Path(tmp) / "redis"))
        server = ServerProcess({
            "GLN_REDIS_URL": url or redis_server.url,
            "GLN_REDIS_KEY_PREFIX": PREFIX,
            "GLN_SNAPSHOT_DIR": str(Path(tmp) / "unused"),
            "GLN_SNAPSHOT_INTERVAL_S": str(args.snapshot_interval_s),
            "GLN_WAL_REPLICAS": "1" if replica or sentinel else "0",
        }, Path(tmp) / "server.log")
        with server:
            try:
                result = run(args, server, redis_server, replica, sentinel, url)
            except BaseException:
                print(server.log_text()[-5000:], file=sys.stderr)
                raise
            ok = result["examples_lost"] == 0 and result["examples_duplicated"] == 0 and (
                result["model_equals_reference"])
            if not ok:
                print(server.log_text()[-20000:], file=sys.stderr)
    print(json.dumps(result))
    return 0 if ok else 1


def run(
    args: argparse.Namespace, server: ServerProcess, redis_server: RedisProcess,
    replica: RedisProcess | None, sentinel: SentinelProcess | None, url: str | None,
) -> dict:
    server.start()
    busy = [f"busy{i}" for i in range(args.busy_models)]
    for name in ("m", "idle", *busy):
        r = httpx.post(f"{server.url}/v1/models", json={"name": name, "config": CONFIG})
        r.raise_for_status()
    predictions = IdlePredictions(server.url, "idle", CONFIG["num_features"], busy)
    bar = tqdm(total=round(args.seconds), unit="s", desc="fault_load", file=sys.stderr)
    acked_at: list[float] = []
    learners = DurableLearners(server.url, "m", CONFIG["num_features"], CONFIG["num_classes"],
                               threads=args.threads, seed=args.seed,
                               on_ack=lambda _: acked_at.append(time.perf_counter()))
    down_at = args.seconds / 2 - args.redis_down_s / 2
    redis_down_s = failover_s = None
    t0 = time.perf_counter()
    learners.start()
    predictions.start()
    hung: tuple[float, float] | None = None
    fault_at = None
    try:
        while (elapsed := time.perf_counter() - t0) < args.seconds:
            if redis_down_s is None and elapsed >= down_at:
                fault_at = time.perf_counter()
                if sentinel is not None:
                    failover_s, redis_down_s = fail_over_by_sentinel(
                        redis_server, sentinel, learners, args.failover_again,
                        args.pause_primary)
                elif replica is not None:
                    redis_down_s = fail_over(redis_server, replica, server)
                    redis_server = replica
                elif args.hang_redis:
                    hung_from = time.perf_counter()
                    redis_down_s = hang_redis(redis_server, args.redis_down_s)
                    hung = (hung_from, time.perf_counter())
                else:
                    redis_down_s = restart_redis(redis_server, args.redis_down_s,
                                                 args.kill_redis)
            bar.n = min(round(elapsed), bar.total)
            bar.set_postfix(acks=len(learners.acks), errors=sum(learners.errors.values()),
                            refresh=True)
            time.sleep(0.25)
    finally:
        learners.stop(timeout_s=120)
        predictions.stop()
        bar.close()
    load_s = time.perf_counter() - t0
    if learners.failures:
        raise RuntimeError(f"a learner failed: {learners.failures}")

    examples_seen = httpx.get(f"{server.url}/v1/models/m").json()["examples_seen"]
    httpx.post(f"{server.url}/v1/models/m/snapshot", timeout=60).raise_for_status()
    with RedisSnapshotStore(url or redis_server.url, key_prefix=PREFIX) as store:
        blob, _ = store.load("m")
    named = f"redis://127.0.0.1:{sentinel.primary_port()}/0" if sentinel else redis_server.url
    info_client = redis.Redis.from_url(named)
    version = info_client.info("server")["redis_version"]
    info_client.close()
    server.terminate()
    check = check_exactly_once(learners.acks, examples_seen)
    same = None
    if check.unexplained == 0:
        same = GLN.from_bytes(blob).to_bytes() == reference_bytes(CONFIG, check.order)
    return {
        "benchmark": "fault_load",
        "seconds": round(load_s, 2),
        "threads": args.threads,
        "redis": f"{version}, appendonly yes, appendfsync everysec",
        "redis_restart": (
            f"primary paused {args.pause_primary} s, Sentinel failover"
            if sentinel and args.pause_primary else
            "primary lost, Sentinel failover" if sentinel else
            "primary lost, replica promoted" if replica else
            "SIGSTOP, then SIGCONT" if args.hang_redis else
            "SIGKILL" if args.kill_redis else "SHUTDOWN"),
        **predictions.summary(hung),
        "redis_down_s": None if redis_down_s is None else round(redis_down_s, 2),
        "sentinel_failover_s": None if failover_s is None else round(failover_s, 2),
        "sentinels": args.sentinels if sentinel else None,
        "min_replicas_to_write": 1 if args.min_replicas else 0,
        "learning_outage_s": _longest_gap(fault_at, acked_at),
        "snapshot_interval_s": args.snapshot_interval_s,
        "duplicate_answers_without_sequence": check.placed + check.unexplained,
        **_load_outcome(learners, check, load_s, examples_seen, same),
    }


def _load_outcome(learners: DurableLearners, check: Any, load_s: float, examples_seen: int,
                  same: bool) -> dict[str, Any]:
    """What every fault's row says of the load: requests, errors, and whether each
    acknowledged example was learned exactly once (``check``: ``check_exactly_once``'s)."""
    return {
        "requests_acknowledged": len(learners.acks),
        "requests_per_s": round(len(learners.acks) / load_s, 1),
        "requests_retried": sum(ack.attempts > 1 for ack in learners.acks),
        "duplicate_answers": sum(ack.duplicate for ack in learners.acks),
        "errors_returned": dict(sorted(learners.errors.items())),
        "examples_acknowledged": check.examples,
        "examples_seen": examples_seen,
        "examples_lost": check.lost,
        "examples_duplicated": check.duplicated,
        "unexplained": check.unexplained,
        "requests_abandoned": len(learners.abandoned),
        "model_equals_reference": same,
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cpus",
    }


NATS_STREAM = "gln-wal"  # the log's stream under the default prefix


def run_nats(args: argparse.Namespace, server: ServerProcess, cluster: NatsCluster) -> dict:
    """The load of :func:`run` on a log in NATS, its stream's leader paused or killed
    half-way; the figures, checked as :func:`run` checks them."""
    server.start()
    httpx.post(f"{server.url}/v1/models", json={"name": "m", "config": CONFIG}).raise_for_status()
    learners = DurableLearners(server.url, "m", CONFIG["num_features"], CONFIG["num_classes"],
                               threads=args.threads, seed=args.seed)
    t0 = time.perf_counter()
    learners.start()
    outage_s = None
    try:
        time.sleep(args.seconds / 2)
        leader = cluster.leader_of(NATS_STREAM)
        in_flight = len(learners.acks) + learners.threads
        struck = time.perf_counter()
        if args.nats == "pause":
            leader.pause()
            time.sleep(args.redis_down_s)
            cluster.leader_of(NATS_STREAM, other_than=leader.name)
            leader.resume()
        else:
            leader.kill()
        _wait_for_acks(learners, in_flight)
        outage_s = time.perf_counter() - struck
        if args.nats == "kill":
            leader.start()
        time.sleep(max(0.0, args.seconds - (time.perf_counter() - t0)))
    finally:
        learners.stop(timeout_s=120)
    load_s = time.perf_counter() - t0
    if learners.failures:
        raise RuntimeError(f"a learner failed: {learners.failures}")
    examples_seen = httpx.get(f"{server.url}/v1/models/m").json()["examples_seen"]
    httpx.post(f"{server.url}/v1/models/m/snapshot", timeout=60).raise_for_status()
    server.terminate()
    blob, _ = DirectorySnapshotStore(server.env["GLN_SNAPSHOT_DIR"]).load("m")
    check = check_exactly_once(learners.acks, examples_seen)
    same = None
    if check.unexplained == 0:
        same = GLN.from_bytes(blob).to_bytes() == reference_bytes(CONFIG, check.order)
    return {
        "benchmark": "fault_load",
        "seconds": round(load_s, 2),
        "threads": args.threads,
        "log": "NATS JetStream, 3 nodes, stream replicas 3",
        "fault": ("stream leader SIGSTOP until another leads, then SIGCONT"
                  if args.nats == "pause" else "stream leader SIGKILL, then started again"),
        "log_outage_s": None if outage_s is None else round(outage_s, 2),
        "snapshot_interval_s": args.snapshot_interval_s,
        **_load_outcome(learners, check, load_s, examples_seen, same),
    }


def fail_over(primary: RedisProcess, replica: RedisProcess, server: ServerProcess) -> float:
    """The primary's machine is lost: SIGKILL it, promote the replica, restart the server on
    it (with no replica to wait for now); seconds from the loss to the server's readiness."""
    t0 = time.perf_counter()
    primary.kill()
    promote = redis.Redis.from_url(replica.url)
    promote.replicaof("NO", "ONE")
    promote.close()
    server.kill()
    server.env.update(GLN_REDIS_URL=replica.url, GLN_WAL_REPLICAS="0")
    server.start()
    return time.perf_counter() - t0


def _longest_gap(since: float | None, times: list[float]) -> float | None:
    """The longest time without an acknowledgement from ``since`` on, in seconds."""
    if since is None:
        return None
    points = [since, *sorted(t for t in list(times) if t >= since)]
    gaps = [later - earlier for earlier, later in zip(points, points[1:], strict=False)]
    return round(max(gaps), 2) if gaps else None


def fail_over_by_sentinel(
    primary: RedisProcess, sentinel: SentinelProcess, learners: DurableLearners, again: bool,
    pause_s: float | None = None,
) -> tuple[float, float]:
    """The primary's machine is lost: SIGKILL it and do nothing else (``pause_s``: SIGSTOP it
    that long, then SIGCONT; ``again``: then, once learning is acknowledged again, a second
    failover). Seconds until the Sentinel named a new primary, and until the server
    acknowledged learning again after the last failover."""
    t0 = time.perf_counter()
    in_flight = len(learners.acks) + learners.threads
    if pause_s:
        primary.pause()
        time.sleep(pause_s)
        primary.resume()
    else:
        primary.kill()
    sentinel.wait_for_failover(primary.port)
    failover_s = time.perf_counter() - t0
    _wait_for_acks(learners, in_flight)
    if again:
        in_flight = len(learners.acks) + learners.threads
        sentinel.fail_over()
        _wait_for_acks(learners, in_flight)
    return failover_s, time.perf_counter() - t0


def _wait_for_acks(learners: DurableLearners, more_than: int, timeout_s: float = 120.0) -> None:
    """Return once more than ``more_than`` learn requests are acknowledged: one counted as
    in flight at a fault could have been answered before it."""
    deadline = time.perf_counter() + timeout_s
    while len(learners.acks) <= more_than:
        if time.perf_counter() > deadline:
            raise TimeoutError(f"no learn request acknowledged within {timeout_s} s")
        time.sleep(0.01)


class IdlePredictions:
    """A thread predicting one row of model ``name`` every 50 ms (when each was sent, how long
    its answer took, its status), and a thread learning each of the ``busy`` models."""

    def __init__(self, url: str, name: str, num_features: int, busy: list[str]) -> None:
        self.url, self.name = url, name
        self.body = {"features": [[0.0] * num_features]}
        self.samples: list[tuple[float, float, int]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True)] + [
            threading.Thread(target=self._learn, args=(model,), daemon=True) for model in busy]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def _learn(self, model: str) -> None:
        body = {**self.body, "labels": [1]}
        with httpx.Client(base_url=self.url, timeout=120) as client:
            while not self._stop.is_set():
                with contextlib.suppress(httpx.TransportError):
                    client.post(f"/v1/models/{model}/learn", json=body)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=120) as client:
            while not self._stop.wait(0.05):
                sent = time.perf_counter()
                try:
                    status = client.post(f"/v1/models/{self.name}/predict",
                                         json=self.body).status_code
                except httpx.TransportError:
                    status = 0
                self.samples.append((sent, time.perf_counter() - sent, status))

    def summary(self, hung: tuple[float, float] | None) -> dict:
        """The predictions sent while Redis hung (all of them without a hang): how many, how
        many failed, their slowest and 99th-percentile answer in ms."""
        chosen = [s for s in self.samples if hung is None or hung[0] <= s[0] <= hung[1]]
        seconds = sorted(s[1] for s in chosen)
        suffix = "_while_hung" if hung is not None else ""
        return {
            f"predictions{suffix}": len(chosen),
            f"predictions_failed{suffix}": sum(s[2] != 200 for s in chosen),
            f"predict_p99_ms{suffix}": round(1e3 * seconds[int(0.99 * (len(seconds) - 1))], 1)
            if seconds else None,
            f"predict_max_ms{suffix}": round(1e3 * seconds[-1], 1) if seconds else None,
        }


def hang_redis(redis_server: RedisProcess, down_s: float) -> float:
    """SIGSTOP Redis (connected, answering nothing) for ``down_s``, then SIGCONT; seconds."""
    t0 = time.perf_counter()
    redis_server.pause()
    time.sleep(down_s)
    redis_server.resume()
    return time.perf_counter() - t0


def restart_redis(redis_server: RedisProcess, down_s: float, kill: bool) -> float:
    """Stop Redis (clean or SIGKILL), wait ``down_s``, start it again; seconds it was down."""
    t0 = time.perf_counter()
    if kill:
        redis_server.kill()
    else:
        redis_server.stop()
    time.sleep(max(0.0, down_s - (time.perf_counter() - t0)))
    redis_server.start()
    return time.perf_counter() - t0


if __name__ == "__main__":
    sys.exit(main())
