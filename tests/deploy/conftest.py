"""Fixtures for the deployment tests: the repository root and the parsed deploy files.

No Docker engine is needed: these tests read docker-compose.yml, the Dockerfiles, the
Prometheus and Grafana files as data, and check them against the repository and against what
the service really exports.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def load_yaml(path: Path) -> Any:
    """Parse one YAML document."""
    with path.open(encoding="utf-8") as f:
        return yaml.safe_load(f)


@pytest.fixture(scope="session")
def repo() -> Path:
    """The repository root (the Docker build context and compose project directory)."""
    return REPO


@pytest.fixture(scope="session")
def pyproject() -> dict[str, Any]:
    with (REPO / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


@pytest.fixture(scope="session")
def compose() -> dict[str, Any]:
    return load_yaml(REPO / "docker-compose.yml")


@pytest.fixture(scope="session")
def prometheus_config() -> dict[str, Any]:
    return load_yaml(DEPLOY / "prometheus.yml")


@pytest.fixture(scope="session")
def alert_rules() -> dict[str, Any]:
    return load_yaml(DEPLOY / "alerts.yml")


@pytest.fixture(scope="session")
def datasources() -> dict[str, Any]:
    return load_yaml(DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml")


@pytest.fixture(scope="session")
def dashboard_providers() -> dict[str, Any]:
    return load_yaml(DEPLOY / "grafana" / "provisioning" / "dashboards" / "dashboards.yml")


@pytest.fixture(scope="session")
def dashboard() -> dict[str, Any]:
    return json.loads((DEPLOY / "grafana" / "dashboards" / "gln.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel that shows data (rows left out), including panels nested in collapsed rows."""
    found = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            found.extend(panel.get("panels", []))
        else:
            found.append(panel)
    return found


@pytest.fixture(scope="session")
def dashboard_exprs(dashboard: dict[str, Any], panels: list[dict[str, Any]]) -> list[str]:
    """Every PromQL expression of the dashboard: panel targets and template variable queries."""
    exprs = [target["expr"] for panel in panels for target in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


@pytest.fixture(scope="session")
def alert_exprs(alert_rules: dict[str, Any]) -> list[str]:
    return [rule["expr"] for group in alert_rules["groups"] for rule in group["rules"]]
