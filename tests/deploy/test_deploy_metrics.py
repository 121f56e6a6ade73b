"""Every metric the dashboard and the alerts query is one the service really exports.

The real app is started in-process (lifespan included, snapshots to a temporary directory, no
Redis), driven through one create / learn / predict / snapshot, and its /metrics exposition is
parsed. The PromQL of deploy/grafana/dashboards/gln.json and deploy/alerts.yml must only name
series that exist there, with labels the metric has; docs/interfaces.md must agree with both.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

# Metrics from docs/interfaces.md that no dashboard panel shows, each with the reason.
# (Empty today: every documented metric has a panel.)
UNUSED_ON_DASHBOARD: dict[str, str] = {}

METRIC_TOKEN = re.compile(r"\bgln_[a-z_]+")
# `name{a="x", b=~"y"}`: the label names of a selector.
SELECTOR = re.compile(r"\b(gln_[a-z_]+|up)\{([^}]*)\}")
LABEL_NAME = re.compile(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
# Extra label every scraped series gets from Prometheus.
TARGET_LABELS = {"job", "instance"}


class Exported:
    """What /metrics exposes: family name -> (type, label names seen on its samples)."""

    def __init__(self, text: str) -> None:
        self.families: dict[str, tuple[str, set[str]]] = {}
        for family in text_string_to_metric_families(text):
            labels = {k for s in family.samples for k in s.labels} - {"le", "quantile"}
            self.families[family.name] = (family.type, labels)

    def family_of(self, series: str) -> str | None:
        """The family a PromQL series name belongs to, or None if nothing exports it.

        Counters are queried as `<family>_total`; histograms as `<family>_bucket`, `_sum` or
        `_count` (a bare histogram name is no series); gauges by their own name.
        """
        candidates = [(series, "gauge")]
        if series.endswith("_total"):
            candidates.append((series.removesuffix("_total"), "counter"))
        for suffix in ("_bucket", "_sum", "_count"):
            if series.endswith(suffix):
                candidates.append((series.removesuffix(suffix), "histogram"))
        for name, kind in candidates:
            if name in self.families and self.families[name][0] == kind:
                return name
        return None

    def labels_of(self, series: str) -> set[str]:
        family = self.family_of(series)
        assert family is not None
        labels = set(self.families[family][1]) | TARGET_LABELS
        if series.endswith("_bucket"):
            labels.add("le")
        return labels


def documented_metrics(repo: Path) -> dict[str, tuple[str, set[str]]]:
    """The metric table of docs/interfaces.md: name -> (type, label names)."""
    table: dict[str, tuple[str, set[str]]] = {}
    for line in (repo / "docs" / "interfaces.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.fullmatch(r"`gln_\w+`", cells[0]):
            kind = re.match(r"\w+", cells[1]).group()
            table[cells[0].strip("`")] = (kind, set(re.findall(r"`(\w+)`", cells[2])))
    assert table, "no metric table found in docs/interfaces.md"
    return table


async def scrape_after_one_round(snapshot_dir: Path) -> str:
    """/metrics of a real app after one create, learn, predict and snapshot."""
    from service.api.app import create_app
    from service.settings import Settings

    settings = Settings(
        snapshot_dir=str(snapshot_dir), redis_url=None, api_token=None, device="cpu"
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            config = {"num_features": 3, "num_classes": 2, "layer_sizes": [4, 1]}
            r = await client.post("/v1/models", json={"name": "m", "config": config})
            assert r.status_code == 201, r.text
            rows = [[0.1, 0.2, 0.3], [0.9, -0.5, 0.0]]
            r = await client.post("/v1/models/m/learn", json={"features": rows, "labels": [1, 0]})
            assert r.status_code == 200, r.text
            r = await client.post("/v1/models/m/predict", json={"features": rows})
            assert r.status_code == 200, r.text
            r = await client.post("/v1/models/m/snapshot")
            assert r.status_code == 200, r.text
            r = await client.get("/metrics")
            assert r.status_code == 200, r.text
            return r.text


async def probe_routes(snapshot_dir: Path) -> set[str]:
    """The `route` label values of gln_http_requests_total after a scrape and both probes."""
    from service.api.app import create_app
    from service.settings import Settings

    settings = Settings(
        snapshot_dir=str(snapshot_dir), redis_url=None, api_token=None, device="cpu"
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            for path in ("/healthz", "/readyz", "/metrics"):
                # /readyz may answer 503 while the (empty) restore runs: counted all the same.
                r = await client.get(path)
                assert r.status_code in (200, 503), f"{path}: {r.status_code} {r.text}"
            text = (await client.get("/metrics")).text
    return {
        sample.labels["route"]
        for family in text_string_to_metric_families(text)
        if family.name == "gln_http_requests"
        for sample in family.samples
        if "route" in sample.labels
    }


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    text = asyncio.run(scrape_after_one_round(tmp_path_factory.mktemp("snapshots")))
    return Exported(text)


def _queried_series(exprs: list[str]) -> set[str]:
    return {token for expr in exprs for token in METRIC_TOKEN.findall(expr)}


def test_dashboard_queries_only_exported_series(
    dashboard_exprs: list[str], exported: Exported
) -> None:
    missing = sorted(s for s in _queried_series(dashboard_exprs) if exported.family_of(s) is None)
    assert not missing, f"dashboard queries series the service does not export: {missing}"


def test_alerts_query_only_exported_series(alert_exprs: list[str], exported: Exported) -> None:
    missing = sorted(s for s in _queried_series(alert_exprs) if exported.family_of(s) is None)
    assert not missing, f"alerts query series the service does not export: {missing}"


def test_label_matchers_and_groupings_name_real_labels(
    dashboard_exprs: list[str], alert_exprs: list[str], exported: Exported
) -> None:
    for expr in dashboard_exprs + alert_exprs:
        series = [s for s in _queried_series([expr]) if exported.family_of(s)]
        available = set().union(*(exported.labels_of(s) for s in series)) if series else set()
        for name, matchers in SELECTOR.findall(expr):
            if name == "up":
                continue
            unknown = set(LABEL_NAME.findall(matchers)) - exported.labels_of(name)
            assert not unknown, f"{name} has no label(s) {unknown}: {expr}"
        for grouping in GROUPING.findall(expr):
            labels = {label.strip() for label in grouping.split(",") if label.strip()}
            assert labels <= available, f"grouping by {labels - available} in: {expr}"


def test_documented_metrics_are_exported_as_documented(repo: Path, exported: Exported) -> None:
    for name, (kind, labels) in documented_metrics(repo).items():
        # The doc names counters with their `_total` suffix, histograms by their base name.
        series = name + "_bucket" if kind == "histogram" else name
        family = exported.family_of(series)
        assert family is not None, f"{name} ({kind}) is documented but not exported"
        assert exported.families[family][1] == labels, f"{name}: labels differ from the doc"


def test_exported_metrics_are_documented(repo: Path, exported: Exported) -> None:
    documented = {
        name.removesuffix("_total") for name in documented_metrics(repo)
    }
    # prometheus_client adds a `<name>_created` gauge per counter and histogram: not ours.
    created = {f"{f}_created" for f, (kind, _) in exported.families.items()
               if kind in ("counter", "histogram")}
    undocumented = sorted(
        f for f in exported.families
        if f.startswith("gln_") and f not in documented and f not in created
    )
    assert not undocumented, f"exported but missing from docs/interfaces.md: {undocumented}"


def test_every_documented_metric_is_on_the_dashboard_or_allowlisted(
    repo: Path, dashboard_exprs: list[str]
) -> None:
    queried = _queried_series(dashboard_exprs)
    for name, (kind, _labels) in documented_metrics(repo).items():
        if name in UNUSED_ON_DASHBOARD:
            assert name not in queried and not any(q.startswith(name + "_") for q in queried), (
                f"{name} is allowlisted as unused but the dashboard queries it"
            )
            continue
        if kind == "histogram":
            used = any(name + suffix in queried for suffix in ("_bucket", "_sum", "_count"))
        else:
            used = name in queried
        assert used, f"{name} is in docs/interfaces.md but on no panel (nor in UNUSED_ON_DASHBOARD)"


def test_left_out_routes_are_the_labels_scrapes_and_probes_get(
    alert_exprs: list[str], dashboard_exprs: list[str], tmp_path: Path
) -> None:
    """The alerts and panels that leave scrapes and probes out match the route label values the
    service really gives them (a typo there would silently count them again)."""
    routes = asyncio.run(probe_routes(tmp_path))
    assert {"/healthz", "/readyz", "/metrics"} <= routes, routes
    excluded = {
        value
        for expr in alert_exprs + dashboard_exprs
        for regex in re.findall(r'route!~"([^"]*)"', expr)
        for value in regex.split("|")
    }
    assert excluded, "no query leaves the probe routes out"
    assert excluded <= routes, f"left out but never exported: {excluded - routes}"
