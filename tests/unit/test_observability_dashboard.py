"""The Grafana dashboard only names metrics pdplane (or vLLM) actually exposes."""

from __future__ import annotations

import json
import re

from prometheus_client import REGISTRY

from controlplane.observability import metrics  # noqa: F401 - registers the metrics
from tests.conftest import ROOT
from workers_agent import metrics as agent_metrics

DASHBOARD = ROOT / "docker" / "grafana" / "pdplane-dashboard.json"
SCRAPE_TIME = {"pdplane_agents_connected", "pdplane_nodes", "pdplane_gateway_version_lag",
               "pdplane_agent_engines", "pdplane_agent_kv_blocks",
               "pdplane_agent_kv_event_batches_total", "pdplane_agent_kv_events_total",
               "pdplane_agent_kv_event_gaps_total"}


def dashboard_exprs() -> list[str]:
    data = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in data["panels"] for t in p.get("targets", [])]


def test_every_pdplane_series_in_the_dashboard_exists():
    known = set(SCRAPE_TIME)
    for registry in (REGISTRY, agent_metrics.REGISTRY):
        for family in registry.collect():
            # Labelled metrics without children have no samples yet: use family names.
            suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
            known.update(family.name + x for x in suffixes.get(family.type, ("",)))
    exprs = dashboard_exprs()
    assert len(exprs) >= 15
    for expr in exprs:
        for name in re.findall(r"pdplane_[a-z_]+", expr):
            assert name in known, (name, expr)
