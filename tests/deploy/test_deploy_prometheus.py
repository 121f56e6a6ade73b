"""deploy/prometheus.yml scrapes the service, and promtool accepts the config and the alerts.

promtool comes with Debian's `prometheus` package (`apt-get install prometheus`); the promtool
tests skip, saying so, where it is not on PATH.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not on PATH (Debian/Ubuntu: apt-get install prometheus)",
)


def _job(config: dict[str, Any], name: str) -> dict[str, Any]:
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == name]
    return job


def test_scrapes_the_service_every_5s(prometheus_config: dict[str, Any]) -> None:
    job = _job(prometheus_config, "gln-service")
    assert job["static_configs"][0]["targets"] == ["service:8000"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    assert job["scrape_interval"] == "5s"


def test_scrapes_itself(prometheus_config: dict[str, Any]) -> None:
    job = _job(prometheus_config, "prometheus")
    assert job["static_configs"][0]["targets"] == ["localhost:9090"]


def test_alerts_cover_snapshot_age_and_a_dead_service(alert_exprs: list[str]) -> None:
    joined = "\n".join(alert_exprs)
    assert "gln_snapshot_last_success_timestamp_seconds" in joined
    assert 'up{job="gln-service"}' in joined


def test_docs_list_every_alert(alert_rules: dict[str, Any], repo: Path) -> None:
    doc = (repo / "docs" / "deploy.md").read_text(encoding="utf-8")
    names = [rule["alert"] for group in alert_rules["groups"] for rule in group["rules"]]
    missing = [name for name in names if f"**{name}**" not in doc]
    assert not missing, f"docs/deploy.md does not describe {missing}"


def test_error_rate_leaves_scrapes_and_probes_out_of_both_sides(
    alert_rules: dict[str, Any],
) -> None:
    """Prometheus' scrapes and the health checks are ~18 successes a minute: counted in the
    denominator they hide an outage of every API request at low traffic."""
    (rule,) = [r for g in alert_rules["groups"] for r in g["rules"]
               if r.get("alert") == "GlnHighErrorRate"]
    selectors = re.findall(r"gln_http_requests_total\{([^}]*)\}", rule["expr"])
    assert len(selectors) == 2, rule["expr"]
    for selector in selectors:
        assert 'route!~"/metrics|/healthz|/readyz"' in selector, selector


def _promtool(*args: str, cwd: Path) -> None:
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"promtool {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"


@needs_promtool
def test_promtool_check_config(repo: Path) -> None:
    # Also checks the rule files the config names.
    _promtool("check", "config", "deploy/prometheus.yml", cwd=repo)


@needs_promtool
def test_promtool_check_rules(repo: Path) -> None:
    _promtool("check", "rules", "deploy/alerts.yml", cwd=repo)


@needs_promtool
def test_promtool_alert_unit_tests(repo: Path) -> None:
    _promtool("test", "rules", "tests/deploy/promtool/alerts_test.yml", cwd=repo)


@needs_promtool
def test_dashboard_queries_are_valid_promql(
    dashboard_exprs: list[str], tmp_path: Path, repo: Path
) -> None:
    """Each dashboard query, with Grafana's variables filled in, parses as PromQL.

    promtool has no "check this expression" command, so the queries become recording rules.
    """
    filled = {"$__rate_interval": "1m", "$__interval": "15s", "$model": ".*"}
    rules = []
    for i, expr in enumerate(dashboard_exprs):
        if expr.startswith("label_values("):  # Grafana's variable query, not PromQL
            continue
        for variable, value in filled.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, f"unfilled Grafana variable in: {expr}"
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    _promtool("check", "rules", str(path), cwd=repo)
