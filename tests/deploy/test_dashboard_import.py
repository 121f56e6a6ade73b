"""The dashboard as your own Grafana imports it: every Prometheus datasource is the import's
input, nothing names the compose stack's datasource, and the panels are the provisioned ones."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_importable_dashboard_asks_for_the_datasource():
    out = subprocess.run([sys.executable, "deploy/grafana/for_import.py"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    imported = json.loads(out)
    provisioned = json.loads((REPO / "deploy/grafana/dashboards/gln.json").read_text())
    assert imported["__inputs"][0]["name"] == "DS_PROMETHEUS"
    assert '"uid": "prometheus"' not in out and "${DS_PROMETHEUS}" in out
    assert out.count("${DS_PROMETHEUS}") == json.dumps(provisioned).count('"uid": "prometheus"')
    assert [p["title"] for p in imported["panels"]] == [p["title"] for p in provisioned["panels"]]
