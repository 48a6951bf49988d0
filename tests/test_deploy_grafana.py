"""deploy/grafana: the dashboard and alert rules parse and use only series the gateway exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from barrel_inference.gateway.metrics import GatewayMetrics

GRAFANA = Path(__file__).resolve().parents[1] / "deploy" / "grafana"
SERIES = re.compile(r"\bbarrel_inference_[a-z_]+")


def exported() -> set[str]:
    """Every series name the gateway's registry can export (counters as _total, histograms' parts)."""
    names = set()
    for family in GatewayMetrics().registry.collect():
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names |= {family.name + s for s in ("_bucket", "_sum", "_count")}
        else:
            names.add(family.name)
    return names


def test_dashboard_panels_use_exported_series():
    dash = json.loads((GRAFANA / "dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(dash["panels"]) >= 10 and all(exprs)
    used = {name for e in exprs for name in SERIES.findall(e)}
    assert used and used <= exported(), used - exported()
    # the list: TTFT / ITL / queue histograms, tokens/s, cache hits, errors by code
    for must in ("time_to_first_token_seconds_bucket", "inter_token_latency_seconds_bucket", "queue_wait_seconds_bucket",
                 "completion_tokens_total", "cache_hits_total", "requests_total"):
        assert "barrel_inference_" + must in used, must


def test_alert_rules_use_exported_series():
    rules = yaml.safe_load((GRAFANA / "alerts.yaml").read_text())["groups"][0]["rules"]
    assert len(rules) >= 4
    for rule in rules:
        assert rule["alert"] and rule["expr"] and rule["annotations"]["summary"]
        used = set(SERIES.findall(rule["expr"]))
        assert used and used <= exported(), (rule["alert"], used - exported())
