"""Counting and timing every HTTP request by route template (``gln_http_*``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.metrics import ServiceMetrics

HTTP_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"}
)


class RequestMetricsMiddleware:
    """Counts every HTTP request by route template, method and status, and times it by route
    template, method and status class."""

    def __init__(
        self, app: ASGIApp, metrics: ServiceMetrics, routes: Sequence[BaseRoute] = ()
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes  # to name requests refused before routing (401, 413)
        # Label children, looked up once per (route, method[, status]) instead of per request.
        self._counters: dict[tuple[str, str, int], Any] = {}
        self._histograms: dict[tuple[str, str, int], Any] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status_code = 500  # what the client gets if the app raises before answering

        async def send_and_record(message: Message) -> None:
            nonlocal status_code
            if message["type"] == "http.response.start":
                status_code = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            elapsed = time.perf_counter() - start
            route = _route_template(scope, self.routes)
            method = scope["method"]
            if method not in HTTP_METHODS:
                method = "other"  # a client's made-up method must not become a label value
            counter = self._counters.get((route, method, status_code))
            if counter is None:
                counter = self.metrics.http_requests.labels(route, method, str(status_code))
                self._counters[(route, method, status_code)] = counter
            counter.inc()
            histogram = self._histograms.get((route, method, status_code))
            if histogram is None:
                histogram = self.metrics.http_duration.labels(
                    route, method, f"{status_code // 100}xx")
                self._histograms[(route, method, status_code)] = histogram
            histogram.observe(elapsed)


def _route_template(scope: Scope, routes: Sequence[BaseRoute]) -> str:
    """``/v1/models/{name}/learn``, never the concrete path (bounded label values)."""
    route = scope.get("route")
    if route is not None:
        return str(getattr(route, "path", "unmatched"))
    # The router did not run (e.g. the body limit refused the request): match by hand.
    for candidate in routes:
        match, _ = candidate.matches(scope)
        if match != Match.NONE:
            return str(getattr(candidate, "path", "unmatched"))
    return "unmatched"
