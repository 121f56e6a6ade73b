"""The service's errors as exceptions, one class per status a caller may want to catch.

Every error answer of the service has the body ``{"detail": "<what went wrong>"}``; the
exception carries that text as ``detail`` and the HTTP status as ``status``.

>>> error = error_for(404, "model 'fraud' not found")
>>> isinstance(error, ModelNotFound), error.status, error.detail
(True, 404, "model 'fraud' not found")
>>> isinstance(error_for(502, "bad gateway"), ServerError)
True
"""

from __future__ import annotations


class GLNError(Exception):
    """An error answer of the service (``status``: its HTTP status, ``detail``: its text), or
    no answer at all (:class:`ConnectionFailed`, ``status`` None)."""

    def __init__(self, status: int | None, detail: str) -> None:
        super().__init__(f"{status}: {detail}" if status is not None else detail)
        self.status = status
        self.detail = detail


class InvalidRequest(GLNError):
    """422 (or 400, 415): the request was refused as it is, and nothing of it was done: a
    wrong width, NaN, a label out of range, a config GLN refuses, a name that is no name."""


class Unauthorized(GLNError):
    """401: the server has ``GLN_API_TOKEN`` set and the token was missing or wrong."""


class ModelNotFound(GLNError):
    """404: no model of that name (or it is stored but could not be restored)."""


class Conflict(GLNError):
    """409: the name is taken (a create or an import), or the server's limits on models
    (``GLN_MAX_MODELS``, ``GLN_MAX_TOTAL_MODEL_BYTES``) leave no room."""


class PayloadTooLarge(GLNError):
    """413: the body is over the server's limit; send fewer rows a request."""


class ServerError(GLNError):
    """A 5xx other than 503: the server failed (its detail names the request id to find in
    its log)."""


class Unavailable(ServerError):
    """503, still after the retries the request was allowed: the server is restoring its
    models, its log or store does not answer, or it is shutting down."""


class ConnectionFailed(GLNError):
    """No answer: the connection failed or timed out, still after the retries the request was
    allowed. The underlying ``httpx`` (or ``websockets``) error is its ``__cause__``."""

    def __init__(self, detail: str) -> None:
        super().__init__(None, detail)


_BY_STATUS: dict[int, type[GLNError]] = {
    400: InvalidRequest, 401: Unauthorized, 404: ModelNotFound, 409: Conflict,
    413: PayloadTooLarge, 415: InvalidRequest, 422: InvalidRequest, 503: Unavailable,
}


def error_for(status: int, detail: str) -> GLNError:
    """The exception for an error answer of ``status`` with ``detail``."""
    kind = _BY_STATUS.get(status) or (ServerError if status >= 500 else GLNError)
    return kind(status, detail)
