"""What the client says to the service and how it reads the answers, without doing any I/O.

Each verb is an *exchange*: a generator that yields the steps it needs, and returns the verb's
answer. A step is a :class:`Request` (the driver answers it with an ``httpx.Response``, or the
``httpx.TransportError`` it raised), a number of seconds to wait before the next try, or, on a
learning stream, a message to send (:class:`Message`) or one to receive (:data:`RECEIVE`).
:class:`gln_client.GLNClient` drives exchanges with blocking calls and
:class:`gln_client.AsyncGLNClient` with ``await``; everything else, from the rows' encoding to
the retries and the typed errors, is written once, here.

Retries (:class:`Retry`) follow what the service promises about each request:

* reads, ``predict`` and ``explain``, ``snapshot``, ``labels`` and every ``learn`` (each with an
  ``Idempotency-Key``, the same on every try) are tried again after a connection error or
  timeout and after a 503 (or a proxy's 502 and 504), waiting the answer's ``Retry-After``
  when it has one, else backing off exponentially;
* ``create_model``, ``import_model`` and ``delete_model`` are tried again only when the
  request was never sent (the connection could not be made). After a 503 or a cut connection
  their outcome is unknown, and trying again may do what nobody asked for: a delete repeated
  after another client made a model of the same name deletes that one. ``Retry(writes=True)``
  retries them as the others, for a caller who owns its model names.
"""

from __future__ import annotations

import email.utils
import io
import itertools
import json
import random
import time
import uuid
from collections.abc import Awaitable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias, TypeVar
from urllib.parse import quote

import httpx
import numpy as np

from gln_client.errors import ConnectionFailed, GLNError, InvalidRequest, error_for
from gln_client.rows import as_ids, as_labels, as_rows, named

T = TypeVar("T")
# What a verb returns: its answer from GLNClient, an awaitable of it from AsyncGLNClient.
Answer: TypeAlias = T | Awaitable[T]

NPZ = "application/x-npz"
JSON = "application/json"
# 503 is the service's own "try again"; 502 and 504 come from a proxy in front of it (an
# ingress while the service restarts).
RETRY_STATUSES = frozenset({502, 503, 504})
# The request never left: nothing can have been done, so any request may be sent again.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


@dataclass(frozen=True)
class Retry:
    """How long a request keeps trying (``Retry(max_retries=0)``: never again).

    The n-th wait is ``backoff_s * 2**n`` (at most ``max_backoff_s``), of which a random half
    is taken off so that clients that failed together do not come back together; a 503's
    ``Retry-After`` replaces it. A try that would start after ``deadline_s`` from the first is
    not made. ``writes``: retry create, import and delete as the other requests (see above).
    """

    max_retries: int = 5
    backoff_s: float = 0.1
    max_backoff_s: float = 10.0
    deadline_s: float = 120.0
    writes: bool = False

    def wait_s(self, attempt: int, outcome: httpx.Response | Exception, safe: bool,
               elapsed_s: float) -> float | None:
        """Seconds to wait before trying again after ``outcome`` of try ``attempt`` (0-based),
        or None to give up. ``safe``: the request may be repeated whatever became of it."""
        if attempt >= self.max_retries:
            return None
        wait = None
        if isinstance(outcome, httpx.Response):
            if outcome.status_code not in RETRY_STATUSES or not (safe or self.writes):
                return None
            wait = retry_after_s(outcome.headers.get("retry-after"))
        elif not isinstance(outcome, NOT_SENT) and not (safe or self.writes):
            return None
        if wait is None:
            wait = min(self.max_backoff_s, self.backoff_s * 2**attempt) * random.uniform(0.5, 1)
        return wait if elapsed_s + wait <= self.deadline_s else None


def retry_after_s(value: str | None) -> float | None:
    """A ``Retry-After`` header's seconds (a number, or an HTTP date); None if absent or bad.

    >>> retry_after_s("2"), retry_after_s(None), retry_after_s("soon")
    (2.0, None, None)
    """
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


# -- steps ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Request:
    """One HTTP request, as the driver sends it (``path`` relative to the client's URL)."""

    method: str
    path: str
    content: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Message:
    """A learning stream's message to send: ``.npz`` bytes, or JSON text."""

    data: bytes | str


RECEIVE = "receive"  # a learning stream's next message, please
Step: TypeAlias = Request | float | Message | str
Outcome: TypeAlias = httpx.Response | Exception | bytes | str | None
Exchange: TypeAlias = Generator[Step, Outcome, T]


# -- answers --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LearnResult:
    """What ``learn`` (or a stream's batch) answers: the rows are in the service's log.

    ``probabilities`` (examples, num_classes) are each row's prediction before it was learned,
    ``log_loss`` their mean (nats), and ``sequence`` the first row's index in the model's
    stream. ``duplicate``: the Idempotency-Key was learned before, so nothing was learned now
    and the fields repeat the first answer (None when the server no longer holds it).
    """

    examples: int
    sequence: int | None
    probabilities: np.ndarray | None
    log_loss: float | None
    duplicate: bool
    log_id: str | None

    @classmethod
    def of(cls, fields: Mapping[str, Any]) -> LearnResult:
        probabilities = fields.get("probabilities")
        return cls(
            examples=int(fields["examples"]), sequence=_optional(int, fields.get("sequence")),
            probabilities=None if probabilities is None else np.asarray(probabilities),
            log_loss=_optional(float, fields.get("log_loss")),
            duplicate=bool(fields.get("duplicate", False)),
            log_id=_optional(str, fields.get("log_id")),
        )


@dataclass(frozen=True)
class LabelsResult:
    """What ``labels`` answers: ``learned`` rows (from ``sequence`` in the model's stream,
    logged as ``log_id``); ``not_waiting``: the ids given that no row waited under (unknown,
    learned already, or expired), in the order given."""

    learned: int
    sequence: int | None
    log_id: str | None
    not_waiting: list[str]

    @classmethod
    def of(cls, fields: Mapping[str, Any]) -> LabelsResult:
        if "results" in fields:  # JSON: one entry per id
            ids = [r["id"] for r in fields["results"] if r["status"] != 200]
        else:  # .npz: the ids and their statuses as two arrays
            ids = [str(i) for i, s in zip(fields["ids"], fields["status"], strict=True)
                   if s != 200]
        return cls(int(fields["learned"]), _optional(int, fields.get("sequence")),
                   _optional(str, fields.get("log_id")), ids)


def _optional(kind: type, value: Any) -> Any:
    return None if value is None else kind(value)


def decode(content: bytes | str) -> dict[str, Any]:
    """An answer's fields, from ``.npz`` (a zip archive; 0-d arrays become scalars) or JSON."""
    if isinstance(content, bytes) and content[:2] == b"PK":
        with np.load(io.BytesIO(content), allow_pickle=False) as archive:
            return {k: archive[k].item() if archive[k].ndim == 0 else archive[k]
                    for k in archive.files}
    return json.loads(content)


def encode_npz(arrays: Mapping[str, Any]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **{k: np.asarray(v) for k, v in arrays.items() if v is not None})
    return buffer.getvalue()


def encode_json(arrays: Mapping[str, Any]) -> str:
    return json.dumps({k: v.tolist() if isinstance(v, np.ndarray) else v
                       for k, v in arrays.items() if v is not None})


def stream_answer(message: bytes | str) -> LearnResult:
    """A stream's answer to a batch; its refusal as the typed error (the stream goes on)."""
    fields = decode(message)
    if "error" in fields:
        raise error_for(int(fields["error"]["status"]), str(fields["error"]["detail"]))
    return LearnResult.of(fields)


def failure(outcome: httpx.Response | Exception) -> GLNError:
    """The exception for an answer that is not a success, or for no answer."""
    if isinstance(outcome, Exception):
        error: GLNError = ConnectionFailed(f"no answer: {type(outcome).__name__}: {outcome}")
        error.__cause__ = outcome
        return error
    try:
        detail = outcome.json()["detail"]
    except (ValueError, KeyError, TypeError):
        detail = outcome.text[:500] or outcome.reason_phrase
    return error_for(outcome.status_code, detail if isinstance(detail, str) else str(detail))


# -- the verbs ------------------------------------------------------------------------------------
class Protocol:
    """The verbs as exchanges, and what they remember between calls: whether the server takes
    binary rows, and each model's feature names."""

    def __init__(self, *, binary: bool, retry: Retry,
                 feature_names: Sequence[str] | None) -> None:
        self.binary = binary
        self.retry = retry
        self.feature_names = None if feature_names is None else list(feature_names)
        self._model_features: dict[str, list[str] | None] = {}  # from the model's config

    # -- models --
    def create_model(self, name: str, config: Mapping[str, Any]) -> Exchange[dict[str, Any]]:
        self._model_features.pop(name, None)
        body = json.dumps({"name": name, "config": dict(config)}).encode()
        return (yield from self.call(Request("POST", "/v1/models", body, {"content-type": JSON}),
                                     safe=False))

    def list_models(self) -> Exchange[list[dict[str, Any]]]:
        return (yield from self.call(Request("GET", "/v1/models")))

    def model_info(self, name: str) -> Exchange[dict[str, Any]]:
        info = yield from self.call(Request("GET", model_path(name)))
        self._model_features[name] = info.get("config", {}).get("feature_names")
        return info

    def delete_model(self, name: str) -> Exchange[None]:
        self._model_features.pop(name, None)
        yield from self.call(Request("DELETE", model_path(name)), safe=False)

    def export_model(self, name: str) -> Exchange[bytes]:
        return (yield from self.call(Request("GET", model_path(name, "export")), raw=True))

    def import_model(self, name: str, blob: bytes) -> Exchange[dict[str, Any]]:
        self._model_features.pop(name, None)
        request = Request("POST", model_path(name, "import"), bytes(blob),
                          {"content-type": "application/octet-stream"})
        return (yield from self.call(request, safe=False))

    def snapshot(self, name: str) -> Exchange[dict[str, Any]]:
        return (yield from self.call(Request("POST", model_path(name, "snapshot"))))

    def health(self) -> Exchange[dict[str, Any]]:
        return (yield from self.call(Request("GET", "/healthz")))

    def ready(self) -> Exchange[dict[str, Any]]:
        """Not retried: a caller asking whether the server is ready wants the answer now."""
        return (yield from self.call(Request("GET", "/readyz"), retry=Retry(max_retries=0)))

    # -- data --
    def learn(self, name: str, rows: Any, labels: Any, key: str | None,
              feature_names: Sequence[str] | None) -> Exchange[LearnResult]:
        X = yield from self.rows(name, rows, feature_names)
        headers = {"idempotency-key": key or str(uuid.uuid4())}
        fields = yield from self.data(name, "learn", {"features": X, "labels": as_labels(labels)},
                                      headers)
        return LearnResult.of(fields)

    def predict(self, name: str, rows: Any, ids: Any, feature_names: Sequence[str] | None,
                answer: str = "probabilities") -> Exchange[np.ndarray]:
        """The prediction's ``answer``: ``probabilities``, or ``classes`` (by name where the
        model has class names)."""
        X = yield from self.rows(name, rows, feature_names)
        arrays = {"features": X, "ids": None if ids is None else np.asarray(as_ids(ids))}
        fields = yield from self.data(name, "predict", arrays)
        return np.asarray(fields[answer])

    def labels(self, name: str, ids: Any, labels: Any) -> Exchange[LabelsResult]:
        arrays = {"ids": np.asarray(as_ids(ids)), "labels": as_labels(labels)}
        return LabelsResult.of((yield from self.data(name, "labels", arrays)))

    def explain(self, name: str, rows: Any,
                feature_names: Sequence[str] | None) -> Exchange[np.ndarray]:
        X = yield from self.rows(name, rows, feature_names)
        fields = yield from self.data(name, "explain", {"features": X})
        return np.asarray(fields["saliency"])

    # -- a learning stream --
    def stream_batch(self, name: str, rows: Any, labels: Any, key: str | None,
                     feature_names: Sequence[str] | None) -> Exchange[dict[str, Any]]:
        """A stream's batch: its arrays and its key (a new one unless given), which is what
        sending it again on another stream takes."""
        return {"features": (yield from self.rows(name, rows, feature_names)),
                "labels": as_labels(labels), "key": key or str(uuid.uuid4())}

    def message(self, batch: Mapping[str, Any]) -> Message:
        return Message(encode_npz(batch) if self.binary else encode_json(batch))

    # -- parts --
    def rows(self, name: str, rows: Any, feature_names: Sequence[str] | None) -> Exchange[
            np.ndarray]:
        """``rows`` as an array; dicts and DataFrames in the order of ``feature_names``, else
        of the model's config's, else of the client's."""
        if feature_names is None and named(rows):
            if name not in self._model_features:
                yield from self.model_info(name)
            feature_names = self._model_features[name] or self.feature_names
        return as_rows(rows, feature_names)

    def data(self, name: str, verb: str, arrays: dict[str, Any],
             headers: Mapping[str, str] | None = None) -> Exchange[dict[str, Any]]:
        """POST ``arrays`` to a data route, as ``.npz`` or JSON; the answer's fields.

        A server that refuses ``.npz`` bodies (415: one from before binary rows) is sent JSON
        from then on.
        """
        while True:
            binary = self.binary
            request = Request("POST", model_path(name, verb),
                              encode_npz(arrays) if binary else encode_json(arrays).encode(),
                              {"content-type": NPZ if binary else JSON,
                               "accept": NPZ if binary else JSON, **(headers or {})})
            try:
                return (yield from self.call(request))
            except InvalidRequest as error:
                if not (binary and error.status == 415):
                    raise
                self.binary = False

    def call(self, request: Request, *, safe: bool = True, raw: bool = False,
             retry: Retry | None = None) -> Exchange[Any]:
        """Send ``request`` until it succeeds or the retries run out; its decoded answer
        (``raw``: its bytes; None for a 204). ``safe``: it may be repeated whatever became of
        an earlier try."""
        retry = retry or self.retry
        start = time.monotonic()
        for attempt in itertools.count():
            outcome = yield request
            assert isinstance(outcome, httpx.Response | Exception)
            if isinstance(outcome, httpx.Response) and outcome.is_success:
                if raw:
                    return outcome.content
                return decode(outcome.content) if outcome.content else None
            wait = retry.wait_s(attempt, outcome, safe, time.monotonic() - start)
            if wait is None:
                raise failure(outcome)
            yield wait
        raise AssertionError("unreachable")


def model_path(name: str, verb: str | None = None) -> str:
    """A model's URL path; the name is quoted, so no name can reach another route."""
    path = f"/v1/models/{quote(name, safe='')}"
    return path if verb is None else f"{path}/{verb}"
