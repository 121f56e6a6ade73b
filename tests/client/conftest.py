"""Real servers for the client's tests, and one test body for both clients.

* ``server``: ``python -m service`` in a process of its own (one per test module), with a
  bearer token and a 1 MiB body limit, so 401 and 413 are cheap to provoke.
* ``proxy``: a real HTTP server (uvicorn, in a thread) in front of it that passes requests
  on, except those it is told to answer otherwise (:class:`Fault`): a 503 with a
  ``Retry-After``, before or after the service has done the request (an answer lost on the
  way back), or a 415 as a server from before binary rows would give.
* ``connect``: a client of either kind (parametrized): a :class:`gln_client.GLNClient`, or an
  :class:`gln_client.AsyncGLNClient` behind :class:`Blocking`, which runs its coroutines on a
  loop of its own, so one test body checks both.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from gln_client import AsyncGLNClient, AsyncStream, GLNClient
from tests.service.durable_client import ServerProcess
from tests.support.redis_process import free_port

TOKEN = "client-test-token"
MAX_BODY_BYTES = 1 << 20


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory = tmp_path_factory.mktemp("client-server")
    with ServerProcess({"GLN_SNAPSHOT_DIR": str(directory / "snapshots"),
                        "GLN_API_TOKEN": TOKEN, "GLN_MAX_BODY_BYTES": str(MAX_BODY_BYTES),
                        "GLN_SNAPSHOT_INTERVAL_S": "3600"},
                       directory / "server.log") as process:
        yield process.start()


@dataclass(frozen=True)
class Fault:
    """How the proxy answers one request instead of the service's answer: ``status`` with
    ``retry_after`` (if given); ``forward``: the service gets the request first."""

    status: int = 503
    retry_after: str | None = None
    forward: bool = False


class FlakyProxy:
    """An ASGI app that forwards to ``upstream``, answering the next requests with the
    :class:`Fault` s queued in ``faults``; ``seen`` has every request's method, path and
    headers."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.faults: deque[Fault] = deque()
        self.seen: list[tuple[str, str, httpx.Headers]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        body = await request.body()
        self.seen.append((request.method, request.url.path, httpx.Headers(request.headers)))
        fault = self.faults.popleft() if self.faults else None
        response: Response | None = None
        if fault is None or fault.forward:
            headers = {k: v for k, v in request.headers.items() if k not in ("host",)}
            async with httpx.AsyncClient(base_url=self.upstream) as upstream:
                answer = await upstream.request(request.method, request.url.path,
                                                content=body, headers=headers)
            response = Response(answer.content, answer.status_code,
                                media_type=answer.headers.get("content-type"))
        if fault is not None:
            headers = {} if fault.retry_after is None else {"retry-after": fault.retry_after}
            response = JSONResponse({"detail": f"the proxy says {fault.status}"},
                                    fault.status, headers=headers)
        assert response is not None
        await response(scope, receive, send)


@pytest.fixture(scope="module")
def proxy_server(server: ServerProcess) -> Iterator[tuple[str, FlakyProxy]]:
    app = FlakyProxy(server.url)
    port = free_port()
    web = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off",
                                        log_level="warning"))
    thread = threading.Thread(target=web.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not web.started:
        assert time.monotonic() < deadline, "the proxy did not start"
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}", app
    web.should_exit = True
    thread.join(10)


@pytest.fixture
def proxy(proxy_server: tuple[str, FlakyProxy]) -> Iterator[tuple[str, FlakyProxy]]:
    """The proxy's URL and app, with no fault queued and nothing seen."""
    url, app = proxy_server
    app.faults.clear()
    app.seen.clear()
    yield url, app
    app.faults.clear()


class Blocking:
    """An :class:`AsyncGLNClient` (or one of its streams) whose coroutines are run to the end
    on ``loop``: its verbs called as :class:`GLNClient` 's are."""

    def __init__(self, target: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._target = target
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._target, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            result = attribute(*args, **kwargs)
            if inspect.isawaitable(result):
                return self._loop.run_until_complete(result)
            return Blocking(result, self._loop) if isinstance(result, AsyncStream) else result

        return call

    def __enter__(self) -> Blocking:
        self._loop.run_until_complete(self._target.__aenter__())
        return self

    def __exit__(self, *exc: Any) -> None:
        self._loop.run_until_complete(self._target.__aexit__(*exc))

    def close(self) -> None:
        self._loop.run_until_complete(self._target.aclose())
        self._loop.close()


@pytest.fixture(params=["sync", "async"])
def connect(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[Callable[..., Any]]:
    """``connect(url=server's, **options)``: a client of this test's kind, with the token
    unless ``token`` is given; closed after the test."""
    made: list[Any] = []

    def connect(url: str | None = None, **options: Any) -> Any:
        options.setdefault("token", TOKEN)
        if request.param == "sync":
            client: Any = GLNClient(url or server.url, **options)
        else:
            client = Blocking(AsyncGLNClient(url or server.url, **options),
                              asyncio.new_event_loop())
        made.append(client)
        return client

    yield connect
    for client in made:
        client.close()


@pytest.fixture
def name() -> str:
    """A model name no other test uses (the server lives for the whole module)."""
    return f"m-{uuid.uuid4().hex[:12]}"
