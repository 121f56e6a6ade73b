"""Request and response bodies of the HTTP API (pydantic), which also make the OpenAPI page.

Shapes only: whether a row has the model's width, whether values are finite and labels are
class indices depends on the model, so ``GLN.check_input`` decides that (in the registry).
Floats accept NaN and infinity here on purpose, so such a request reaches that check and gets
its clear 422 message instead of a generic parse error.

What a client reads when a body does not have its shape is decided here too: the model name
says what a name may be (its validator), and :func:`readable_errors` rewrites the data bodies'
errors (ids, labels, a single row sent without its outer brackets). That runs only once
validation has failed, so a valid request pays nothing for it. Labels sent as whole floats
(1.0) are taken as class indices.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StringConstraints,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WithJsonSchema,
    WrapValidator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from service.engine.learn_answers import LearnResult
from service.errors import shown

# Not starting with '.': '.' and '..' mean something else in URLs and directories, and a
# server's own files in a data directory (its lock, temporary files) start with one.
NAME_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}$"
ID_PATTERN = r"^[\x21-\x7e]{1,200}$"  # visible ASCII, as idempotency keys
_ID = re.compile(ID_PATTERN)

# A row is a list of numbers, or (for a model with feature_names) an object of numbers by
# feature name. Strict: "1.5" and true are not numbers. Left to right: a list row, the common
# one, is tried first and costs what it did before names.
Row = Annotated[list[StrictFloat] | dict[str, StrictFloat], Field(union_mode="left_to_right")]
Rows = list[Row]


NAME_DESCRIPTION = "1-64 characters from A-Z a-z 0-9 _ . -, not starting with '.'"
# What NAME_PATTERN and ID_PATTERN allow, in words, for the error that names a value outside.
NAME_RULE = ("a model name is 1 to 64 ASCII letters, digits, '_', '-' or '.', not starting "
             "with '.'")
ID_RULE = "an id is 1 to 200 visible ASCII characters without spaces"
LABEL_RULE = "a label is a class index (an integer) or, for a model with class_names, a name"
ROW_RULE = ("a row is a list of numbers or, for a model with feature_names, an object of "
            "numbers by name")
SINGLE_ROW = "a list of rows, got a list of numbers (wrap a single row as [[x1, x2, ...]])"


def _named_model(value: Any, handler: ValidatorFunctionWrapHandler) -> str:
    """``handler(value)`` (the name's pattern), its error saying what a name may be.

    A Python call per name is fine here: names are validated on create and import only.
    """
    try:
        return str(handler(value))
    except ValidationError:
        raise PydanticCustomError(
            "model_name", "{rule}, got {got}", {"rule": NAME_RULE, "got": shown(value)}
        ) from None


# The name of a new model (create's body, import's path). Existing names are looked up by
# service.storage.common.is_model_name, which still serves a model named before the leading '.'
# rule.
ModelName = Annotated[str, StringConstraints(pattern=NAME_PATTERN), WrapValidator(_named_model)]


def _integral(label: float) -> int:
    """A label sent as a float (NumPy and pandas users send 1.0) as the int it stands for;
    past 2^53 a float is no longer exact, and no class index is that large."""
    if not (label.is_integer() and abs(label) < 2**53):
        raise ValueError(f"{LABEL_RULE}, got {label!r}")
    return int(label)


# An int, or a float with nothing after the point (as JSON Schema's "integer" allows), or a
# class name (checked against the model's class_names by the model). Ints take the first
# branch: the float branch's Python call is paid only by labels sent as floats.
Label = Annotated[
    StrictInt | Annotated[StrictFloat, AfterValidator(_integral)]
    | Annotated[str, StringConstraints(min_length=1, max_length=200)],
    Field(union_mode="left_to_right"),
    WithJsonSchema({"anyOf": [{"type": "integer"}, {"type": "string"}]}),
]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateModelRequest(_Body):
    """A new model: its name and the GLN constructor arguments."""

    name: ModelName = Field(examples=["fraud"], description=NAME_DESCRIPTION)
    config: dict[str, Any] = Field(
        examples=[{"num_features": 30, "num_classes": 2, "layer_sizes": [32, 32, 1],
                   "context_dim": 4, "learning_rate": 0.01}],
        description="GLN constructor arguments: num_features is required, the others have "
        "defaults (num_classes 2, layer_sizes [32, 1], context_dim 3, learning_rate min(10 / t, "
        "0.1)); the device is the "
        "server's (GLN_DEVICE).",
    )
    replace_unrestored: bool = Field(
        False,
        description="Create even where a stored model of this name could not be restored "
        "(/readyz names it): its snapshots and log are deleted first, and what they held is "
        "gone for good. Without it such a create is refused (409).",
    )


class FeaturesRequest(_Body):
    """Rows to predict or explain."""

    features: Rows = Field(
        min_length=1, examples=[[[0.1, 0.2, 0.3]]],
        description="One row per example, each num_features wide; for a model with "
        "feature_names, a row may be an object of every feature's value by name.",
    )


RowId = Annotated[str, StringConstraints(pattern=ID_PATTERN)]


class PredictRequest(FeaturesRequest):
    """Rows to predict; with ids, the rows also wait for labels that come later."""

    ids: list[RowId] | None = Field(
        None, examples=[["txn-1"]],
        description="Optional, one unique id per row (1-200 visible ASCII characters): the "
        "row and its prediction wait GLN_LABEL_TTL_S seconds for a label "
        "(POST /v1/models/{name}/labels), logged before the answer, so they survive "
        "restarts.",
    )


class LabelsRequest(_Body):
    """Labels for rows predicted earlier with ids."""

    ids: list[RowId] = Field(min_length=1, examples=[["txn-1"]],
                             description="Ids given to predict, each at most once.")
    labels: list[Label] = Field(min_length=1, examples=[[0]],
                                description="Class index for each id, in [0, num_classes) "
                                "(a whole float such as 1.0 counts as 1), or its name for a "
                                "model with class_names.")


class LabelResult(BaseModel):
    id: str
    status: int = Field(description="200: learned; 404: unknown id, or its wait expired.")
    detail: str | None = None


class LabelsResponse(BaseModel):
    learned: int = Field(description="Rows learned (the ids answered 200).")
    sequence: int | None = Field(
        description="Stream index of the first row learned; null when none was."
    )
    log_id: str | None = Field(description="Write-ahead log entry holding the rows.")
    results: list[LabelResult] = Field(description="One per id, in the order given.")


class LearnRequest(FeaturesRequest):
    """Labelled rows to learn, in order."""

    labels: list[Label] = Field(min_length=1, examples=[[1]],
                                description="Class index of each row, in [0, num_classes) "
                                "(a whole float such as 1.0 counts as 1), or its name for a "
                                "model with class_names.")


class PredictResponse(BaseModel):
    probabilities: list[list[float]] = Field(description="(rows, num_classes); each row sums to 1.")
    classes: list[int | str] = Field(
        description="The most probable class of each row: its name for a model with "
        "class_names, else its index."
    )


class LearnResponse(BaseModel):
    examples: int = Field(description="Rows in the request.")
    sequence: int | None = Field(
        description="0-based index of this request's first example in the model's stream; "
        "its rows are examples sequence .. sequence + examples - 1. Null only for a "
        "duplicate whose original answer the server no longer holds."
    )
    probabilities: list[list[float]] | None = Field(
        description="Each row as predicted before its own update (null as for sequence)."
    )
    log_loss: float | None = Field(
        description="Mean prequential log loss of these rows (nats; null as for sequence)."
    )
    duplicate: bool = Field(
        False,
        description="True when the Idempotency-Key was already learned: nothing was learned "
        "now, and the other fields repeat the original answer.",
    )
    log_id: str | None = Field(
        None, description="Write-ahead log entry holding the rows (null without a log)."
    )


class ExplainResponse(BaseModel):
    saliency: list[list[list[float]]] = Field(
        description="(rows, num_classes, num_features): how much each class's output logit "
        "for that row moves per unit of each feature as the model standardises it ((x - mean) "
        "/ std over the rows learned; with input_scaling 'unit', the logit of the clipped "
        "input). Divide by the feature's standard deviation for its change per raw unit."
    )


class WindowStats(BaseModel):
    examples: int
    log_loss: float | None = Field(description="Mean prequential log loss (nats).")
    accuracy: float | None = Field(description="Share of examples predicted right.")


class TotalStats(WindowStats):
    since: float = Field(description="Unix time counting began: creation or restore.")


class OnlineMetrics(BaseModel):
    window_size: int
    recent: WindowStats = Field(description="The last window_size learned examples.")
    total: TotalStats = Field(description="Every example learned by this process.")


class SnapshotOut(BaseModel):
    version: int = Field(description="Increases by one per snapshot of the model.")
    created_at: float = Field(description="Unix time.")
    nbytes: int
    sha256: str


class ModelInfo(BaseModel):
    name: str
    config: dict[str, Any]
    examples_seen: int = Field(description="Examples learned since creation (across restarts).")
    pending_examples: int = Field(description="Examples queued and not learned yet.")
    waiting_for_labels: int = Field(
        description="Rows predicted with ids and waiting for their labels (delayed labels)."
    )
    nbytes: int = Field(description="Bytes held by the model's arrays.")
    metrics: OnlineMetrics
    snapshot: SnapshotOut | None = Field(description="The latest snapshot, if any.")


class Detail(BaseModel):
    """Every error body."""

    detail: str


class Status(BaseModel):
    status: str


class Readiness(BaseModel):
    """``ready``, or ``degraded`` with what this process cannot do now (it serves the rest)."""

    status: Literal["ready", "degraded"]
    problems: list[str] = Field(default_factory=list)


# -- errors a client reads -------------------------------------------------------------------------
def readable_errors(errors: Sequence[ErrorDetails]) -> list[dict[str, Any]]:
    """A request body's validation errors (``include_input=True``) as a client should read them.

    Places are written as in Python (``ids[0]``, ``features[3][1]``); an id or a label that
    is not one says what one is and shows the value, as does a row that is not a list; a
    label's union branches are one error; a single row sent as ``features`` (``[0.1, ...]``
    for ``[[0.1, ...]]``) is one error, not one per number. The inputs are not kept: the
    handler never echoes a body whole.
    """
    errors = _untagged(errors)
    single_row = any(error["loc"][:2] == ("features", 0) and _is_bare_number(error)
                     for error in errors)
    readable: dict[str, dict[str, Any]] = {}  # by place: a label's branches become one
    for error in errors:
        loc, msg = error["loc"], error["msg"]
        field = loc[0] if loc else None
        if single_row and field == "features" and _is_bare_number(error):
            loc, msg = ("features",), SINGLE_ROW
        elif field == "features" and len(loc) == 2 and error["type"] == "list_type":
            msg = f"{ROW_RULE}, got {shown(error.get('input'))}"
        elif field in ("ids", "labels") and len(loc) > 1 and isinstance(loc[1], int):
            rule = ID_RULE if field == "ids" else LABEL_RULE
            loc, msg = loc[:2], f"{rule}, got {shown(error.get('input'))}"
        where = _where(loc)
        readable.setdefault(where, {"loc": (where,) if where else (), "msg": msg,
                                    "type": error["type"]})
    return list(readable.values())


def _untagged(errors: Sequence[ErrorDetails]) -> list[ErrorDetails]:
    """``errors`` without the union's branch in a row's place (``features[0]['list[float]']``
    becomes ``features[0]``), and without the other branch's "not an object" (or "not a
    list") where a row's error lies inside the branch the row took."""
    def features(error: ErrorDetails) -> bool:
        return error["loc"][:1] == ("features",) and len(error["loc"]) > 2

    inside = {error["loc"][1] for error in errors if features(error) and len(error["loc"]) > 3}
    untagged = []
    for error in errors:
        if features(error):
            loc = error["loc"]
            if len(loc) == 3 and loc[1] in inside:
                continue
            error = {**error, "loc": (*loc[:2], *loc[3:])}  # type: ignore[typeddict-item]
        untagged.append(error)
    return untagged


def _is_bare_number(error: ErrorDetails) -> bool:
    """Whether ``error`` is a number standing where a row should be (``features[i]``)."""
    value = error.get("input")
    return (len(error["loc"]) == 2 and error["type"] in ("list_type", "dict_type")
            and isinstance(value, int | float) and not isinstance(value, bool))


def _where(loc: tuple[int | str, ...]) -> str:
    """An error's place as Python writes it: ``labels[0]``, ``config.seed``."""
    parts = [f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc]
    return "".join(parts).removeprefix(".")


@dataclass(frozen=True)
class ArrayBody:
    """A data route's body sent as arrays (``application/x-npz``): the same fields as its JSON
    schema, each an array, shapes checked here and values by the model (as for JSON)."""

    features: np.ndarray | None = None  # (rows, num_features), any number type
    labels: np.ndarray | None = None  # (rows,)
    ids: list[str] | None = None


def array_body(model: type[BaseModel], arrays: dict[str, np.ndarray]) -> ArrayBody:
    """``arrays`` as ``model``'s fields; ValueError naming a missing, unknown or misshapen one."""
    fields = model.model_fields
    unknown = sorted(set(arrays) - set(fields))
    if unknown:
        raise ValueError(f"{', '.join(map(repr, unknown))} is no field of this route; "
                         f"the fields are {', '.join(sorted(fields))}")
    missing = sorted(name for name, field in fields.items()
                     if field.is_required() and name not in arrays)
    if missing:
        raise ValueError(f"the array(s) {', '.join(map(repr, missing))} are missing")
    features = arrays.get("features")
    if features is not None and (features.ndim != 2 or not len(features)):
        raise ValueError(f"features: one row per example, a 2-D array of at least one row; "
                         f"got shape {features.shape}")
    for name in ("labels", "ids"):
        if name in arrays and (arrays[name].ndim != 1 or not len(arrays[name])):
            raise ValueError(f"{name}: a 1-D array of at least one; got shape "
                             f"{arrays[name].shape}")
    ids = None
    if "ids" in arrays:
        ids = arrays["ids"].tolist()
        bad = next((i for i, row_id in enumerate(ids) if not _ID.match(row_id)), None)
        if bad is not None:
            raise ValueError(f"ids: id {bad} is not 1-200 visible ASCII characters")
    return ArrayBody(features, arrays.get("labels"), ids)


def learn_answer(result: LearnResult) -> dict[str, Any]:
    """A learn's answer (:class:`LearnResponse`'s fields), for ``/learn`` and the stream alike."""
    return {"examples": result.rows, "sequence": result.sequence,
            "probabilities": result.probabilities, "log_loss": result.mean_loss,
            "duplicate": result.duplicate, "log_id": result.log_id}
