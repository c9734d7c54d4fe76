"""An unknown GPU is never planned silently: the node page and an alert say it is estimated,
while the sample fleets' catalogued parts stay quiet (PostgreSQL)."""

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone

from controlplane.accounts.access import set_role
from controlplane.alerts.inputs import build_snapshot
from controlplane.alerts.rules import GPU_PROFILE_ESTIMATED, evaluate
from controlplane.topology.models import GPU, Cluster, Node

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet():
    call_command("load_sample_fleets", stdout=io.StringIO())
    cluster = Cluster.objects.create(name="odd-hardware")
    node = Node.objects.create(cluster=cluster, hostname="odd-01", last_seen=timezone.now())
    for i in range(2):
        GPU.objects.create(node=node, index=i, uuid=f"GPU-odd-{i}",
                           product_name="NVIDIA GH200 480GB", memory_bytes=96 * 10**9)
    return node


def test_node_page_says_the_profile_is_estimated(client, fleet):
    user = get_user_model().objects.create_user("viewer-user", password="pw-123456789")
    set_role(user, "viewer")
    client.force_login(user)
    html = client.get(f"/nodes/{fleet.pk}/").content.decode()
    assert "estimated GPU profile" in html
    assert "GH200 480GB" in html and "not in the hardware catalog" in html
    known = Node.objects.get(hostname="h200nvl-01")
    assert "estimated GPU profile" not in client.get(f"/nodes/{known.pk}/").content.decode()


def test_an_alert_fires_for_the_unknown_gpu_only(fleet):
    result = evaluate(build_snapshot(timezone.now()))
    fired = [o for o in result.observations if o.rule == GPU_PROFILE_ESTIMATED]
    assert [(o.labels["cluster"], o.labels["node"]) for o in fired] == [
        ("odd-hardware", "odd-01")]
    assert fired[0].labels["gpu_product"] == "NVIDIA GH200 480GB"
