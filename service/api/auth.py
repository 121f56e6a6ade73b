"""The bearer token: what a request needs ``Authorization: Bearer <GLN_API_TOKEN>`` for."""

from __future__ import annotations

import hmac

from pydantic import SecretStr
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.asgi_replies import is_model_action, refuse_websocket, send_json


class BearerAuthMiddleware:
    """401 for POST/PUT/PATCH/DELETE without ``Authorization: Bearer <token>``, if one is set.

    One rule for every mutating route, so a new route cannot forget it. Reads stay open unless
    ``protect_reads``: then the API's GET routes (``/v1/...``) need the token too, while the
    probes (``/healthz``, ``/readyz``), ``/metrics`` and the OpenAPI pages stay open for
    orchestrators, Prometheus and people. A model's export always needs it: its bytes answer
    every prediction, which POST predict keeps behind the token.
    """

    MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})

    def __init__(self, app: ASGIApp, token: SecretStr | None, protect_reads: bool = False) -> None:
        self.app = app
        self.expected = None if token is None else token.get_secret_value().encode()
        self.protect_reads = protect_reads

    def _needs_token(self, scope: Scope) -> bool:
        if self.expected is None or scope["type"] not in ("http", "websocket"):
            return False
        if scope["type"] == "websocket":  # the stream learns
            return True
        if scope["method"] in self.MUTATING or is_model_action(scope["path"], "export"):
            return True
        return self.protect_reads and scope["path"].startswith("/v1/")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._needs_token(scope):
            await self.app(scope, receive, send)
            return
        given = b""
        for key, value in scope["headers"]:
            if key == b"authorization":
                scheme, _, credentials = value.partition(b" ")
                if scheme.lower() == b"bearer":
                    given = credentials.strip()
                break
        # compare_digest: the time taken does not reveal how much of the token matched.
        if hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await refuse_websocket(receive, send, "missing or invalid bearer token")
            return
        await send_json(
            send, 401,
            "missing or invalid bearer token (Authorization: Bearer <GLN_API_TOKEN>)",
            [(b"www-authenticate", b"Bearer")],
        )
