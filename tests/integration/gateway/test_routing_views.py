"""Staff views of the routing app: version diff and per-gateway status with lag."""

import pytest

from controlplane.routing.service import publish
from controlplane.topology.models import Gateway, Worker

from .test_routing_delivery import make_cluster

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def test_diff_and_gateway_status(admin_client, client):
    cluster, workers = make_cluster()
    Gateway.objects.create(cluster=cluster, name="gw1", url="http://127.0.0.1:9", secret="k",
                           applied_table_version=1)
    assert publish(cluster.pk, "first", "tester").version == 1
    Worker.objects.filter(pk=workers[0].pk).update(state="draining")
    assert publish(cluster.pk, "drain", "planner").version == 2

    diff = admin_client.get(f"/routing/v1/clusters/{cluster.name}/diff").json()
    assert (diff["from"], diff["to"], diff["cause"], diff["actor"]) == (1, 2, "drain", "planner")
    assert "h0/e0 state active→draining" in diff["summary"]
    assert admin_client.get(f"/routing/v1/clusters/{cluster.name}/diff?to=x").status_code == 400

    status = admin_client.get(f"/routing/v1/clusters/{cluster.name}/gateways").json()
    assert status["latest_version"] == 2
    gw = status["gateways"][0]
    assert gw["applied_version"] == 1 and gw["lag"]["versions"] == 1
    assert gw["lag"]["seconds"] >= 0
    # Not for anonymous users.
    assert client.get(f"/routing/v1/clusters/{cluster.name}/gateways").status_code == 302
    assert admin_client.get("/routing/v1/clusters/nope/gateways").status_code == 404
