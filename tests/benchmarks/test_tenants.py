"""The many-tenant benchmark at a tiny size: every phase runs and its row says so."""

import json

import pytest

from benchmarks import tenants

pytestmark = pytest.mark.slow


def test_the_tenants_benchmark_runs_every_phase(capsys):
    row = tenants.main(["--models", "3", "--connections", "2", "--duration", "0.5",
                        "--warmup", "0.2"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == row
    assert row["models"] == 3 and row["create_p50_ms"] > 0
    for load in ("random_model", "one_model"):
        assert row[load]["errors"] == 0 and row[load]["requests_per_s"] > 0
    assert row["metrics_series"] > 0 and row["restart_to_ready_s"] > 0
