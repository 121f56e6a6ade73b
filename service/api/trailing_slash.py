"""A path with one trailing slash is served as the path without it.

``POST /v1/models/`` is a client's slip for ``POST /v1/models``. Starlette's default answers
it with a 307 whose body is empty and whose ``Location`` names the scheme and host the server
sees (``http://`` behind a proxy that ends TLS), which many clients do not follow: the request
seemed to succeed and did nothing. Here the slash is dropped before anything looks at the path,
so routing, the token check of the routes that need one, the body limits and the metrics' route
label all see the path as it is meant.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


class TrailingSlashMiddleware:
    """Drops one trailing slash from the path of every HTTP request but ``/``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and len(path) > 1 and path.endswith("/"):
            scope = dict(scope, path=path[:-1])
            raw_path = scope.get("raw_path")
            if raw_path and raw_path.endswith(b"/"):
                scope["raw_path"] = raw_path[:-1]
        await self.app(scope, receive, send)
