"""Connections whose request headers do not arrive in time are closed.

uvicorn waits as long as it takes for a request's headers, so a client that sends them a byte
at a time (or opens a connection and sends nothing) holds a connection, and its memory, for
good; enough such clients shut everyone else out. :class:`HeaderDeadlineProtocol` is uvicorn's
HTTP protocol with a deadline: from the connection's start, and from each new request's first
byte, its headers must be complete within :data:`header_timeout_s` seconds, or the connection
gets a 408 and is closed. (A body's pace is the body limit's: ``service.api.body_limit``.)
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# Set from GLN_HEADER_TIMEOUT_S by the process before it serves (uvicorn builds the protocol).
header_timeout_s = 10.0

_TIMEOUT_BODY = b'{"detail":"request headers incomplete in time (GLN_HEADER_TIMEOUT_S)"}'
_TIMEOUT_ANSWER = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                   b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
                   % (len(_TIMEOUT_BODY), _TIMEOUT_BODY))


class HeaderDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing a connection whose headers come too slowly."""

    _header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._header_deadline = self.loop.call_later(header_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _too_slow(self) -> None:
        self._header_deadline = None
        if self.cycle is not None and not self.cycle.response_complete:
            return  # headers came: a request is being served (its keep-alive is uvicorn's)
        if not self.transport.is_closing():
            self.transport.write(_TIMEOUT_ANSWER)
            self.transport.close()
