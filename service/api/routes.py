"""HTTP handlers: validate the body (pydantic), hand the work to the engine, shape the answer.

Handlers stay thin on purpose: everything that touches a model (checks against its width and
classes, the learn queue, locking, snapshots) is the engine's, reached through
:class:`service.engine.client.EngineClient`, whose errors (:mod:`service.errors`) carry their
own status codes (mapped to ``{"detail": ...}`` bodies in :mod:`service.api.error_handlers`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import numpy as np
from fastapi import APIRouter, Depends, HTTPException, Path, Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.types import Receive, Scope, Send

from service.api.npz import NPZ, read_npz, write_npz
from service.api.schemas import (
    NAME_DESCRIPTION,
    CreateModelRequest,
    Detail,
    ExplainResponse,
    FeaturesRequest,
    LabelsRequest,
    LabelsResponse,
    LearnRequest,
    LearnResponse,
    ModelInfo,
    ModelName,
    PredictRequest,
    PredictResponse,
    Readiness,
    SnapshotOut,
    Status,
    array_body,
    learn_answer,
    readable_errors,
)
from service.engine.client import EngineClient
from service.errors import UnsupportedMediaType
from service.storage.wal import check_idempotency_key

router = APIRouter()


# -- dependencies ---------------------------------------------------------------------------------
def engine_of(request: Request) -> EngineClient:
    """The app's engine (started by the lifespan); 503 if the app has not started."""
    engine: EngineClient | None = getattr(request.app.state, "engine", None)
    if engine is None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "service is starting",
                            headers={"retry-after": "1"})
    return engine


async def get_engine(request: Request) -> EngineClient:
    """:func:`engine_of` as a dependency, for the routes that are not :class:`DataRoute`.

    ``async`` although it awaits nothing: FastAPI runs plain ``def`` dependencies in a thread
    pool, a needless thread hop on every request.
    """
    return engine_of(request)


Engine = Annotated[EngineClient, Depends(get_engine)]

# Mutating routes (POST, DELETE) need the bearer token when GLN_API_TOKEN is set. The check
# itself is a middleware (service.api.auth.BearerAuthMiddleware): it covers every such route, and
# costs far less per request than a FastAPI dependency. This only documents it in OpenAPI.
BEARER = {"security": [{"bearerAuth": []}]}


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for error answers, which all have a ``{"detail": ...}`` body."""
    return {code: {"model": Detail} for code in codes}


# -- data bodies ----------------------------------------------------------------------------------
# The data routes parse their own bodies instead of declaring a pydantic parameter: pydantic's
# Rust JSON parser validates straight from the bytes (several times faster than json.loads
# followed by validation), and a large body is parsed in a thread instead of stalling every
# other request on the event loop. Large answers are encoded in a thread for the same reason.
# OpenAPI still shows the schemas: the request body via openapi_extra, the answer via
# response_model (which FastAPI does not apply to a returned Response).
OFFLOAD_BYTES = 64 * 1024  # bodies larger than this are parsed in a thread
OFFLOAD_VALUES = 20_000  # answers with more numbers than this are encoded in a thread
_ANY = TypeAdapter(Any)
Body = TypeVar("Body", bound=BaseModel)


def _json_body(model: type[BaseModel]) -> dict[str, Any]:
    """openapi_extra for a route whose JSON body is ``model`` (and that needs the token)."""
    return {
        **BEARER,
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        },
    }


async def parse_body(request: Request, model: type[Body]) -> Body:
    """The request's JSON body validated as ``model``; 422 (RequestValidationError) if not,
    its errors as :func:`~service.api.schemas.readable_errors` words them.

    NaN and Infinity tokens parse as floats on purpose: the model check rejects them with a
    clear message, rather than a generic JSON error.
    """
    require_content_type(request, JSON)
    return await _validated_json(request, model)


async def _validated_json(request: Request, model: type[Body]) -> Body:
    """:func:`parse_body` once the Content-Type is known to be JSON."""
    raw = await request.body()
    try:
        if len(raw) > OFFLOAD_BYTES:
            return await asyncio.to_thread(model.model_validate_json, raw)
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise RequestValidationError(readable_errors(exc.errors(include_url=False))) from None


JSON, OCTETS = "application/json", "application/octet-stream"


def _header(request: Request, name: bytes) -> str:
    """A request header's value, lower case ('' if absent); not request.headers, which is
    built per request."""
    for key, value in request.scope["headers"]:
        if key == name:
            return value.decode("latin-1").lower()
    return ""


def media_type(request: Request) -> str:
    """The body's declared media type, without parameters."""
    return _header(request, b"content-type").partition(";")[0].strip()


def require_content_type(request: Request, expected: str, *also: str) -> str:
    """415 unless the request's body is declared as ``expected`` or one of ``also`` (JSON:
    also any ``application/...+json``); see ``service.errors.UnsupportedMediaType`` for why.
    Returns the media type sent."""
    media = media_type(request)
    if media == expected or media in also or (
            expected == JSON and media.startswith("application/") and media.endswith("+json")):
        return media
    wanted = " or ".join(f"'Content-Type: {m}'" for m in (expected, *also))
    raise UnsupportedMediaType(f"send the body with {wanted}, got "
                               f"{media or 'no Content-Type'!r}")


async def parse_data_body(request: Request, model: type[Body]) -> Any:
    """A data route's body: JSON validated as ``model`` (:func:`parse_body`), or an ``.npz``
    archive of the same fields as arrays (:mod:`service.api.npz`); 422 if it is neither."""
    if require_content_type(request, JSON, NPZ) != NPZ:
        return await _validated_json(request, model)  # its type is checked just now
    raw = await request.body()
    limit = request.app.state.settings.max_body_bytes
    try:
        if len(raw) > OFFLOAD_BYTES:
            return await asyncio.to_thread(array_body, model, read_npz(raw, limit))
        return array_body(model, read_npz(raw, limit))
    except ValueError as exc:
        raise RequestValidationError([{"loc": ("body",), "msg": str(exc),
                                       "type": "value_error"}]) from None


def wants_npz(request: Request) -> bool:
    """Whether the client asked for ``.npz`` answers (``Accept: application/x-npz``)."""
    return NPZ in _header(request, b"accept")


async def answer(request: Request, payload: dict[str, Any]) -> Response:
    """``payload`` as the client asked: an ``.npz`` archive, else JSON."""
    if wants_npz(request):
        return Response(await asyncio.to_thread(write_npz, payload), media_type=NPZ)
    return await json_response(payload)


def _dump(payload: dict[str, Any]) -> bytes:
    plain = {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in payload.items()}
    return _ANY.dump_json(plain)


async def json_response(payload: dict[str, Any]) -> Response:
    """``payload`` (NumPy arrays allowed) as a JSON response; big ones encoded in a thread."""
    size = sum(v.size for v in payload.values() if isinstance(v, np.ndarray))
    content = await asyncio.to_thread(_dump, payload) if size > OFFLOAD_VALUES else _dump(payload)
    return Response(content, media_type="application/json")


# -- data (first: routes are matched in order, and these are the hot ones) ------------------------
class DataRoute(APIRoute):
    """A route whose endpoint is called with the request and its path parameters, as they are.

    FastAPI's own handler solves the endpoint's dependencies and validates its declared
    parameters on every request, which was about a fifth of the server's time for a
    single-example learn. The data routes need none of it: their only path parameter is the
    model name (a string, so nothing to validate), they parse and validate their bodies
    themselves (:func:`parse_body`), and they take the engine with :func:`engine_of`.
    Nor do they need what FastAPI wraps each route's handler in: two exit stacks for
    dependencies with ``yield``, and exception handling of its own (the app's
    ``ExceptionMiddleware``, around the router, answers an exception with the same handlers).
    Everything around the route is unchanged (middlewares, routing, exception handlers), and
    the endpoint's signature still documents the route in OpenAPI.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        handler = self.get_route_handler()

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            response = await handler(Request(scope, receive, send))
            await response(scope, receive, send)

        self.app = app

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        endpoint = self.endpoint

        async def handler(request: Request) -> Response:
            response: Response = await endpoint(request=request, **request.path_params)
            return response

        return handler


def _data_route(
    path: str, response_model: type[BaseModel], body: type[BaseModel],
    parameters: list[dict[str, Any]] | None = None, errors: tuple[int, ...] = (),
) -> Any:
    """Decorator: ``POST path`` as a :class:`DataRoute` taking a JSON ``body``.

    ``parameters`` documents header parameters the endpoint reads itself.
    """
    extra = _json_body(body)
    extra["requestBody"]["content"][NPZ] = {"schema": {
        "type": "string", "format": "binary",
        "description": f"NumPy .npz (numpy.savez) of the arrays {', '.join(body.model_fields)}"
                       ", as the JSON body's fields; answered as .npz with Accept: " + NPZ,
    }}
    if parameters:
        extra["parameters"] = parameters

    def decorator(endpoint: Callable[..., Awaitable[Response]]) -> Any:
        router.add_api_route(
            path, endpoint, methods=["POST"], response_model=response_model,
            openapi_extra=extra, responses=_errors(401, 404, 413, 415, 422, *errors),
            tags=["data"], route_class_override=DataRoute,
        )
        return endpoint

    return decorator


IDEMPOTENCY_HEADER = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "pattern": "^[\\x21-\\x7e]{1,200}$"},
    "description": "Names this request (1-200 visible ASCII characters): a retry with the "
    "same key and the same rows and labels is answered as a duplicate and not learned twice "
    "(remembered for GLN_IDEMPOTENCY_TTL_S); the key sent again with other rows or labels is "
    "refused with 422.",
}


def idempotency_key(request: Request) -> str | None:
    """The request's Idempotency-Key header, checked; 422 if malformed or sent more than once
    (which of two keys the client meant, no server can tell)."""
    keys = request.headers.getlist("idempotency-key")
    if not keys:
        return None
    try:
        if len(keys) > 1:
            raise ValueError(f"send one Idempotency-Key header, got {len(keys)}")
        return check_idempotency_key(keys[0])
    except ValueError as exc:
        raise RequestValidationError([{
            "loc": ("header", "Idempotency-Key"), "msg": str(exc), "type": "value_error",
        }]) from None


@_data_route("/v1/models/{name}/learn", LearnResponse, LearnRequest,
             parameters=[IDEMPOTENCY_HEADER], errors=(503,))
async def learn(name: str, request: Request) -> Response:
    """Learn the rows in order; each row is first predicted (prequential), then learned.

    The rows are in the write-ahead log before the answer is sent. A retry carrying the same
    Idempotency-Key is not learned again (``duplicate``: true); a used key sent with other rows
    or labels is refused (422) and nothing of that request is learned.
    """
    engine = engine_of(request)
    key = idempotency_key(request)
    body = await parse_data_body(request, LearnRequest)
    result = await engine.learn(name, body.features, body.labels, key)
    return await answer(request, learn_answer(result))


@_data_route("/v1/models/{name}/predict", PredictResponse, PredictRequest, errors=(409, 503))
async def predict(name: str, request: Request) -> Response:
    """Class probabilities of each row; the model does not learn.

    Rows given ids wait for their labels (``POST /v1/models/{name}/labels``): 409 if the
    server's memory budget has no room for the model's waiting rows, 503 if the rows could not
    be logged (nothing waits then).
    """
    engine = engine_of(request)
    body = await parse_data_body(request, PredictRequest)
    return await answer(request, await engine.predict(name, body.features, body.ids))


@_data_route("/v1/models/{name}/labels", LabelsResponse, LabelsRequest, errors=(503,))
async def labels(name: str, request: Request) -> Response:
    """Learn rows predicted earlier with ids, now that their labels are known.

    The online metrics score the prediction made at predict time. Ids that are unknown, or
    whose wait expired (GLN_LABEL_TTL_S), get a 404 entry in ``results``; the others learn.
    """
    engine = engine_of(request)
    body = await parse_data_body(request, LabelsRequest)
    result, missing = await engine.labels(name, body.ids, body.labels)
    not_found = set(missing)
    if wants_npz(request):  # the results as two arrays: each id's status
        return await answer(request, {
            "learned": 0 if result is None else result.rows,
            "sequence": None if result is None else result.sequence,
            "log_id": None if result is None else result.log_id,
            "ids": np.asarray(body.ids, dtype=str),
            "status": np.array([404 if i in not_found else 200 for i in body.ids]),
        })
    return await json_response({
        "learned": 0 if result is None else result.rows,
        "sequence": None if result is None else result.sequence,
        "log_id": None if result is None else result.log_id,
        "results": [
            {"id": i, "status": 404,
             "detail": "unknown id, or its wait for a label expired (GLN_LABEL_TTL_S)"}
            if i in not_found else {"id": i, "status": 200, "detail": None}
            for i in body.ids
        ],
    })


@_data_route("/v1/models/{name}/explain", ExplainResponse, FeaturesRequest)
async def explain(name: str, request: Request) -> Response:
    """Per-class saliency of each row: (rows, classes, features)."""
    engine = engine_of(request)
    body = await parse_data_body(request, FeaturesRequest)
    return await answer(request, {"saliency": await engine.explain(name, body.features)})


@router.post(
    "/v1/models/{name}/snapshot", response_model=SnapshotOut, openapi_extra=BEARER,
    responses=_errors(401, 404, 503), tags=["models"],
)
async def snapshot(name: str, engine: Engine) -> dict[str, Any]:
    """Write a snapshot now if the model changed since its last one; the latest snapshot's
    version either way."""
    return await engine.snapshot(name)


# -- models -------------------------------------------------------------------------------------
MODEL_BYTES = {"type": "string", "format": "binary"}  # a GLN.to_bytes() blob


@router.post(
    "/v1/models", status_code=status.HTTP_201_CREATED, response_model=ModelInfo,
    openapi_extra=_json_body(CreateModelRequest),
    responses=_errors(401, 409, 413, 415, 422, 503),
    tags=["models"],
)
async def create_model(request: Request, engine: Engine) -> dict[str, Any]:
    """Create a model from a GLN config; it is snapshotted at once (version 1)."""
    body = await parse_body(request, CreateModelRequest)
    return await engine.create(body.name, body.config, body.replace_unrestored)


@router.get(
    "/v1/models/{name}/export", response_class=Response, openapi_extra=BEARER,
    responses={
        200: {"description": "The model's bytes (GLN.to_bytes): weights, hyperplanes, input "
              "statistics and examples_seen.",
              "content": {"application/octet-stream": {"schema": MODEL_BYTES}}},
        **_errors(401, 404),
    },
    tags=["models"],
)
async def export_model(name: str, engine: Engine) -> Response:
    """The model as bytes, with every learn request answered before this one.

    Load it with ``GLN.from_bytes`` (CPU or GPU), or serve it on any server with
    ``POST /v1/models/{name}/import``. Rows waiting for labels are not part of it. Needs the
    token when GLN_API_TOKEN is set, as predict does: the bytes answer any prediction.
    """
    blob = await engine.export(name)
    return Response(blob, media_type="application/octet-stream",
                    headers={"content-disposition": f'attachment; filename="{name}.gln"'})


@router.post(
    "/v1/models/{name}/import", status_code=status.HTTP_201_CREATED, response_model=ModelInfo,
    openapi_extra={**BEARER, "requestBody": {
        "required": True, "content": {"application/octet-stream": {"schema": MODEL_BYTES}},
    }},
    responses=_errors(401, 409, 413, 415, 422, 503), tags=["models"],
)
async def import_model(
    name: Annotated[ModelName, Path(description=NAME_DESCRIPTION)],
    request: Request,
    engine: Engine,
) -> dict[str, Any]:
    """Serve a model from bytes (an export, or ``GLN.to_bytes()`` of a model trained with the
    library) under a new name; it is snapshotted at once (version 1).

    The model keeps its weights, input statistics and examples_seen, and learns on from
    there; its online metrics start afresh. The body may be as large as the model limit
    (GLN_MAX_MODEL_BYTES), beyond GLN_MAX_BODY_BYTES. 422 for bytes that are not a GLN
    model, 409 for a name in use.
    """
    require_content_type(request, OCTETS)
    return await engine.import_model(name, await request.body())


@router.get("/v1/models", response_model=list[ModelInfo], responses=_errors(503),
            tags=["models"])
async def list_models(engine: Engine) -> list[dict[str, Any]]:
    """Every model, by name (503 while the stored models are still being restored)."""
    return await engine.list_models()


@router.get(
    "/v1/models/{name}", response_model=ModelInfo, responses=_errors(404), tags=["models"]
)
async def get_model(name: str, engine: Engine) -> dict[str, Any]:
    """Config, examples seen, online (prequential) metrics and the latest snapshot."""
    return await engine.info(name)


@router.delete(
    "/v1/models/{name}", status_code=status.HTTP_204_NO_CONTENT, openapi_extra=BEARER,
    responses=_errors(401, 404, 503), tags=["models"],
)
async def delete_model(name: str, engine: Engine) -> Response:
    """Forget the model and remove its snapshots (queued learn requests finish first)."""
    await engine.delete(name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


# -- operations ---------------------------------------------------------------------------------
@router.get("/healthz", response_model=Status, tags=["operations"])
async def healthz() -> dict[str, str]:
    """The process is alive and answering."""
    return {"status": "ok"}


@router.get(
    "/readyz", response_model=Readiness, responses=_errors(503), tags=["operations"]
)
async def readyz(engine: Engine) -> Any:
    """503 while the stored models are being restored; then 200, ``ready`` or ``degraded``.

    Degraded names what this process cannot do now: a snapshot store or log that does not
    answer (learning and snapshots fail; predictions go on), a log whose latest answer fell
    short of the configured durability (learning is refused until it gives it), stored models
    that could not be restored (the others are served). Only this process holds its models,
    so a load balancer that took it out for those would stop every model's predictions as
    well; they are exported (``gln_store_up``, ``gln_models_unrestored``,
    ``gln_wal_append_errors_total``) and alerted on instead.
    """
    problems = await engine.readiness()
    return {"status": "degraded" if problems else "ready", "problems": problems}


# Load balancers often probe with HEAD: the same answers, without a body (and without a second
# OpenAPI operation).
for _probe in (healthz, readyz):
    router.add_api_route(f"/{_probe.__name__}", _probe, methods=["HEAD"], include_in_schema=False)


@router.get("/metrics", tags=["operations"], response_class=Response)
async def metrics(request: Request) -> Response:
    """Prometheus text exposition of every gln_* metric."""
    state = request.app.state
    page = state.metrics.render() if state.engine is None else await state.metrics_page(
        state.engine)
    return Response(page, media_type=state.metrics.content_type)
