"""The server's listening sockets, bound before it restores anything, and how uvicorn serves
on them.

uvicorn binds its address only after the app's start-up has run, so a server whose port is
taken would restore every stored model, then fail. Bound first, it refuses at once, in one
line.
"""

from __future__ import annotations

import socket
from typing import Any

from service.api.slow_clients import HeaderDeadlineProtocol
from service.settings import Settings


def bind_listeners(host: str, port: int) -> list[socket.socket]:
    """A socket bound to each address ``host`` names (``localhost`` may be two), as asyncio's
    server would bind them; OSError if any cannot be bound (the others are closed)."""
    addresses = {
        (family, address[:2])
        for family, _, _, _, address in socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        if family in (socket.AF_INET, socket.AF_INET6)
    }
    bound: list[socket.socket] = []
    try:
        for family, address in sorted(addresses, key=str):
            sock = socket.socket(family, socket.SOCK_STREAM)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as asyncio does: the IPv4 address binds apart
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except OSError:
        for sock in bound:
            sock.close()
        raise
    return bound


def server_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's settings for the HTTP face, one process or many workers alike."""
    return {
        "host": settings.host, "port": settings.port, "log_level": settings.log_level,
        "access_log": settings.access_log, "server_header": False,
        "timeout_graceful_shutdown": settings.shutdown_timeout_s,
        # A stream's batches are arrays, which deflate barely shrinks: compressing every
        # message took most of the stream's CPU.
        "ws_per_message_deflate": False,
        "http": HeaderDeadlineProtocol, "limit_concurrency": settings.max_connections,
    }
