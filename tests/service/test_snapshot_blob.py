"""The service's snapshot blob: the model's bytes and the rows waiting for labels come back
apart exactly as they went in, and a snapshot without waiting rows is the model's bytes."""

from __future__ import annotations

import numpy as np

from gln import GLN
from service.engine.snapshot_blob import WAITING_ROWS_AT, WAL_ID, snapshot_blob, split_snapshot
from service.engine.waiting_rows import WaitingRow


def _rows(n: int, features: int = 3) -> list[WaitingRow]:
    rng = np.random.default_rng(0)
    return [
        WaitingRow(f"row-{i}", rng.normal(size=features).astype(np.float32),
                   np.array([0.25, 0.75]), 1_000.0 + i)
        for i in range(n)
    ]


def test_without_waiting_rows_the_blob_is_the_model_bytes():
    model_bytes = GLN(num_features=3, layer_sizes=(4, 1)).to_bytes()
    blob, metadata = snapshot_blob(model_bytes, applied_id=None, waiting=[])
    assert blob is model_bytes and metadata == {}
    assert split_snapshot(blob, metadata) == (model_bytes, [])


def test_waiting_rows_follow_the_model_bytes_and_come_back_equal():
    model = GLN(num_features=3, layer_sizes=(4, 1))
    model_bytes = model.to_bytes()
    waiting = _rows(3)
    blob, metadata = snapshot_blob(memoryview(model_bytes), applied_id="12-0", waiting=waiting)
    assert metadata == {WAL_ID: "12-0", WAITING_ROWS_AT: str(len(model_bytes))}
    model_part, rows = split_snapshot(bytes(blob), metadata)
    assert bytes(model_part) == model_bytes
    assert GLN.from_bytes(bytes(model_part)).to_bytes() == model_bytes
    assert [row.id for row in rows] == [row.id for row in waiting]
    for got, sent in zip(rows, waiting, strict=True):
        np.testing.assert_array_equal(got.features, sent.features)
        np.testing.assert_array_equal(got.prediction, sent.prediction)
        assert got.expires_at == sent.expires_at
