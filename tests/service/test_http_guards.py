"""The guards in front of the handlers: bearer token on mutating routes, and the body limit.

A request a guard refuses must change nothing, so every test also checks the model afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from pydantic import SecretStr

from gln import GLN
from service.api.app import create_app
from service.settings import IMPORT_HEADER_BYTES, Settings

TOKEN = "s3cret-token"
OCTETS = {"content-type": "application/octet-stream"}


@pytest.fixture
async def token_client(settings: Settings, serve) -> AsyncIterator[httpx.AsyncClient]:
    with_token = settings.model_copy(update={"api_token": SecretStr(TOKEN)})
    async with serve(create_app(with_token)) as client:
        yield client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _body(body: dict | bytes | None, headers: dict[str, str]) -> dict:
    """httpx arguments sending ``body`` with ``headers``: JSON, or raw bytes (a model import,
    declared as such)."""
    if isinstance(body, bytes):
        return {"content": body, "headers": {**headers, **OCTETS}}
    return {"json": body, "headers": headers}


# -- auth -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "headers",
    [
        {},
        bearer("wrong"),
        bearer(TOKEN + "x"),
        bearer(""),
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
    ],
    ids=["none", "wrong", "longer", "empty", "basic-scheme", "no-scheme"],
)
@pytest.mark.parametrize("slash", ["", "/"], ids=["", "trailing-slash"])
async def test_mutating_routes_need_the_token(
    token_client: httpx.AsyncClient, headers, slash: str, small_config, make_data
):
    good = bearer(TOKEN)
    r = await token_client.post(
        "/v1/models", json={"name": "m", "config": small_config}, headers=good
    )
    assert r.status_code == 201
    X, y = make_data(2)
    attempts = [
        ("POST", "/v1/models", {"name": "other", "config": small_config}),
        ("POST", "/v1/models/m/learn", {"features": X, "labels": y}),
        ("POST", "/v1/models/m/predict", {"features": X}),
        ("POST", "/v1/models/m/explain", {"features": X}),
        ("POST", "/v1/models/m/labels", {"ids": ["a"], "labels": [0]}),
        ("POST", "/v1/models/m/snapshot", None),
        ("POST", "/v1/models/other/import", GLN(**small_config).to_bytes()),
        ("GET", "/v1/models/m/export", None),  # its bytes answer any prediction
        ("DELETE", "/v1/models/m", None),
    ]
    for method, path, body in attempts:
        r = await token_client.request(method, path + slash, **_body(body, headers))
        assert r.status_code == 401, (method, path, r.text)
        assert r.headers["www-authenticate"] == "Bearer"
        assert "bearer token" in r.json()["detail"]
    # Nothing happened: one model, nothing learned, no snapshot taken.
    listed = (await token_client.get("/v1/models")).json()
    assert [(m["name"], m["examples_seen"], m["snapshot"]) for m in listed] == [("m", 0, None)]


@pytest.mark.parametrize("slash", ["", "/"], ids=["", "trailing-slash"])
async def test_the_right_token_opens_every_route(
    token_client: httpx.AsyncClient, slash: str, small_config, make_data
):
    good = bearer(TOKEN)
    X, y = make_data(2)
    calls = [
        ("POST", "/v1/models", {"name": "m", "config": small_config}, 201),
        ("POST", "/v1/models/m/learn", {"features": X, "labels": y}, 200),
        ("POST", "/v1/models/m/predict", {"features": X}, 200),
        ("POST", "/v1/models/m/explain", {"features": X}, 200),
        ("POST", "/v1/models/m/labels", {"ids": ["a"], "labels": [0]}, 200),
        ("POST", "/v1/models/m/snapshot", None, 200),
        ("POST", "/v1/models/copy/import", GLN(**small_config).to_bytes(), 201),
        ("GET", "/v1/models/m/export", None, 200),
        ("DELETE", "/v1/models/m", None, 204),
    ]
    for method, path, body, expected in calls:
        r = await token_client.request(method, path + slash, **_body(body, good))
        assert r.status_code == expected, (method, path, r.text)


async def test_reads_need_no_token(token_client: httpx.AsyncClient, small_config):
    await token_client.post(
        "/v1/models", json={"name": "m", "config": small_config}, headers=bearer(TOKEN)
    )
    for path in ["/v1/models", "/v1/models/m", "/healthz", "/readyz", "/metrics"]:
        assert (await token_client.get(path)).status_code == 200, path


async def test_reads_can_be_made_to_need_the_token_too(settings: Settings, serve, small_config):
    guarded = settings.model_copy(update={"api_token": SecretStr(TOKEN), "token_for_reads": True})
    async with serve(create_app(guarded)) as client:
        await client.post("/v1/models", json={"name": "m", "config": small_config},
                          headers=bearer(TOKEN))
        for path in ["/v1/models", "/v1/models/m"]:
            assert (await client.get(path)).status_code == 401, path
            assert (await client.get(path, headers=bearer("nope"))).status_code == 401, path
            assert (await client.get(path, headers=bearer(TOKEN))).status_code == 200, path
        for path in ["/healthz", "/readyz", "/metrics", "/openapi.json"]:
            assert (await client.get(path)).status_code == 200, path


async def test_openapi_documents_the_bearer_scheme(token_client: httpx.AsyncClient):
    spec = (await token_client.get("/openapi.json")).json()
    assert spec["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    paths = spec["paths"]
    assert paths["/v1/models/{name}/learn"]["post"]["security"] == [{"bearerAuth": []}]
    assert paths["/v1/models/{name}"]["delete"]["security"] == [{"bearerAuth": []}]
    assert "security" not in paths["/v1/models/{name}"]["get"]
    assert paths["/v1/models/{name}/export"]["get"]["security"] == [{"bearerAuth": []}]
    assert paths["/v1/models/{name}/import"]["post"]["security"] == [{"bearerAuth": []}]


async def test_without_a_configured_token_no_header_is_needed(
    client: httpx.AsyncClient, create_model
):
    await create_model(client)  # asserts 201 without any Authorization header


# -- body limit -----------------------------------------------------------------------------------
@pytest.fixture
async def small_body_app(settings: Settings):
    return create_app(settings.model_copy(update={"max_body_bytes": 1000}))


def learn_body(rows: int) -> bytes:
    return json.dumps({"features": [[0.5] * 6] * rows, "labels": [1] * rows}).encode()


async def test_body_over_the_limit_is_413_by_content_length(small_body_app, serve, create_model):
    async with serve(small_body_app) as client:
        await create_model(client)
        body = learn_body(40)
        assert len(body) > 1000
        r = await client.post(
            "/v1/models/m/learn", content=body, headers={"content-type": "application/json"}
        )
        assert r.status_code == 413
        assert "GLN_MAX_BODY_BYTES" in r.json()["detail"]
        assert (await client.get("/v1/models/m")).json()["examples_seen"] == 0


async def test_body_at_the_limit_passes(small_body_app, serve, create_model):
    async with serve(small_body_app) as client:
        await create_model(client)
        body = learn_body(4)
        body = body[:-1] + b" " * (1000 - len(body)) + b"}"  # pad with JSON whitespace
        assert len(body) == 1000
        r = await client.post(
            "/v1/models/m/learn", content=body, headers={"content-type": "application/json"}
        )
        assert r.status_code == 200, r.text
        assert r.json()["examples"] == 4


async def test_an_import_may_exceed_the_body_limit_up_to_the_model_limit(
    settings: Settings, serve
):
    """A model's bytes are not JSON: their limit is the largest model the server admits
    (GLN_MAX_MODEL_BYTES, plus room for the header), not GLN_MAX_BODY_BYTES."""
    model = GLN(num_features=6, num_classes=3, layer_sizes=[8, 8, 1], context_dim=3)
    blob = model.to_bytes()
    small = settings.model_copy(update={"max_body_bytes": 1000})
    assert len(blob) > 10 * small.max_body_bytes
    async with serve(create_app(small)) as client:
        r = await client.post("/v1/models/m/import", content=blob, headers=OCTETS)
        assert r.status_code == 201, r.text
    tiny = small.model_copy(update={"max_model_bytes": 1000})
    assert len(blob) > tiny.import_max_bytes - IMPORT_HEADER_BYTES
    padded = blob + b"\0" * (tiny.import_max_bytes + 1 - len(blob))
    async with serve(create_app(tiny)) as client:
        r = await client.post("/v1/models/other/import", content=padded, headers=OCTETS)
        assert r.status_code == 413
        assert r.json()["detail"] == (
            f"request body larger than {tiny.import_max_bytes} bytes (an import: "
            "GLN_MAX_MODEL_BYTES plus room for its header)"
        )
        assert [m["name"] for m in (await client.get("/v1/models")).json()] == ["m"]
        # Only a POST is an import: other methods on its path keep GLN_MAX_BODY_BYTES, or
        # take no body at all.
        for method, limit in (("GET", "GET takes no body"), ("PUT", "GLN_MAX_BODY_BYTES"),
                              ("PATCH", "GLN_MAX_BODY_BYTES")):
            r = await client.request(method, "/v1/models/m/import", content=blob)
            assert r.status_code == 413, method
            assert limit in r.json()["detail"]


async def learn_in_pieces(client, body: bytes, piece: int):
    """POST a learn body as a chunked upload (no Content-Length), ``piece`` bytes at a time."""

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), piece):
            yield body[start : start + piece]

    return await client.post(
        "/v1/models/m/learn", content=chunks(), headers={"content-type": "application/json"}
    )


async def test_streamed_body_over_the_limit_is_413(small_body_app, serve, create_model):
    """No Content-Length (chunked upload): the middleware counts the bytes as they arrive."""
    async with serve(small_body_app) as client:
        await create_model(client)
        r = await learn_in_pieces(client, learn_body(40), 100)
        assert r.status_code == 413
        assert (await client.get("/v1/models/m")).json()["examples_seen"] == 0


async def test_streamed_body_under_the_limit_is_reassembled(small_body_app, serve, create_model):
    async with serve(small_body_app) as client:
        await create_model(client)
        r = await learn_in_pieces(client, learn_body(3), 7)
        assert r.status_code == 200, r.text
        assert r.json()["examples"] == 3


async def raw_learn(app, messages: list[dict], content_length: int) -> list[dict]:
    """What ``app`` sends for a raw ASGI POST to model m's learn route that declares
    ``content_length`` bytes and whose body arrives as ``messages``, after which the client
    is gone (``http.disconnect``)."""
    sent: list[dict] = []
    pending = list(messages)

    async def receive() -> dict:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/models/m/learn",
        "raw_path": b"/v1/models/m/learn",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(content_length).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
    }
    await app(scope, receive, send)
    return sent


async def test_lying_content_length_cannot_pass_the_limit(small_body_app, serve, create_model):
    """A raw ASGI request that declares 10 bytes and streams 4,000: 413, nothing learned."""
    app = small_body_app
    async with serve(app) as client:
        await create_model(client)
        body = learn_body(100)
        messages = [
            {"type": "http.request", "body": body[i : i + 500], "more_body": i + 500 < len(body)}
            for i in range(0, len(body), 500)
        ]
        sent = await raw_learn(app, messages, content_length=10)
        assert sent[0]["status"] == 413
        assert (await client.get("/v1/models/m")).json()["examples_seen"] == 0


async def test_a_client_that_hangs_up_mid_body_is_no_server_error(
    settings: Settings, serve, create_model, caplog: pytest.LogCaptureFixture
):
    """Half a body, then the client is gone: nothing learned, no 500 (which the error-rate
    alert counts) and no traceback, but 499, the clients' share of the errors."""
    app = create_app(settings)
    async with serve(app) as client:
        await create_model(client)
        half = [{"type": "http.request", "body": b'{"features": [[', "more_body": True}]
        with caplog.at_level("INFO"):
            sent = await raw_learn(app, half, content_length=100)
        assert sent[0]["status"] == 499
        assert not [r for r in caplog.records if r.levelname == "ERROR"]
        assert (await client.get("/v1/models/m")).json()["examples_seen"] == 0
        metrics = (await client.get("/metrics")).text
    assert ('gln_http_requests_total{method="POST",route="/v1/models/{name}/learn",'
            'status="499"} 1.0') in metrics
    assert 'status="500"' not in metrics


async def test_a_method_that_takes_no_body_has_its_body_refused_unread(
    settings: Settings, serve, create_model
):
    """An open route (``/healthz``) cannot be made to buffer a body, and a DELETE with one
    deletes nothing."""
    async with serve(create_app(settings)) as client:
        await create_model(client)
        for method, path in (("GET", "/healthz"), ("DELETE", "/v1/models/m"),
                             ("GET", "/v1/models/m")):
            r = await client.request(method, path, content=b"x" * 10)
            assert r.status_code == 413, (method, path)
            assert r.json()["detail"] == (
                f"request body larger than 0 bytes ({method} takes no body)")
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/v1/models/m")).status_code == 200


def _stalling_after(first: bytes):
    """A ``receive`` that gives ``first`` (more to come), then waits for ever (until its task
    is cancelled: a client that stopped sending), and the event set once ``first`` is out."""
    sent = asyncio.Event()

    async def receive() -> dict:
        if not sent.is_set():
            sent.set()
            return {"type": "http.request", "body": first, "more_body": True}
        await asyncio.Event().wait()
        raise AssertionError

    return sent, receive


def _raw_request(method: str = "POST", length: int | None = None) -> dict:
    headers = [(b"content-type", b"application/json")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {"type": "http", "method": method, "path": "/v1/models/m/learn", "headers": headers}


async def test_a_body_that_stops_arriving_is_408_and_never_reaches_the_app():
    from service.api.body_limit import BodyLimitMiddleware

    reached: list[bytes] = []

    async def app(scope, receive, send):
        reached.append((await receive())["body"])

    _, receive = _stalling_after(b'{"features": [[')  # the client never sends the rest
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    guard = BodyLimitMiddleware(app, max_bytes=1000, import_max_bytes=1000, timeout_s=0.05)
    await asyncio.wait_for(guard(_raw_request(), receive, send), 5)
    assert sent[0]["status"] == 408 and (b"connection", b"close") in sent[0]["headers"]
    assert b"GLN_BODY_TIMEOUT_S" in sent[1]["body"]
    assert reached == []


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
async def test_large_bodies_take_turns_small_ones_do_not_wait(declared: bool):
    """With one turn, a second large body is not read on while the first is in the app; a
    small body passes meanwhile."""
    from service.api.body_limit import LARGE_BODY_BYTES, BodyLimitMiddleware

    release = asyncio.Event()
    entered: list[int] = []

    async def app(scope, receive, send):
        body = (await receive())["body"]
        entered.append(len(body))
        if len(body) > LARGE_BODY_BYTES:
            await release.wait()

    guard = BodyLimitMiddleware(app, max_bytes=8 * LARGE_BODY_BYTES,
                                import_max_bytes=8 * LARGE_BODY_BYTES, max_large_bodies=1)
    large = b" " * (2 * LARGE_BODY_BYTES)

    def receiver(body: bytes):
        pieces = [body[i:i + LARGE_BODY_BYTES // 2]
                  for i in range(0, len(body), LARGE_BODY_BYTES // 2)] or [b""]

        async def receive() -> dict:
            piece = pieces.pop(0)
            return {"type": "http.request", "body": piece, "more_body": bool(pieces)}

        return receive

    async def send(message: dict) -> None:
        pass

    def request(body: bytes):
        length = len(body) if declared else None
        return guard(_raw_request(length=length), receiver(body), send)

    first = asyncio.create_task(request(large))
    second = asyncio.create_task(request(large + b" "))
    await asyncio.sleep(0.05)
    await asyncio.wait_for(request(b"{}"), 5)  # small: no turn needed
    assert entered == [len(large), 2]
    release.set()
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert entered == [len(large), 2, len(large) + 1]


# -- content types ---------------------------------------------------------------------------------
@pytest.mark.parametrize("content_type", [
    "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None,
])
async def test_a_body_a_web_page_could_send_cross_site_is_415_and_changes_nothing(
    settings: Settings, serve, create_model, small_config, make_data, content_type
):
    """The types a page may send to any site without a preflight (and none at all) are
    refused on every route with a body: no page can create, train or import models."""
    headers = {} if content_type is None else {"content-type": content_type}
    X, y = make_data(3)
    async with serve(create_app(settings)) as client:
        await create_model(client)
        blob = (await client.get("/v1/models/m/export")).content
        for path, body, expected in (
            ("/v1/models", {"name": "n", "config": small_config}, "application/json"),
            ("/v1/models/m/learn", {"features": X, "labels": y}, "application/json"),
            ("/v1/models/m/predict", {"features": X}, "application/json"),
            ("/v1/models/copy/import", blob, "application/octet-stream"),
        ):
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            r = await client.post(path, content=content, headers=headers)
            assert r.status_code == 415, (path, r.text)
            assert r.json()["detail"].startswith(f"send the body with 'Content-Type: {expected}'")
        assert [m["name"] for m in (await client.get("/v1/models")).json()] == ["m"]
        assert (await client.get("/v1/models/m")).json()["examples_seen"] == 0


async def test_json_with_a_charset_or_a_json_suffix_is_json(
    settings: Settings, serve, create_model, make_data
):
    X, y = make_data(2)
    async with serve(create_app(settings)) as client:
        await create_model(client)
        for content_type in ("application/json; charset=utf-8", "application/vnd.gln+json",
                             "Application/JSON"):
            r = await client.post("/v1/models/m/learn", headers={"content-type": content_type},
                                  content=json.dumps({"features": X, "labels": y}).encode())
            assert r.status_code == 200, (content_type, r.text)
        assert (await client.get("/v1/models/m")).json()["examples_seen"] == 6


async def test_an_error_echoing_a_huge_value_is_cut(settings: Settings, serve):
    """A 5 MB string as a config number used to come back whole in the 422."""
    from service.api.error_handlers import DETAIL_MAX_CHARS

    async with serve(create_app(settings)) as client:
        r = await client.post("/v1/models", json={
            "name": "m", "config": {"num_features": "7" * 5_000_000}})
        assert r.status_code == 422
        detail = r.json()["detail"]
        assert detail.startswith("invalid config: num_features must be a positive int")
        assert len(detail) < DETAIL_MAX_CHARS + 100 and "characters more)" in detail


async def test_a_slow_large_body_holds_no_turn():
    """A turn is taken once the body is in: a client that trickles a large body (slow-loris)
    cannot keep other large requests out of the app."""
    from service.api.body_limit import LARGE_BODY_BYTES, BodyLimitMiddleware

    entered: list[int] = []

    async def app(scope, receive, send):
        entered.append(len((await receive())["body"]))

    guard = BodyLimitMiddleware(app, max_bytes=8 * LARGE_BODY_BYTES,
                                import_max_bytes=8 * LARGE_BODY_BYTES, max_large_bodies=1)
    stalled, trickle = _stalling_after(b" " * (2 * LARGE_BODY_BYTES))

    async def whole() -> dict:
        return {"type": "http.request", "body": b" " * (3 * LARGE_BODY_BYTES), "more_body": False}

    async def send(message: dict) -> None:
        pass

    slow = asyncio.create_task(guard(_raw_request(), trickle, send))
    await stalled.wait()
    await asyncio.wait_for(guard(_raw_request(), whole, send), 5)
    assert entered == [3 * LARGE_BODY_BYTES]
    slow.cancel()


async def test_a_chunked_body_on_a_bodiless_route_and_a_snapshot_body_are_refused_at_once(
    settings: Settings, serve, create_model
):
    async def nothing_yet() -> AsyncIterator[bytes]:
        yield b""

    async with serve(create_app(settings)) as client:
        await create_model(client)
        r = await client.request("GET", "/healthz", content=nothing_yet())
        assert r.status_code == 413
        r = await client.post("/v1/models/m/snapshot", content=b"x" * 100)
        assert r.status_code == 413 and "a snapshot takes no body" in r.json()["detail"]
        assert (await client.post("/v1/models/m/snapshot")).status_code == 200


async def test_bodies_held_at_once_are_bounded_and_given_back():
    """Many (or slow) large bodies cannot make the server hold any amount: past
    max_buffered_bytes a request gets 503, and what a request held is given back however it
    ends (answered, refused, or its client gone)."""
    from service.api.body_limit import LARGE_BODY_BYTES, BodyLimitMiddleware

    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})

    guard = BodyLimitMiddleware(app, max_bytes=8 * LARGE_BODY_BYTES,
                                import_max_bytes=8 * LARGE_BODY_BYTES,
                                max_buffered_bytes=3 * LARGE_BODY_BYTES)
    stalled, trickle = _stalling_after(b" " * (2 * LARGE_BODY_BYTES))

    def whole(size: int):
        async def receive() -> dict:
            return {"type": "http.request", "body": b" " * size, "more_body": False}
        return receive

    def recorder(into: list[dict]):
        async def send(message: dict) -> None:
            into.append(message)
        return send

    slow = asyncio.create_task(guard(_raw_request(), trickle, recorder([])))
    await stalled.wait()
    assert guard.buffered == 2 * LARGE_BODY_BYTES
    refused: list[dict] = []
    await guard(_raw_request(), whole(2 * LARGE_BODY_BYTES), recorder(refused))
    assert refused[0]["status"] == 503 and b"GLN_MAX_BUFFERED_BYTES" in refused[1]["body"]
    served: list[dict] = []
    await guard(_raw_request(), whole(LARGE_BODY_BYTES // 2), recorder(served))  # room left
    assert served[0]["status"] == 200
    assert guard.buffered == 2 * LARGE_BODY_BYTES  # the answered and refused gave theirs back
    slow.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await slow
    assert guard.buffered == 0
