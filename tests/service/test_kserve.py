"""The KServe V2 (Open Inference Protocol) face, called by Triton's own HTTP client against a
real server process: health, metadata, and inference with JSON tensors and binary ones, which
answer what /v1 predict answers."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.service.durable_client import ServerProcess

tritonhttp = pytest.importorskip("tritonclient.http")
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    directory = tmp_path_factory.mktemp("kserve")
    process = ServerProcess({"GLN_SNAPSHOT_DIR": str(directory / "s")},
                            Path(directory) / "server.log")
    with process:
        process.start()
        config = {"num_features": 4, "num_classes": 3, "layer_sizes": [8, 1], "seed": 1}
        httpx.post(f"{process.url}/v1/models",
                   json={"name": "m", "config": config}).raise_for_status()
        rng = np.random.default_rng(0)
        X = rng.normal(size=(50, 4))
        httpx.post(f"{process.url}/v1/models/m/learn", json={
            "features": X.tolist(), "labels": rng.integers(0, 3, 50).tolist()}
                   ).raise_for_status()
        yield process


@pytest.fixture
def client(server: ServerProcess):
    triton = tritonhttp.InferenceServerClient(url=f"127.0.0.1:{server.port}")
    yield triton
    triton.close()


def test_health_and_metadata_as_the_protocol_gives_them(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("m") and not client.is_model_ready("nope")
    metadata = client.get_model_metadata("m")
    assert metadata["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, 4]}]
    assert metadata["outputs"] == [{"name": "probabilities", "datatype": "FP64",
                                    "shape": [-1, 3]}]
    assert client.get_server_metadata()["name"] == "gln-service"


@pytest.mark.parametrize("binary", [False, True])
def test_inference_answers_what_predict_answers(client, server, binary):
    rows = np.random.default_rng(1).normal(size=(7, 4)).astype(np.float32)
    tensor = tritonhttp.InferInput("features", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows, binary_data=binary)
    wanted = tritonhttp.InferRequestedOutput("probabilities", binary_data=binary)
    result = client.infer("m", [tensor], outputs=[wanted], request_id="r1")
    probabilities = result.as_numpy("probabilities")
    expected = httpx.post(f"{server.url}/v1/models/m/predict",
                          json={"features": rows.tolist()}).json()["probabilities"]
    np.testing.assert_allclose(probabilities, expected, rtol=0, atol=1e-12)
    assert probabilities.shape == (7, 3) and result.get_response()["id"] == "r1"


def test_bad_tensors_are_refused_in_the_protocols_words(client):
    wrong_width = np.zeros((2, 5), np.float32)
    tensor = tritonhttp.InferInput("features", [2, 5], "FP32")
    tensor.set_data_from_numpy(wrong_width, binary_data=False)
    with pytest.raises(InferenceServerException, match="4 features"):
        client.infer("m", [tensor])
    with pytest.raises(InferenceServerException, match="not found|unknown|nope"):
        client.infer("nope", [tensor])
    misnamed = tritonhttp.InferInput("x", [2, 5], "FP32")
    misnamed.set_data_from_numpy(wrong_width, binary_data=False)
    with pytest.raises(InferenceServerException, match="named 'features'"):
        client.infer("m", [misnamed])
