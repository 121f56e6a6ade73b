"""The client against a real server: every verb, rows of every kind, both transports, the
retries and their idempotency keys, the typed errors and the learning stream, for the blocking
and the async client alike (``connect`` is parametrized; see conftest.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gln_client import (
    Conflict,
    ConnectionFailed,
    InvalidRequest,
    ModelNotFound,
    PayloadTooLarge,
    Retry,
    Unauthorized,
    Unavailable,
)
from tests.client.conftest import TOKEN, Fault, FlakyProxy
from tests.service.durable_client import REPO
from tests.support.redis_process import free_port

pytestmark = pytest.mark.slow  # a server process per module

CONFIG: dict[str, Any] = {"num_features": 3, "num_classes": 2, "layer_sizes": [8, 1],
                          "context_dim": 2, "seed": 0}
FEATURES = ["a", "b", "c"]
FAST = Retry(max_retries=3, backoff_s=0.01)  # quick retries, where a test provokes them


def _data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    X = np.random.default_rng(seed).normal(size=(n, 3))
    return X, (X[:, 0] + X[:, 1] > 0).astype(np.int64)


def test_every_verb_round_trip(connect: Any, name: str) -> None:
    client = connect()
    info = client.create_model(name, CONFIG)
    assert info["name"] == name and info["examples_seen"] == 0
    assert name in [m["name"] for m in client.list_models()]

    X, y = _data(40)
    first = client.learn(name, X[:20], y[:20])
    assert (first.examples, first.sequence, first.duplicate) == (20, 0, False)
    assert first.probabilities.shape == (20, 2) and first.log_loss > 0 and first.log_id
    # dict rows (keys in any order, extra keys left out) and a DataFrame, by feature name
    rows = [{"c": c, "label": int(t), "a": a, "b": b} for (a, b, c), t in zip(X[20:30], y[20:30],
                                                                                strict=True)]
    assert client.learn(name, rows, y[20:30], feature_names=FEATURES).sequence == 20
    frame = pd.DataFrame(X[30:], columns=FEATURES).assign(label=y[30:])
    assert client.learn(name, frame[["c", "b", "a"]], frame["label"],
                        feature_names=FEATURES).sequence == 30
    assert client.model_info(name)["examples_seen"] == 40

    probabilities = client.predict(name, X[:5])
    assert probabilities.shape == (5, 2)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1)
    np.testing.assert_array_equal(
        client.predict(name, pd.DataFrame(X[:5], columns=FEATURES), feature_names=FEATURES),
        probabilities)
    np.testing.assert_array_equal(client.predict(name, X[0]), probabilities[:1])  # one row
    assert client.explain(name, X[:2]).shape == (2, 2, 3)

    # delayed labels: predict with ids, then the labels
    client.predict(name, X[:2], ids=["p-1", "p-2"])
    result = client.labels(name, ["p-2", "p-9"], [1, 0])
    assert (result.learned, result.sequence, result.not_waiting) == (1, 40, ["p-9"])

    assert client.snapshot(name)["version"] >= 1
    copy = f"{name}-copy"
    client.import_model(copy, client.export_model(name))
    np.testing.assert_array_equal(client.predict(copy, X[:5]), client.predict(name, X[:5]))
    client.delete_model(copy)
    client.delete_model(name)
    with pytest.raises(ModelNotFound):
        client.model_info(name)
    assert client.health() == {"status": "ok"}
    assert client.ready()["status"] == "ready"


def test_binary_and_json_rows_give_the_same_answers(connect: Any, name: str) -> None:
    binary, plain = connect(), connect(binary=False)
    X, y = _data(30, seed=1)
    X32 = X.astype(np.float32)  # float32 and int rows travel as they are in .npz
    for client, model in ((binary, name), (plain, f"{name}-json")):
        client.create_model(model, CONFIG)
    learned = [binary.learn(name, X32, y), plain.learn(f"{name}-json", X32, y)]
    np.testing.assert_array_equal(learned[0].probabilities, learned[1].probabilities)
    assert learned[0].log_loss == learned[1].log_loss
    assert binary.export_model(name) == plain.export_model(f"{name}-json")
    for verb in ("predict", "explain"):
        np.testing.assert_array_equal(getattr(binary, verb)(name, X[:4]),
                                      getattr(plain, verb)(name, X[:4]))
    np.testing.assert_array_equal(binary.predict(name, np.array([[1, 0, 2]], np.uint8)),
                                  plain.predict(name, [[1.0, 0.0, 2.0]]))
    binary.predict(name, X[:1], ids=["b-1"])
    plain.predict(name, X[:1], ids=["j-1"])
    assert binary.labels(name, ["b-1", "x"], [1, 1]).not_waiting == ["x"]
    assert plain.labels(name, ["j-1", "x"], [1, 1]).not_waiting == ["x"]


def test_feature_names_come_from_the_call_or_the_client(connect: Any, name: str) -> None:
    client = connect(feature_names=FEATURES)
    client.create_model(name, CONFIG)
    row = {"a": 1.0, "b": 2.0, "c": 3.0}
    expected = client.predict(name, [[1.0, 2.0, 3.0]])
    np.testing.assert_array_equal(client.predict(name, row), expected)
    np.testing.assert_array_equal(  # the call's names win: here they read the row backwards
        client.predict(name, {"a": 3.0, "b": 2.0, "c": 1.0}, feature_names=["c", "b", "a"]),
        expected)
    with pytest.raises(ValueError, match="feature_names"):
        connect().predict(name, row)  # a client without names, for a model without them
    with pytest.raises(ValueError, match="has no feature 'c'"):
        client.predict(name, {"a": 1.0, "b": 2.0})


@pytest.mark.parametrize("binary", [True, False])
def test_a_model_with_names_takes_dict_rows_and_class_names(connect: Any, name: str,
                                                            binary: bool) -> None:
    client = connect(binary=binary)
    client.create_model(name, {**CONFIG, "feature_names": FEATURES,
                               "class_names": ["no", "yes"]})
    X, y = _data(20, seed=3)
    rows = [dict(zip(reversed(FEATURES), reversed(row.tolist()), strict=True)) for row in X]
    names = np.array(["no", "yes"])[y]
    assert client.learn(name, rows, names).examples == 20  # the model's names order the rows
    probabilities = client.predict(name, X[:6])
    assert client.predict_classes(name, rows[:6]).tolist() == [
        ["no", "yes"][i] for i in probabilities.argmax(axis=1)]
    client.predict(name, X[:1], ids=["n-1"])
    assert client.labels(name, ["n-1"], ["yes"]).learned == 1


def test_a_learn_with_the_same_key_is_a_duplicate(connect: Any, name: str) -> None:
    client = connect()
    client.create_model(name, CONFIG)
    X, y = _data(5)
    first = client.learn(name, X, y, key="order-1")
    again = client.learn(name, X, y, key="order-1")
    assert again.duplicate and again.sequence == first.sequence
    np.testing.assert_array_equal(again.probabilities, first.probabilities)
    assert client.model_info(name)["examples_seen"] == 5


def test_a_learn_whose_answer_was_lost_is_retried_with_its_key(
    connect: Any, name: str, proxy: tuple[str, FlakyProxy]
) -> None:
    url, app = proxy
    client = connect(url, retry=FAST)
    client.create_model(name, CONFIG)
    app.faults.append(Fault(503, forward=True))  # learned, then the answer is lost
    X, y = _data(4)
    result = client.learn(name, X, y)
    assert result.duplicate and result.sequence == 0 and result.examples == 4
    keys = [headers.get("idempotency-key") for _, path, headers in app.seen
            if path.endswith("/learn")]
    assert len(keys) == 2 and keys[0] == keys[1] and keys[0]
    assert client.model_info(name)["examples_seen"] == 4  # learned once


def test_a_503_is_retried_after_its_retry_after(
    connect: Any, name: str, proxy: tuple[str, FlakyProxy]
) -> None:
    url, app = proxy
    client = connect(url, retry=Retry(max_retries=3, backoff_s=0.001))
    client.create_model(name, CONFIG)
    app.faults.append(Fault(503, retry_after="1"))
    X, _ = _data(2)
    start = time.monotonic()
    assert client.predict(name, X).shape == (2, 2)
    assert time.monotonic() - start >= 1.0  # the backoff alone would have waited 1 ms
    app.faults.extend([Fault(503, retry_after="0")] * 2)
    with pytest.raises(Unavailable) as refused:
        connect(url, retry=Retry(max_retries=1)).predict(name, X)
    assert refused.value.status == 503 and "proxy" in refused.value.detail


def test_create_and_delete_are_not_retried_after_a_503_unless_asked(
    connect: Any, name: str, proxy: tuple[str, FlakyProxy]
) -> None:
    url, app = proxy
    app.faults.append(Fault(503, retry_after="0"))
    with pytest.raises(Unavailable):
        connect(url, retry=FAST).create_model(name, CONFIG)
    assert len(app.seen) == 1
    app.faults.append(Fault(503, retry_after="0"))
    connect(url, retry=Retry(max_retries=3, backoff_s=0.01, writes=True)).create_model(
        name, CONFIG)
    assert len(app.seen) == 3


def test_a_server_refusing_binary_rows_is_sent_json(
    connect: Any, name: str, proxy: tuple[str, FlakyProxy]
) -> None:
    url, app = proxy
    client = connect(url)
    client.create_model(name, CONFIG)
    app.faults.append(Fault(415))
    X, y = _data(3)
    assert client.learn(name, X, y).examples == 3
    types = [headers["content-type"] for _, path, headers in app.seen if path.endswith("learn")]
    assert types == ["application/x-npz", "application/json"]
    client.predict(name, X)
    assert app.seen[-1][2]["content-type"] == "application/json"  # from then on


def test_the_service_errors_are_typed(connect: Any, name: str) -> None:
    client = connect()
    client.create_model(name, CONFIG)
    with pytest.raises(ModelNotFound) as missing:
        client.predict(f"{name}-nothing", [[1.0, 2.0, 3.0]])
    assert missing.value.status == 404 and "not found" in missing.value.detail
    with pytest.raises(Conflict):
        client.create_model(name, CONFIG)
    with pytest.raises(InvalidRequest, match="width|features"):
        client.learn(name, [[1.0, 2.0]], [0])
    with pytest.raises(InvalidRequest):
        client.learn(name, [[1.0, 2.0, 3.0]], [5])  # no class 5
    with pytest.raises(Unauthorized) as unauthorized:
        connect(token="wrong").learn(name, [[1.0, 2.0, 3.0]], [0])
    assert unauthorized.value.status == 401
    with pytest.raises(PayloadTooLarge):  # over the server's 1 MiB
        client.predict(name, np.zeros((50_000, 3)))
    assert client.model_info(name)["examples_seen"] == 0  # nothing refused was learned


def test_no_server_is_a_connection_failure_after_the_retries(connect: Any) -> None:
    client = connect(f"http://127.0.0.1:{free_port()}", retry=Retry(max_retries=2,
                                                                    backoff_s=0.01))
    with pytest.raises(ConnectionFailed) as failed:
        client.list_models()
    assert failed.value.status is None and failed.value.__cause__ is not None


def test_a_stream_answers_each_batch_in_order(connect: Any, name: str) -> None:
    client = connect()
    client.create_model(name, CONFIG)
    X, y = _data(30, seed=2)
    with client.stream(name) as stream:
        keys = [stream.send(X[i:i + 10], y[i:i + 10]) for i in range(0, 30, 10)]
        stream.send([[1.0, 2.0]], [0])  # the wrong width: refused, and the stream goes on
        assert len(stream.unanswered) == 4
        results = [stream.receive() for _ in range(3)]
        assert [r.sequence for r in results] == [0, 10, 20]
        with pytest.raises(InvalidRequest):
            stream.receive()
        assert len(stream.unanswered) == 0
        stream.send(X[:10], y[:10], keys[0])  # sent again with its key
        again = stream.receive()
    assert again.duplicate and again.sequence == 0
    plain = connect(binary=False)  # JSON text messages answer the same
    with plain.stream(name, feature_names=FEATURES) as stream:
        stream.send([{"a": 1.0, "b": 0.0, "c": 0.0}], [1])
        assert stream.receive().sequence == 30
    with pytest.raises(Unauthorized), connect(token="wrong").stream(name):
        pass


def test_the_client_imports_neither_gln_nor_service_nor_pandas() -> None:
    code = ("import sys, gln_client; print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'gln', 'service', 'pandas', 'fastapi', 'numba'}))")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                           check=True).stdout
    assert shown.strip() == "[]"


def test_the_token_comes_from_gln_api_token(
    connect: Any, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GLN_API_TOKEN", TOKEN)
    connect(token=None).create_model(name, CONFIG)
