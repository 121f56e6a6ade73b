"""Errors the HTTP layer shows to clients, each carrying its status code.

The registry and the model workers raise these; ``service.api.error_handlers`` maps every one to a
``{"detail": str(error)}`` body with its ``status_code``, so routes never translate exceptions.
:func:`shown` is how any of the service's messages quotes a value a client sent.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any


class RegistryError(Exception):
    """An error with an HTTP status; ``str(error)`` is the client-facing message."""

    status_code = 500


class ModelNotFound(RegistryError):
    status_code = 404

    def __init__(self, name: str, why: str | None = None) -> None:
        """``why``: for a stored model that could not be restored, the reason."""
        if why is None:
            super().__init__(f"model {name!r} not found")
        else:
            super().__init__(
                f"model {name!r} is stored but could not be restored ({why}); "
                f"DELETE /v1/models/{name} removes it"
            )


class ModelExists(RegistryError):
    status_code = 409


class InvalidRequest(RegistryError):
    """Bad config or bad data: wrong width, NaN/inf, labels out of range, too many rows."""

    status_code = 422


class IdempotencyKeyReused(InvalidRequest):
    """A learn request's Idempotency-Key was logged with other rows or labels: not a retry.

    Answering it as a duplicate would drop its data without a word; learning it would break
    the key's promise. So it is refused, and nothing of it is learned.
    """

    def __init__(self, key: str) -> None:
        super().__init__(
            f"Idempotency-Key {key!r} was already used for a learn request with other rows or "
            "labels, and that request was learned; nothing of this one was learned. A retry "
            "must repeat the original request exactly; send new data with a new key"
        )


class UnsupportedMediaType(RegistryError):
    """A body sent with another Content-Type than its route takes.

    Checked because a web page may send a body of ``text/plain`` or a form to any site
    without asking first (no CORS preflight), but not one of ``application/json`` or
    ``application/octet-stream``: so no page a user visits can create, train or replace the
    models of a server that user's browser can reach.
    """

    status_code = 415


class Unavailable(RegistryError):
    """Not restored yet, or the snapshot store or the write-ahead log cannot be reached."""

    status_code = 503


class LimitExceeded(RegistryError):
    """Creating the model would pass GLN_MAX_MODELS or GLN_MAX_TOTAL_MODEL_BYTES."""

    status_code = 409


class RequestWithdrawn(asyncio.CancelledError):
    """A request taken back from its model's queue, not carried out, because a shutdown
    stopped waiting for it (``service.api.shutdown_answer`` says so to its client)."""


SHOWN_CHARS = 40  # of a client's string quoted in an error


def shown(value: Any) -> str:
    """A client's value as a short piece of an error: strings cut, containers by their kind
    (either may be megabytes), the rest as JSON writes it."""
    if isinstance(value, str):
        if len(value) > SHOWN_CHARS:
            return f"{value[:SHOWN_CHARS]!r}... ({len(value)} characters)"
        return repr(value)
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int) and value.bit_length() > 64:
        return "a very large integer"
    if isinstance(value, int | float):
        return repr(value)
    return "a list" if isinstance(value, list) else "an object"
