"""The server's listening sockets, bound before it restores anything.

uvicorn binds its address only after the app's start-up has run, so a server whose port is
taken would restore every stored model, then fail. Bound first, it refuses at once, in one
line.
"""

from __future__ import annotations

import socket


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
