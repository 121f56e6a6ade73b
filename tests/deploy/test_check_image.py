"""deploy/check_image.sh, which needs a Docker engine to run, still checks what there is: the
volume the CPU image declares, the line the service logs at its final snapshot, routes that
exist. Without these, a change elsewhere would break the check only where Docker runs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy.test_deploy_dockerfiles import args_of, env_of, parse

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "check_image.sh"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_it_is_valid_bash() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_it_builds_the_cpu_image_and_mounts_its_snapshot_volume(repo: Path) -> None:
    script = SCRIPT.read_text(encoding="utf-8")
    assert re.search(r"docker build .*-f deploy/Dockerfile ", script)
    instructions = parse(repo / "deploy" / "Dockerfile")
    volumes = [path for args in args_of(instructions, "VOLUME") for path in json.loads(args)]
    (mounted,) = re.findall(r'-v "\$VOLUME:([^"]+)"', script)
    assert mounted in volumes
    assert mounted == env_of(instructions)["GLN_SNAPSHOT_DIR"]


def test_the_shutdown_line_it_looks_for_is_one_the_service_logs(repo: Path) -> None:
    (line,) = re.findall(r'grep -q "([^"]+)" <<<"\$logs"', SCRIPT.read_text(encoding="utf-8"))
    sources = "\n".join(p.read_text(encoding="utf-8") for p in (repo / "service").rglob("*.py"))
    assert line in sources


def test_the_routes_it_calls_exist(repo: Path) -> None:
    from service.api.app import create_app  # noqa: PLC0415

    paths = {route.path for route in create_app().routes}
    called = set(re.findall(r'"\$S(/[^"]*)"', SCRIPT.read_text(encoding="utf-8")))
    assert called, "no routes found in the script"
    for path in called:
        assert path.replace("/demo", "/{name}") in paths, path
