"""The KServe V2 (Open Inference Protocol) face for predictions, so that a KServe or Triton
client can call a model: server and model health and metadata, and ``POST
/v2/models/{name}/infer`` with JSON tensors or the binary tensor extension.

A model takes one input, ``features`` (rows x num_features; any number type, row-major) and
gives one output, ``probabilities`` (rows x num_classes, FP64). Errors are the protocol's
``{"error": "..."}`` with the service's status codes. Learning stays on ``/v1``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from service.errors import RegistryError
from service.metrics import package_version

router = APIRouter(tags=["kserve-v2"])

# The protocol's tensor types and NumPy's: inputs may be any number type, the output is FP64.
_DTYPES = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
           "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
           "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64}
INPUT, OUTPUT = "features", "probabilities"
HEADER_LENGTH = "inference-header-content-length"  # the binary tensor extension's header


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the protocol's error answers, ``{"error": "..."}``."""
    schema = {"type": "object", "properties": {"error": {"type": "string"}}}
    return {code: {"description": "Error", "content": {"application/json": {"schema": schema}}}
            for code in codes}


class _BadRequest(ValueError):
    """A request the protocol's rules refuse (400)."""


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


@router.get("/v2/health/live")
async def live() -> dict[str, bool]:
    """The process answers."""
    return {"live": True}


@router.get("/v2/health/ready", responses=_errors(503))
async def ready(request: Request) -> Response:
    """200 once the engine has restored the stored models and can serve, else 503."""
    try:
        await request.app.state.engine.readiness()
    except RegistryError:
        return JSONResponse({"ready": False}, status_code=503)
    return JSONResponse({"ready": True})


@router.get("/v2")
async def server_metadata() -> dict[str, Any]:
    return {"name": "gln-service", "version": package_version(),
            "extensions": ["binary_tensor_data"]}


async def _info(request: Request, name: str) -> dict[str, Any] | JSONResponse:
    try:
        return await request.app.state.engine.info(name)
    except RegistryError as exc:
        return _error(exc.status_code, str(exc))


@router.get("/v2/models/{name}", responses=_errors(401, 404, 503))
async def model_metadata(name: str, request: Request) -> Any:
    """The model's one input and one output, with their shapes."""
    info = await _info(request, name)
    if isinstance(info, JSONResponse):
        return info
    config = info["config"]
    return {
        "name": name, "versions": ["1"], "platform": "gln",
        "inputs": [{"name": INPUT, "datatype": "FP32", "shape": [-1, config["num_features"]]}],
        "outputs": [{"name": OUTPUT, "datatype": "FP64",
                     "shape": [-1, config["num_classes"]]}],
    }


@router.get("/v2/models/{name}/ready", responses=_errors(401, 404, 503))
async def model_ready(name: str, request: Request) -> Response:
    info = await _info(request, name)
    if isinstance(info, JSONResponse):
        return info
    return JSONResponse({"name": name, "ready": True})


@router.post("/v2/models/{name}/infer", responses=_errors(400, 401, 404, 413, 422, 503))
@router.post("/v2/models/{name}/versions/{version}/infer",
             responses=_errors(400, 401, 404, 413, 422, 503))
async def infer(name: str, request: Request, version: str | None = None) -> Response:
    """Class probabilities of the ``features`` tensor's rows; the model does not learn."""
    body = await request.body()
    try:
        header, rows = _read_request(body, request.headers.get(HEADER_LENGTH))
        prediction = await request.app.state.engine.predict(name, rows)
    except _BadRequest as exc:
        return _error(400, str(exc))
    except RegistryError as exc:
        return _error(exc.status_code, str(exc))
    return _answer(name, header, np.asarray(prediction["probabilities"], dtype=np.float64))


def _read_request(body: bytes, header_length: str | None) -> tuple[dict[str, Any], np.ndarray]:
    """The request's JSON part and its ``features`` rows as an (n, d) array."""
    try:
        split = len(body) if header_length is None else int(header_length)
        if not 0 <= split <= len(body):
            raise ValueError(f"{HEADER_LENGTH} {split} is past the body's {len(body)} bytes")
        header = json.loads(body[:split])
        inputs = header["inputs"]
        if not isinstance(inputs, list) or len(inputs) != 1 or inputs[0].get("name") != INPUT:
            raise ValueError(f"give one input, named {INPUT!r}")
        tensor = inputs[0]
        dtype = _DTYPES[tensor["datatype"]]
        shape = [int(side) for side in tensor["shape"]]
        if len(shape) != 2 or min(shape) < 0:
            raise ValueError(f"{INPUT} must have the shape [rows, num_features], got {shape}")
        size = (tensor.get("parameters") or {}).get("binary_data_size")
        if size is not None:  # the binary tensor extension: raw bytes after the JSON
            raw = body[split:split + int(size)]
            rows = np.frombuffer(raw, dtype=dtype)
        else:
            rows = np.asarray(tensor["data"], dtype=dtype).ravel()
        if rows.size != shape[0] * shape[1]:
            raise ValueError(f"{INPUT} holds {rows.size} values, its shape {shape} says "
                             f"{shape[0] * shape[1]}")
        return header, rows.reshape(shape)
    except (ValueError, TypeError, KeyError, json.JSONDecodeError) as exc:
        raise _BadRequest(f"invalid inference request: {exc}") from None


def _answer(name: str, header: dict[str, Any], probabilities: np.ndarray) -> Response:
    """The protocol's answer: JSON data, or (where the request asked for the output in binary)
    the JSON part, then the raw bytes, with the extension's header."""
    wanted = {output.get("name"): output for output in header.get("outputs") or ()}
    binary = ((wanted.get(OUTPUT) or {}).get("parameters") or {}).get("binary_data", False)
    output: dict[str, Any] = {"name": OUTPUT, "datatype": "FP64",
                              "shape": list(probabilities.shape)}
    answer: dict[str, Any] = {"model_name": name, "outputs": [output]}
    if "id" in header:
        answer["id"] = header["id"]
    if not binary:
        output["data"] = probabilities.ravel().tolist()
        return JSONResponse(answer)
    raw = np.ascontiguousarray(probabilities, dtype="<f8").tobytes()
    output["parameters"] = {"binary_data_size": len(raw)}
    encoded = json.dumps(answer).encode()
    return Response(encoded + raw, media_type="application/octet-stream",
                    headers={HEADER_LENGTH: str(len(encoded))})
