"""docker-compose.yml (and the GPU override) hold the stack docs/deploy.md describes.

`docker compose config` needs Compose v2, which is not installed everywhere these tests run, so
the file is also read as YAML and checked against the repository and the other deploy files;
where Compose v2 is on PATH (CI unpacks Debian's), it checks the files too.
"""

from __future__ import annotations

import posixpath
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {key: str(value) for key, value in env.items()}


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """Short-syntax volumes as {container path: source} (source: ./path or a volume name)."""
    mounts = {}
    for entry in service.get("volumes", []):
        source, target = entry.split(":")[:2]
        mounts[target] = source
    return mounts


def test_has_the_four_services(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"service", "redis", "prometheus", "grafana"}


def test_service_builds_the_cpu_image_and_talks_to_redis(
    compose: dict[str, Any], repo: Path
) -> None:
    service = compose["services"]["service"]
    assert service["build"]["context"] == "."
    assert service["build"]["dockerfile"] == "deploy/Dockerfile"
    assert (repo / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
    assert _env(service)["GLN_REDIS_URL"] == "redis://redis:6379/0"
    assert "127.0.0.1:8000:8000" in service["ports"]
    assert service["depends_on"]["redis"]["condition"] == "service_healthy"


def test_redis_is_durable_and_has_a_healthcheck(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    assert redis["image"].split(":")[0] == "redis" and redis["image"].split(":")[1].startswith("7")
    command = redis["command"]
    command = command if isinstance(command, list) else command.split()
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--appendfsync") + 1] == "everysec"
    assert _mounts(redis)["/data"] in compose["volumes"]
    test = " ".join(redis["healthcheck"]["test"])
    assert "redis-cli ping" in test


def test_prometheus_gets_its_config_and_rules(
    compose: dict[str, Any], prometheus_config: dict[str, Any]
) -> None:
    prometheus = compose["services"]["prometheus"]
    assert prometheus["image"].startswith("prom/prometheus")
    assert "127.0.0.1:9090:9090" in prometheus["ports"]
    mounts = _mounts(prometheus)
    config_target = "/etc/prometheus/prometheus.yml"
    assert mounts[config_target] == "./deploy/prometheus.yml"
    # rule_files are relative to the config file: each must be mounted where Prometheus looks.
    for rule_file in prometheus_config.get("rule_files", []):
        in_container = posixpath.join(posixpath.dirname(config_target), rule_file)
        assert mounts.get(in_container) == f"./deploy/{rule_file}", rule_file
    assert mounts["/prometheus"] in compose["volumes"]


def test_grafana_is_provisioned_and_open_to_viewers(
    compose: dict[str, Any], dashboard_providers: dict[str, Any], repo: Path
) -> None:
    grafana = compose["services"]["grafana"]
    assert grafana["image"].startswith("grafana/grafana")
    assert "127.0.0.1:3000:3000" in grafana["ports"]
    mounts = _mounts(grafana)
    assert mounts["/etc/grafana/provisioning"] == "./deploy/grafana/provisioning"
    # The file provider reads the folder the dashboards are mounted at.
    (provider,) = dashboard_providers["providers"]
    assert mounts[provider["options"]["path"]] == "./deploy/grafana/dashboards"
    env = _env(grafana)
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    home = env.get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    if home:
        assert posixpath.dirname(home) == provider["options"]["path"]
        assert (repo / "deploy" / "grafana" / "dashboards" / posixpath.basename(home)).is_file()


def test_bind_mounts_exist_and_named_volumes_are_declared(
    compose: dict[str, Any], repo: Path
) -> None:
    for name, service in compose["services"].items():
        for target, source in _mounts(service).items():
            if source.startswith("."):
                assert (repo / source).exists(), f"{name}: {source} -> {target} is missing"
            else:
                assert source in compose["volumes"], f"{name}: volume {source} not declared"


def test_wiring_matches_the_other_deploy_files(
    compose: dict[str, Any], prometheus_config: dict[str, Any], datasources: dict[str, Any]
) -> None:
    (job,) = [j for j in prometheus_config["scrape_configs"] if j["job_name"] == "gln-service"]
    (target,) = job["static_configs"][0]["targets"]
    host, port = target.split(":")
    assert host in compose["services"]
    container_ports = [p.split(":")[-1] for p in compose["services"][host]["ports"]]
    assert port in container_ports
    (source,) = datasources["datasources"]
    assert source["url"] == "http://prometheus:9090"


def test_gpu_override_builds_the_cuda_image_with_a_gpu(repo: Path) -> None:
    override = yaml.safe_load((repo / "deploy" / "compose.gpu.yml").read_text(encoding="utf-8"))
    service = override["services"]["service"]
    assert service["build"]["dockerfile"] == "deploy/Dockerfile.cuda"
    assert (repo / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
    assert _env(service)["GLN_DEVICE"] == "cuda"
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert "gpu" in device["capabilities"]


def test_published_ports_listen_on_loopback_only(compose: dict[str, Any]) -> None:
    """With no token and Grafana's default password, nothing is open to other machines unless
    an operator opens it (docs/deploy.md)."""
    published = [p for s in compose["services"].values() for p in s.get("ports", [])]
    assert published and all(str(p).startswith("127.0.0.1:") for p in published)


def _compose_v2() -> list[str] | None:
    """The command of a Docker Compose v2 here (the docker plugin or the standalone binary), or
    None: v1 (`docker-compose` 1.x) refuses the top-level `name:` that the file uses."""
    for command in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(command[0]) is None:
            continue
        version = subprocess.run([*command, "version", "--short"], capture_output=True,
                                 text=True, check=False)
        if version.returncode == 0 and version.stdout.strip().lstrip("v").startswith("2."):
            return command
    return None


COMPOSE_V2 = _compose_v2()


@pytest.mark.skipif(COMPOSE_V2 is None, reason="needs Docker Compose v2 (CI unpacks Debian's)")
@pytest.mark.parametrize("files", [["docker-compose.yml"],
                                   ["docker-compose.yml", "deploy/compose.gpu.yml"]],
                         ids=["stack", "gpu-override"])
def test_docker_compose_accepts_the_files(files: list[str], repo: Path) -> None:
    """Compose's own reading of the files (its schema, interpolation, the override's merge),
    which the YAML checks above do not repeat; no Docker engine is needed for it."""
    options = [option for name in files for option in ("-f", name)]
    checked = subprocess.run([*COMPOSE_V2, *options, "config", "--quiet"], cwd=repo,
                             capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stderr
