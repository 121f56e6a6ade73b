"""A learning stream: one WebSocket on which a client sends batches of labelled rows and reads
back, in order, each batch's answer (``/v1/models/{name}/stream``).

Each message is one batch: an ``.npz`` archive of ``features`` and ``labels`` (a binary
message, answered in ``.npz``), or the JSON body of ``POST .../learn`` (a text message,
answered in JSON). A batch may carry an idempotency key (``key``: a 0-d text array, or a JSON
field), as the header does for ``learn``. Each answer is ``learn``'s: the rows' probabilities
before each one was learned, their mean log loss, their sequence; it is sent once the batch
is in the write-ahead log, so an answer is the acknowledgement. A batch the server refuses is
answered ``{"error": {"status": ..., "detail": ...}}`` and learns nothing; the stream goes on.

Backpressure: at most ``GLN_STREAM_MAX_IN_FLIGHT`` batches are read ahead of their answers;
then the server stops reading and the client's sends wait (TCP's flow control). Batches are
learned in the order sent. A connection that drops leaves its unanswered batches' outcome
unknown, as for any request: send them again with their keys.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from service.api.error_handlers import shortened, validation_detail
from service.api.npz import read_npz, write_npz
from service.api.schemas import LearnRequest, array_body, learn_answer, readable_errors
from service.engine.client import EngineClient
from service.engine.learn_answers import LearnResult
from service.errors import RegistryError
from service.storage.wal import check_idempotency_key

router = APIRouter()


class _StreamBatch(LearnRequest):
    """A stream's batch as JSON: learn's body, and its idempotency key."""

    key: str | None = None


@router.websocket("/v1/models/{name}/stream")
async def stream(websocket: WebSocket, name: str) -> None:
    """Learn batches in the order sent; answer each, in order, once it is logged."""
    engine: EngineClient | None = websocket.app.state.engine
    if engine is None:
        await websocket.close(code=1013, reason="service is starting")
        return
    settings = websocket.app.state.settings
    await websocket.accept()
    in_flight = asyncio.Semaphore(settings.stream_max_in_flight)
    answers: asyncio.Queue[tuple[asyncio.Task[LearnResult] | Exception, bool] | None] = (
        asyncio.Queue())
    sender = asyncio.create_task(_send_answers(websocket, answers, in_flight))
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            await in_flight.acquire()
            binary = message.get("bytes") is not None
            try:
                features, labels, key = _batch(message, settings.max_body_bytes)
            except (ValueError, RequestValidationError) as exc:
                answers.put_nowait((exc, binary))
                continue
            # A task per batch, started in the order read: each is checked and queued on the
            # model's writer before the next (the engine admits a model's requests in order).
            learning = asyncio.create_task(engine.learn(name, features, labels, key))
            answers.put_nowait((learning, binary))
    except WebSocketDisconnect:
        pass
    finally:
        answers.put_nowait(None)
        await asyncio.gather(sender, return_exceptions=True)


def _batch(message: dict[str, Any], max_bytes: int) -> tuple[Any, Any, str | None]:
    """A message's rows, labels and key; ValueError or RequestValidationError if malformed."""
    if message.get("bytes") is not None:
        arrays = read_npz(message["bytes"], max_bytes)
        key_array = arrays.pop("key", None)
        body = array_body(LearnRequest, arrays)
        key = None if key_array is None else str(key_array.reshape(()).item())
        return body.features, body.labels, None if key is None else check_idempotency_key(key)
    try:
        batch = _StreamBatch.model_validate_json(message.get("text") or "")
    except ValidationError as exc:
        raise RequestValidationError(readable_errors(exc.errors(include_url=False))) from None
    key = None if batch.key is None else check_idempotency_key(batch.key)
    return batch.features, batch.labels, key


async def _send_answers(
    websocket: WebSocket,
    answers: asyncio.Queue[tuple[asyncio.Task[LearnResult] | Exception, bool] | None],
    in_flight: asyncio.Semaphore,
) -> None:
    """Answer each batch in the order read, as its learning ends."""
    while (item := await answers.get()) is not None:
        outcome, binary = item
        try:
            payload = _answer(await outcome if isinstance(outcome, asyncio.Task) else outcome)
        except Exception as exc:
            payload = _answer(exc)
        finally:
            in_flight.release()
        try:
            if binary:
                await websocket.send_bytes(write_npz(payload) if "error" not in payload
                                           else json.dumps(payload).encode())
            else:
                await websocket.send_text(json.dumps(payload, default=_plain))
        except (WebSocketDisconnect, RuntimeError):
            return  # the client went: what is still learning goes on, unanswered


def _answer(outcome: LearnResult | Exception) -> dict[str, Any]:
    """A batch's answer: learn's, or its error in the words an HTTP request would get."""
    if isinstance(outcome, LearnResult):
        return learn_answer(outcome)
    if isinstance(outcome, RegistryError):
        return {"error": {"status": outcome.status_code, "detail": shortened(str(outcome))}}
    if isinstance(outcome, RequestValidationError):
        return {"error": {"status": 422, "detail": validation_detail(outcome)}}
    if isinstance(outcome, ValueError):
        return {"error": {"status": 422, "detail": shortened(str(outcome))}}
    return {"error": {"status": 500, "detail": f"internal error ({type(outcome).__name__})"}}


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON")
