"""A Python client of the gln-service HTTP API: ``GLNClient`` (blocking), ``AsyncGLNClient``.

Installed on its own with ``pip install ./gln_client`` (its own ``pyproject.toml``: httpx,
NumPy, websockets), or beside the service with its ``client`` extra; it imports neither
``gln`` nor ``service``. docs/client.md has a tour.

>>> from gln_client import GLNClient
>>> client = GLNClient("http://127.0.0.1:8000")  # nothing is sent until a verb is called
>>> client.close()
"""

from gln_client.client import AsyncGLNClient, GLNClient
from gln_client.errors import (
    Conflict,
    ConnectionFailed,
    GLNError,
    InvalidRequest,
    ModelNotFound,
    PayloadTooLarge,
    ServerError,
    Unauthorized,
    Unavailable,
)
from gln_client.protocol import LabelsResult, LearnResult, Retry
from gln_client.stream import AsyncStream, Stream

__all__ = [
    "AsyncGLNClient", "AsyncStream", "Conflict", "ConnectionFailed", "GLNClient", "GLNError",
    "InvalidRequest", "LabelsResult", "LearnResult", "ModelNotFound", "PayloadTooLarge",
    "Retry", "ServerError", "Stream", "Unauthorized", "Unavailable",
]
