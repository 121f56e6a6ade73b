"""The dashboard for your own Grafana: ``deploy/grafana/dashboards/gln.json`` with its
Prometheus datasource turned into an import input, so that Grafana's *Import dashboard* asks
which of your datasources to use (the provisioned file names the compose stack's, uid
``prometheus``).

    python deploy/grafana/for_import.py > gln-import.json     # then Dashboards > New > Import
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).resolve().parent / "dashboards" / "gln.json"
INPUT = "DS_PROMETHEUS"


def importable(dashboard: dict[str, Any]) -> dict[str, Any]:
    """``dashboard`` with every Prometheus datasource reference replaced by the input."""

    def replace(node: Any) -> Any:
        if isinstance(node, dict):
            if node.get("type") == "prometheus" and "uid" in node:
                return {**node, "uid": f"${{{INPUT}}}"}
            return {key: replace(value) for key, value in node.items()}
        if isinstance(node, list):
            return [replace(item) for item in node]
        return node

    return {
        "__inputs": [{"name": INPUT, "label": "Prometheus", "type": "datasource",
                      "pluginId": "prometheus", "pluginName": "Prometheus"}],
        **{key: replace(value) for key, value in dashboard.items() if key not in ("id", "uid")},
    }


def main() -> None:
    json.dump(importable(json.loads(DASHBOARD.read_text())), sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
