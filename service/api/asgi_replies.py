"""What the pure-ASGI middlewares share: an answer of their own, and a look at the path.

They run before the app and its router, so they answer in the app's error shape
(``{"detail": ...}``) themselves and read a model route from the raw path.
"""

from __future__ import annotations

import json

from starlette.types import Receive, Send


async def send_json(
    send: Send, status: int, detail: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """Answer with ``{"detail": ...}`` from a middleware (the app never sees the request)."""
    body = json.dumps({"detail": detail}).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *(headers or []),
        ],
    })
    await send({"type": "http.response.body", "body": body})


def is_model_action(path: str, action: str) -> bool:
    """Whether ``path`` is ``/v1/models/<name>/<action>`` (the middlewares run before routing)."""
    name, slash, rest = path.removeprefix("/v1/models/").partition("/")
    return path.startswith("/v1/models/") and bool(name) and slash == "/" and rest == action


async def refuse_websocket(receive: Receive, send: Send, reason: str) -> None:
    """Refuse a WebSocket handshake (the client gets a 403): the stream's answer to what an
    HTTP request would get a 400 or 401 for."""
    await receive()  # websocket.connect
    await send({"type": "websocket.close", "code": 1008, "reason": reason[:120]})
