"""Slow clients against a real server process: headers that do not arrive in time, a body
trickled a few bytes at a time, and more connections than the server takes. Each would hold
a connection (and its memory) for good without its limit."""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path

import httpx
import pytest

from tests.service.durable_client import ServerProcess

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def _server_with(tmp_path_factory: pytest.TempPathFactory, env: dict[str, str]):
    """A server process with ``env`` and a model "m" of 2 features."""
    directory = tmp_path_factory.mktemp("slow")
    process = ServerProcess({"GLN_SNAPSHOT_DIR": str(directory / "s"), **env},
                            Path(directory) / "server.log")
    with process:
        process.start()
        httpx.post(f"{process.url}/v1/models",
                   json={"name": "m", "config": {"num_features": 2}}).raise_for_status()
        yield process


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    with _server_with(tmp_path_factory, {
            "GLN_HEADER_TIMEOUT_S": "0.5", "GLN_BODY_TIMEOUT_S": "0.5",
            "GLN_MIN_BODY_BYTES_PER_S": "1000", "GLN_MAX_CONNECTIONS": "8"}) as process:
        yield process


def _connect(server: ServerProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    return sock


def _answer(sock: socket.socket) -> bytes:
    """What the server sent until it closed the connection."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_headers_that_do_not_come_in_time_get_408_and_the_connection_closes(server):
    t0 = time.monotonic()
    with _connect(server) as sock:
        sock.sendall(b"POST /v1/models/m/learn HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # no end
        answer = _answer(sock)
    assert answer.startswith(b"HTTP/1.1 408") and b"GLN_HEADER_TIMEOUT_S" in answer
    assert time.monotonic() - t0 < 5
    with _connect(server) as sock:  # a connection that never sends a byte
        assert _answer(sock).startswith(b"HTTP/1.1 408")


def test_a_trickled_body_gets_408_though_every_piece_comes_in_time(server):
    body = b'{"features": [[1.0, 2.0]], "labels": [1]}' + b" " * 20000
    head = (b"POST /v1/models/m/learn HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
    t0 = time.monotonic()
    with _connect(server) as sock:
        sock.sendall(head)
        sent = 0
        try:
            while sent < len(body) and time.monotonic() - t0 < 20:
                sock.sendall(body[sent:sent + 10])  # 10 bytes every 0.2 s: 50 bytes/s
                sent += 10
                time.sleep(0.2)
        except OSError:
            pass  # the server closed it
        answer = _answer(sock)
    assert answer.startswith(b"HTTP/1.1 408") and b"GLN_MIN_BODY_BYTES_PER_S" in answer
    assert time.monotonic() - t0 < 5 and sent < len(body)


@pytest.fixture(scope="module")
def capped_server(tmp_path_factory: pytest.TempPathFactory):
    """A server whose deadlines outlast the test, so held connections stay held however slow
    the machine is."""
    with _server_with(tmp_path_factory, {
            "GLN_HEADER_TIMEOUT_S": "60", "GLN_BODY_TIMEOUT_S": "60",
            "GLN_MAX_CONNECTIONS": "8", "GLN_MAX_BODY_BYTES": "1048576"}) as process:
        yield process


def _healthz_until(server: ServerProcess, status: int, within_s: float = 20) -> int:
    """Ask /healthz until it answers `status` (the server takes held connections in its own
    time) or the time is up; the last answer's status."""
    deadline = time.monotonic() + within_s
    while True:
        answer = httpx.get(f"{server.url}/healthz", timeout=10).status_code
        if answer == status or time.monotonic() > deadline:
            return answer
        time.sleep(0.1)


def test_past_the_connection_cap_new_requests_get_503_and_the_rest_are_served(capped_server):
    held = [_connect(capped_server) for _ in range(8)]
    try:
        for sock in held:  # each holds a request open: headers sent, body awaited
            sock.sendall(b"POST /v1/models/m/learn HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n")
        assert _healthz_until(capped_server, 503) == 503
    finally:
        for sock in held:
            sock.close()
    assert _healthz_until(capped_server, 200) == 200


def test_a_body_over_the_limit_sent_whole_gets_its_413_not_a_reset(capped_server):
    """The server reads and drops a too-large body before it answers and closes: a client
    that is still sending reads the 413, where a close with unread data would reset."""
    body = b"0" * (1024 * 1024 + 200_000)  # past its GLN_MAX_BODY_BYTES, 1 MiB
    head = (b"POST /v1/models/m/learn HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
    for _ in range(5):
        with _connect(capped_server) as sock:
            sock.sendall(head + body)
            answer = _answer(sock)
        assert answer.startswith(b"HTTP/1.1 413") and b"GLN_MAX_BODY_BYTES" in answer
