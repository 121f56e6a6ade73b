"""What one small request costs the server, in process: single-row learn and predict through
the whole ASGI app (middlewares, routing, parsing, the model's queue and worker thread, the
write-ahead log, metrics, the answer), one request at a time, with no sockets and no HTTP
client in the way.

Each request is a raw ASGI call carrying the headers a typical client sends, its answer
checked (200). The garbage collector is tuned as ``gln-service`` tunes it before it serves
(``service.__main__._tune_gc``). The model's own call (``GLN.learn`` / ``predict_proba`` on
one row) is timed alone too, so the rest is what the service adds. Besides each request's
wall-clock time, the process's CPU time per request (all its threads). Prints one JSON line.

    python benchmarks/request_cost.py                              # file log, fdatasync
    python benchmarks/request_cost.py --no-wal                     # GLN_WAL_ENABLED=false
    python benchmarks/request_cost.py --features 3 --layer-sizes 16,1 --requests 5000

``--breakdown`` splits a request into its cost centres: the same requests again with more and
more of their path answered at once by a stub (``LEVELS``; each level adds one to those before
it, in a fresh app), so that the difference between two levels is what the piece stubbed last
costs. ``--stub LEVEL`` serves every request so stubbed, for counting one level's instructions:
under ``valgrind --tool=callgrind``, the difference between two runs that differ only in
``--requests`` is what those extra requests cost.

    python benchmarks/request_cost.py --no-wal --breakdown --rounds 3
    python benchmarks/request_cost.py --verbs learn --stub queue --requests 300 --skip-model-call
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.responses import Response

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import service.api.routes  # noqa: E402
from gln import GLN  # noqa: E402
from service.__main__ import _tune_gc  # noqa: E402
from service.api.app import create_app  # noqa: E402
from service.api.schemas import LearnRequest, PredictRequest  # noqa: E402
from service.engine.learn_answers import LearnResult  # noqa: E402
from service.settings import Settings  # noqa: E402

DISTINCT_BODIES = 64  # requests cycle through this many pre-encoded bodies
NAME = "bench"
# What --stub answers at once, each level with every one before it, and what the difference
# from the level before it measures (the cost centre), in the order a request meets them
# from the inside out.
LEVELS = {
    "model": "the model's call (in the worker thread)",
    "queue": "the model's queue: hand-off to its worker thread and back, log, scoring, stats",
    "registry": "the registry: model lookup, rows checked against the model",
    "middleware": "middlewares (the service's, Starlette's and FastAPI's)",
    "routing": "routing",
    "parsing": "reading, parsing and validating the body",
    "answer": "encoding the answer",
    "app": "FastAPI's request handling and the endpoint's own steps",
}
HARNESS = "the harness's ASGI call (a bare app)"


async def call(app: Any, method: str, path: str, body: bytes = b"",
               headers: list[tuple[bytes, bytes]] | None = None) -> tuple[int, bytes]:
    """One HTTP request as a raw ASGI call: its status and body."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
        "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
        "root_path": "", "query_string": b"", "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "headers": [
            (b"host", b"127.0.0.1:8000"), (b"user-agent", b"python-httpx/0.28.1"),
            (b"accept", b"*/*"), (b"accept-encoding", b"gzip, deflate"),
            (b"connection", b"keep-alive"), (b"content-length", str(len(body)).encode()),
            (b"content-type", b"application/json"), *(headers or ()),
        ],
    }
    sent = False
    status = 0
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()  # a disconnect would come here; none does
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)


def bodies(config: dict[str, Any], verb: str, seed: int = 2) -> list[bytes]:
    """Single-row JSON bodies as a client encodes them, with labels for learn."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(DISTINCT_BODIES):
        body: dict[str, Any] = {"features": np.round(
            rng.normal(size=(1, config["num_features"])), 4).tolist()}
        if verb == "learn":
            body["labels"] = rng.integers(0, config["num_classes"], size=1).tolist()
        out.append(json.dumps(body).encode())
    return out


async def timed_requests(app: Any, verb: str, payloads: list[bytes], n: int) -> list[float]:
    """``n`` requests one after another; each one's time in seconds."""
    path = f"/v1/models/{NAME}/{verb}"
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        status, answer = await call(app, "POST", path, payloads[i % len(payloads)])
        times.append(time.perf_counter() - t0)
        if status != 200:
            raise RuntimeError(f"{verb} answered {status}: {answer[:200]!r}")
    return times


def model_call_times(config: dict[str, Any], verb: str, payloads: list[bytes],
                     n: int) -> list[float]:
    """The model's own call on the same single rows, without the service."""
    model = GLN(**config)
    rows = [json.loads(p) for p in payloads]
    xs = [np.asarray(r["features"], np.float32) for r in rows]
    ys = [np.asarray(r.get("labels", [0]), np.int64) for r in rows]
    times = []
    for i in range(n):
        X, y = xs[i % len(xs)], ys[i % len(ys)]
        t0 = time.perf_counter()
        if verb == "learn":
            model.learn(X, y)
        else:
            model.predict_proba(X)
        times.append(time.perf_counter() - t0)
    return times


@contextlib.contextmanager
def server_gc() -> Iterator[None]:
    """The garbage collector as ``gln-service`` sets it before it serves; as it was after."""
    threshold = gc.get_threshold()
    _tune_gc()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


@contextlib.contextmanager
def stubbed(app: Any, verb: str, level: str | None, classes: int, payload: bytes) -> Iterator[Any]:
    """The ASGI callable to send ``verb`` requests to, with the path stubbed up to ``level``
    (None: the whole app); module attributes it replaced are restored after."""
    chosen = [] if level is None else list(LEVELS)[:list(LEVELS).index(level) + 1]
    registry = app.state.engine.registry
    entry = registry._models[NAME]

    def probabilities(rows: int) -> np.ndarray:
        return np.full((rows, classes), 1.0 / classes)

    def answer(rows: int) -> Any:
        if verb == "predict":
            return probabilities(rows)
        return LearnResult(0, probabilities(rows), np.zeros(rows), rows)

    async def queue_answer(X: Any, *_: Any) -> Any:
        return answer(len(X))

    async def registry_answer(_name: str, features: Any, *_: Any) -> Any:
        return answer(len(features))

    target = app
    if "model" in chosen:  # the public verb, and the one for checked rows that the queue calls
        methods = (("learn", "_learn_checked") if verb == "learn"
                   else ("predict_proba", "_predict_proba_checked"))
        for method in methods:
            setattr(entry.model, method, lambda X, *_: probabilities(len(X)))
    if "queue" in chosen:
        setattr(entry, "learn" if verb == "learn" else "predict_proba", queue_answer)
    if "registry" in chosen:
        setattr(registry, verb, registry_answer)
    if "middleware" in chosen:  # Starlette's ExceptionMiddleware, the router inside it
        inner = app.middleware_stack
        while not isinstance(inner, ExceptionMiddleware):
            inner = inner.app
        target = _with_app(app, inner, {})
    if "routing" in chosen:
        route = next(r for r in service.api.routes.router.routes if r.path.endswith("/" + verb))
        target = _with_app(app, route.handle, {"path_params": {"name": NAME}})
    saved = {name: getattr(service.api.routes, name) for name in ("parse_body", "json_response")}
    if "parsing" in chosen:
        body = (LearnRequest if verb == "learn" else PredictRequest).model_validate_json(payload)

        async def parsed(request: Any, _model: Any) -> Any:
            await request.body()
            return body

        service.api.routes.parse_body = parsed
    if "answer" in chosen:
        async def prepared(_payload: Any) -> Response:
            return Response(b"{}", media_type="application/json")

        service.api.routes.json_response = prepared
    if "app" in chosen:
        target = _bare_app
    try:
        yield target
    finally:
        for name, value in saved.items():
            setattr(service.api.routes, name, value)


def _with_app(app: Any, inner: Any, extra: dict[str, Any]) -> Any:
    """``inner`` as an ASGI callable, given the scope keys the layers above it would set."""
    async def called(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await inner({**scope, "app": app, **extra}, receive, send)

    return called


async def _bare_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})


def summary_us(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "median_us": round(1e6 * ordered[len(ordered) // 2], 1),
        "mean_us": round(1e6 * sum(ordered) / len(ordered), 1),
        "p90_us": round(1e6 * ordered[int(0.9 * len(ordered))], 1),
    }


async def run(args: argparse.Namespace, config: dict[str, Any], directory: str,
              verbs: list[str], level: str | None) -> dict:
    """Time ``verbs`` on a fresh app with a fresh model, the path stubbed up to ``level``."""
    settings = Settings(
        snapshot_dir=tempfile.mkdtemp(dir=directory), snapshot_interval_s=3600,
        wal_enabled=not args.no_wal, log_level="warning", worker_threads=4,
    )
    app = create_app(settings)
    results: dict[str, Any] = {}
    async with app.router.lifespan_context(app):
        await app.state.engine.registry.wait_restored()
        status, answer = await call(app, "POST", "/v1/models", json.dumps(
            {"name": NAME, "config": config}).encode())
        if status != 201:
            raise RuntimeError(f"create answered {status}: {answer[:200]!r}")
        for verb in verbs:
            payloads = bodies(config, verb)
            await timed_requests(app, verb, payloads, args.warmup)
            with stubbed(app, verb, level, config["num_classes"], payloads[0]) as target:
                await timed_requests(target, verb, payloads, min(args.warmup, 50))
                cpu = time.process_time()  # every thread of the process: loop's, workers'
                results[verb] = summary_us(
                    await timed_requests(target, verb, payloads, args.requests))
                results[verb]["cpu_us"] = round(
                    1e6 * (time.process_time() - cpu) / args.requests, 1)
    return results


def breakdown(args: argparse.Namespace, config: dict[str, Any], directory: str) -> dict:
    """Each verb at every level (alternating their order over ``--rounds``), the median of
    the rounds' medians, and the cost centres: the differences between levels."""
    levels: list[str | None] = [None, *LEVELS]
    medians: dict[str, dict[str | None, list[float]]] = {
        verb: {level: [] for level in levels} for verb in args.verbs}
    for round_ in range(args.rounds):
        for level in levels if round_ % 2 == 0 else levels[::-1]:
            for verb, timing in asyncio.run(run(args, config, directory, args.verbs,
                                                level)).items():
                medians[verb][level].append(timing["median_us"])
    result = {}
    for verb, by_level in medians.items():
        us = {level: statistics.median(values) for level, values in by_level.items()}
        full = us[None]
        names = [*LEVELS.values(), HARNESS]
        parts = [us[a] - us[b] for a, b in itertools.pairwise(levels)] + [us[levels[-1]]]
        result[verb] = {
            "levels_us": {level or "none": round(value, 1) for level, value in us.items()},
            "centres": [{"where": name, "us": round(part, 1), "share": round(part / full, 3)}
                        for name, part in zip(names, parts, strict=True)],
        }
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features", type=int, default=20)
    parser.add_argument("--classes", type=int, default=2)
    parser.add_argument("--layer-sizes", default="32,32,1")
    parser.add_argument("--requests", type=int, default=3000, help="timed, per verb")
    parser.add_argument("--warmup", type=int, default=300, help="untimed first, per verb")
    parser.add_argument("--verbs", nargs="+", choices=["learn", "predict"],
                        default=["learn", "predict"])
    parser.add_argument("--no-wal", action="store_true", help="GLN_WAL_ENABLED=false")
    parser.add_argument("--skip-model-call", action="store_true",
                        help="do not time the model's own call alone")
    parser.add_argument("--stub", choices=list(LEVELS),
                        help="answer at once from this level of the path inwards (LEVELS)")
    parser.add_argument("--breakdown", action="store_true",
                        help="time every --stub level in turn, and the cost centres")
    parser.add_argument("--rounds", type=int, default=1, help="of --breakdown")
    args = parser.parse_args(argv)
    config = {"num_features": args.features, "num_classes": args.classes,
              "layer_sizes": [int(s) for s in args.layer_sizes.split(",")], "seed": 0}
    with tempfile.TemporaryDirectory(prefix="gln-request-cost-") as directory, server_gc():
        served = asyncio.run(run(args, config, directory, args.verbs, args.stub))
        result: dict[str, Any] = {"config": config, "wal": not args.no_wal,
                                  "requests": args.requests, "stub": args.stub,
                                  "service": served}
        if args.breakdown:
            result["breakdown"] = breakdown(args, config, directory)
        if not args.skip_model_call:
            result["model_call"] = {
                verb: summary_us(model_call_times(config, verb, bodies(config, verb),
                                                  args.warmup + args.requests)[args.warmup:])
                for verb in args.verbs}
    result.update(cpus=os.cpu_count(), python=platform.python_version())
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
