"""P/D pair health from a real gateway to the control plane: a dead prefill engine makes
its pair unhealthy at the gateway; the alerts evaluation reads the gateway's signed
``/admin/health``, raises ``PdPairUnhealthy`` and the routing page shows the pair."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from controlplane.alerts import gateway_health
from controlplane.alerts.inputs import build_snapshot
from controlplane.alerts.rules import evaluate
from controlplane.topology.models import Cluster, Gateway
from gateway.statictable import table_from_sim_endpoints

from .conftest import post, write_json

pytestmark = [pytest.mark.integration, pytest.mark.django_db]
MODEL = "llama-3.3-70b-fp8"


def test_dead_prefill_pair_alerts_and_shows(sim_fleet, gateway_process, tmp_path,
                                            django_user_model):
    fleet = sim_fleet([("p1", "prefill"), ("p2", "prefill"), ("d", "decode")])
    table = table_from_sim_endpoints(fleet.endpoints, mode="disaggregated")
    config = write_json(tmp_path / "gw.json", {"pd_pair_cooldown_s": 60})
    gw = gateway_process("--table", write_json(tmp_path / "t.json", table), "--config", config)
    fleet.kill_engine("p1")
    for i in range(6):
        status, _, raw = post(gw.url + "/v1/completions",
                              {"model": MODEL, "prompt": f"{i} " + "word " * 200,
                               "max_tokens": 2})
        assert status == 200, raw[:200]

    cluster = Cluster.objects.create(name="prod")
    row = Gateway.objects.create(cluster=cluster, name="gw1", url=gw.url, secret=gw.secret)
    wrong = Gateway.objects.create(cluster=cluster, name="gw2", url=gw.url, secret="nope")
    snapshot = build_snapshot(datetime.fromtimestamp(time.time(), tz=UTC))
    facts = {g.gateway: g for g in snapshot.gateways}
    assert facts["gw2"].pd_pairs == ()  # a wrong secret is refused: nothing learnt
    pairs = {(p.prefill, p.decode): p for p in facts["gw1"].pd_pairs}
    assert pairs["p1", "d"].state == "unhealthy"
    assert pairs["p1", "d"].last_failure == "prefill_failed"
    alerts = [o for o in evaluate(snapshot).observations if o.rule == "PdPairUnhealthy"]
    alerted = {(o.labels["gateway"], o.labels["prefill"], o.labels["decode"]) for o in alerts}
    # Every pair the gateway reports not healthy, and only those (on a busy box p2's
    # prefill may time out too: then it is reported and alerted as well).
    assert ("gw1", "p1", "d") in alerted
    assert alerted == {("gw1", p.prefill, p.decode) for p in pairs.values()
                       if p.state != "healthy"}

    # Kept for the pages: the routing page lists the unhealthy pair under its gateway.
    kept = gateway_health.cached(row.pk)
    assert kept and kept["pd_pairs"][0]["prefill"] == "p1"
    assert gateway_health.cached(wrong.pk) is None
    from django.test import Client

    admin = django_user_model.objects.create_superuser("root", "r@example.com", "pw")
    client = Client()
    client.force_login(admin)
    page = client.get("/tables/").content.decode()
    assert "p1 → d: unhealthy" in page
