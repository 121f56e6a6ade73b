"""The Grafana provisioning and the GLN dashboard: data source, variable, panels, units.

Whether the metric names the panels query are really exported is checked against the running
app in test_deploy_metrics.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

# Panels the dashboard must have: title -> (unit, regexes every one of which some expression
# of the panel matches, whitespace collapsed).
RATE = r"\[\$__rate_interval\]"
REQUIRED_PANELS: dict[str, tuple[str, list[str]]] = {
    "Online log loss per model": ("suffix: nats", [
        rf"sum by \(model\) \(rate\(gln_prequential_log_loss_nats_total\{{[^}}]*\}}{RATE}\)\) "
        rf"/ sum by \(model\) \(rate\(gln_examples_learned_total\{{[^}}]*\}}{RATE}\)\)",
    ]),
    "Online accuracy per model": ("percentunit", [
        rf"sum by \(model\) \(rate\(gln_prequential_correct_total\{{[^}}]*\}}{RATE}\)\) "
        rf"/ sum by \(model\) \(rate\(gln_examples_learned_total\{{[^}}]*\}}{RATE}\)\)",
    ]),
    "Examples learned and predicted / s per model": ("short", [
        rf"sum by \(model\) \(rate\(gln_examples_learned_total\{{[^}}]*\}}{RATE}\)\)",
    ]),
    "Learn and predict requests / s by route and status": ("reqps", [
        r"sum by \(route, status\) \(rate\(gln_http_requests_total"
        r"\{route=~\"[^\"]*learn[^\"]*\"\}",
    ]),
    "Latency p50 / p90 / p99 per route": ("s", [
        rf"histogram_quantile\(0\.{q}, sum by \(route, le\) "
        rf"\(rate\(gln_http_request_duration_seconds_bucket\{{[^}}]*\}}{RATE}\)\)\)"
        for q in ("5", "9", "99")
    ]),
    "Snapshot age per model": ("s", [
        r"time\(\) - gln_snapshot_last_success_timestamp_seconds",
    ]),
    "Model size": ("bytes", [r"gln_model_bytes"]),
    "Models loaded": ("none", [r"gln_models_loaded"]),
    "Snapshot duration": ("s", [r"gln_snapshot_duration_seconds_(bucket|sum|count)"]),
}

PER_MODEL_METRICS = re.compile(
    r"gln_(examples_learned_total|examples_predicted_total|prequential_\w+_total|model_bytes"
    r"|snapshot_bytes|snapshot_last_success_timestamp_seconds|delayed_labels_\w+)\{"
)


def _squash(expr: str) -> str:
    return " ".join(expr.split())


def _exprs(panel: dict[str, Any]) -> list[str]:
    return [_squash(t["expr"]) for t in panel.get("targets", [])]


@pytest.fixture(scope="session")
def datasource_uid(datasources: dict[str, Any]) -> str:
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus"
    return source["uid"]


def test_datasource_has_a_fixed_uid(datasource_uid: str) -> None:
    assert datasource_uid == "prometheus"


def test_dashboard_provider_reads_files(dashboard_providers: dict[str, Any]) -> None:
    (provider,) = dashboard_providers["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"]


def test_model_variable(dashboard: dict[str, Any], datasource_uid: str) -> None:
    (variable,) = [v for v in dashboard["templating"]["list"] if v["name"] == "model"]
    query = variable["query"]
    query = query["query"] if isinstance(query, dict) else query
    assert query == "label_values(gln_examples_learned_total, model)"
    assert variable["datasource"]["uid"] == datasource_uid


@pytest.mark.parametrize("title", sorted(REQUIRED_PANELS))
def test_required_panel(title: str, panels: list[dict[str, Any]]) -> None:
    unit, patterns = REQUIRED_PANELS[title]
    (panel,) = [p for p in panels if p["title"] == title]
    assert panel["fieldConfig"]["defaults"]["unit"] == unit
    exprs = _exprs(panel)
    for pattern in patterns:
        assert any(re.search(pattern, e) for e in exprs), f"{title}: nothing matches {pattern}"


def test_every_panel_uses_the_provisioned_datasource(
    panels: list[dict[str, Any]], datasource_uid: str
) -> None:
    for panel in panels:
        assert panel["datasource"]["uid"] == datasource_uid, panel["title"]
        assert panel["targets"], f"{panel['title']} has no query"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == datasource_uid, panel["title"]


def test_every_panel_has_unique_query_ref_ids(panels: list[dict[str, Any]]) -> None:
    """Grafana tells a panel's queries apart by refId (its results and overrides name them by
    it), so two queries with the same refId are not both shown reliably."""
    for panel in panels:
        ref_ids = [target.get("refId") for target in panel["targets"]]
        assert all(ref_ids), f"{panel['title']}: a query has no refId"
        assert len(ref_ids) == len(set(ref_ids)), f"{panel['title']}: refIds {ref_ids}"


def test_per_model_queries_follow_the_model_variable(panels: list[dict[str, Any]]) -> None:
    for panel in panels:
        if panel["type"] == "row" or "instance" in panel["title"]:
            continue
        for expr in _exprs(panel):
            for match in PER_MODEL_METRICS.finditer(expr):
                selector = expr[match.end() - 1: expr.index("}", match.end())]
                assert 'model=~"$model"' in selector, f"{panel['title']}: {expr}"


def test_layout_has_unique_ids_and_no_overlaps(dashboard: dict[str, Any]) -> None:
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    taken: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24, panel["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in taken, f"{panel['title']} overlaps {taken[(x, y)]}"
                taken[(x, y)] = panel["title"]


def test_dashboard_identity(dashboard: dict[str, Any]) -> None:
    # docs/deploy.md names the dashboard by title; links use the uid.
    assert dashboard["uid"] == "gln-service"
    assert dashboard["title"] == "GLN service"


def test_error_stat_matches_the_alert(
    panels: list[dict[str, Any]], alert_rules: dict[str, Any]
) -> None:
    """The stat that names the GlnHighErrorRate alert counts the same requests as the alert."""
    (panel,) = [p for p in panels if p["title"] == "Server errors (5xx)"]
    (rule,) = [r for g in alert_rules["groups"] for r in g["rules"]
               if r.get("alert") == "GlnHighErrorRate"]
    assert "GlnHighErrorRate" in panel["description"]

    def routes_left_out(expr: str) -> list[str]:
        return re.findall(r'route!~"([^"]*)"', expr)

    (expr,) = _exprs(panel)
    alert_routes = routes_left_out(rule["expr"])
    assert len(alert_routes) == 2 and len(set(alert_routes)) == 1
    assert routes_left_out(expr) == alert_routes, expr
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    threshold = float(re.search(r">\s*([\d.]+)\s*$", rule["expr"].strip()).group(1))
    assert threshold in [step["value"] for step in steps], steps


def test_docs_name_the_panels_the_model_selector_filters(
    panels: list[dict[str, Any]], repo: Path
) -> None:
    doc = (repo / "docs" / "deploy.md").read_text(encoding="utf-8")
    start = doc.index("The **Model** selector")
    paragraph = doc[start:doc.index("\n\n", start)]
    # The panels are named in *italics* (the selector itself in **bold**).
    named = set(re.findall(r"(?<!\*)\*([^*]+)\*(?!\*)", " ".join(paragraph.split())))
    filtered = {p["title"] for p in panels if any("$model" in e for e in _exprs(p))}
    assert named == filtered, (
        f"docs/deploy.md: missing {filtered - named}, not filtered {named - filtered}"
    )
