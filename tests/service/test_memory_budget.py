"""The models' memory budget when GLN_MAX_TOTAL_MODEL_BYTES is unset: a share of the memory
this process may use, so a small machine refuses what it cannot hold and says what is free."""

from __future__ import annotations

from pathlib import Path

from service.api.app import create_app
from service.engine import memory
from service.settings import Settings


def test_the_default_budget_is_half_of_what_this_process_may_use():
    total, free = memory.host_memory()
    meminfo = {line.split(":")[0]: int(line.split()[1]) * 1024
               for line in Path("/proc/meminfo").read_text().splitlines()}
    assert 0 < free <= total <= meminfo["MemTotal"]
    budget, source = memory.default_budget("cpu")
    assert budget == int(total * memory.CPU_SHARE) and "50% of this process's" in source


async def test_a_small_machine_refuses_a_model_it_cannot_hold(
    tmp_path, serve, create_model, monkeypatch
):
    """On a machine of 64 MiB the default budget is 32 MiB: a 22 MB model fits, a second
    does not, and the refusal says the budget, where it comes from and what is free."""
    monkeypatch.setattr(memory, "host_memory", lambda: (64 * 2**20, 40 * 2**20))
    settings = Settings(snapshot_dir=str(tmp_path / "s"))
    assert settings.max_total_model_bytes is None
    config = {"num_features": 10, "layer_sizes": [20000, 1], "context_dim": 4}
    async with serve(create_app(settings)) as client:
        await create_model(client, "first", config)
        r = await client.post("/v1/models", json={"name": "second", "config": config})
    assert r.status_code == 409, r.text
    detail = r.json()["detail"]
    assert f"GLN_MAX_TOTAL_MODEL_BYTES={32 * 2**20}" in detail
    assert "unset: 50% of this process's 0.1 GiB" in detail
    assert f"{40 * 2**20} bytes of the machine free now" in detail
