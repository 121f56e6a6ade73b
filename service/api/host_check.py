"""Refuse requests addressed to a host name this server does not answer to.

A server on the loopback interface answers only this machine, but a web page can still reach
it through DNS rebinding: the page's own host name is made to resolve to 127.0.0.1, and the
browser then sends the page's requests, and lets it read the answers, with ``Host: <that
name>``. Checking the Host header closes that door: such a server answers only ``localhost``,
``127.0.0.1`` and ``::1`` unless ``GLN_ALLOWED_HOSTS`` names more; one that listens on other
interfaces answers any host unless ``GLN_ALLOWED_HOSTS`` says otherwise.
"""

from __future__ import annotations

import ipaddress

from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.asgi_replies import refuse_websocket, send_json

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def allowed_hosts_for(listen_host: str, configured: list[str] | None) -> list[str] | None:
    """The host names to accept (None: any), from ``GLN_ALLOWED_HOSTS`` when set, else from
    the address the server listens on."""
    if configured:  # a name given with a port is taken without it, as Host headers are
        return None if "*" in configured else [host_name(h) for h in configured]
    if listen_host == "localhost" or _is_loopback(listen_host):
        return list(LOOPBACK_NAMES)
    return None


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name of a Host header without its port (``[::1]:8000`` -> ``::1``), lowercased."""
    header = header.strip().lower()
    if header.startswith("["):
        inside, _, after = header[1:].partition("]")
        return inside if after == "" or after.startswith(":") else header
    return header.rpartition(":")[0] if header.count(":") == 1 else header


class HostCheckMiddleware:
    """400 for an HTTP request whose Host is not one of ``allowed`` (None: all pass)."""

    def __init__(self, app: ASGIApp, allowed: list[str] | None) -> None:
        self.app = app
        self.allowed = None if allowed is None else frozenset(allowed)
        # Verdicts on the Host headers seen (clients send the same few), so a request costs a
        # lookup; cleared when it grows past a few hundred (headers are the client's choice).
        self._verdicts: dict[bytes, bool] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and self.allowed is not None:
            raw = b""
            for key, value in scope["headers"]:
                if key == b"host":  # the first, as the HTTP server reads it
                    raw = value
                    break
            allowed = self._verdicts.get(raw)
            if allowed is None:
                if len(self._verdicts) > 256:
                    self._verdicts.clear()
                # No Host at all is no browser's request (HTTP/1.0 tools may send none).
                allowed = not raw or host_name(raw.decode("latin-1")) in self.allowed
                if len(raw) <= 255:  # a host name's most; longer ones are not kept
                    self._verdicts[raw] = allowed
            if not allowed and scope["type"] == "websocket":
                await refuse_websocket(receive, send, "this server does not answer to the host")
                return
            if not allowed:
                header = raw.decode("latin-1")
                await send_json(send, 400, (
                    f"this server does not answer to the host {header[:100]!r} (the names it "
                    "serves are set by GLN_ALLOWED_HOSTS)"))
                return
        await self.app(scope, receive, send)
