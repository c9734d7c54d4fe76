"""Server-rendered dashboard pages against PostgreSQL."""

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from controlplane.accounts.roles import set_role
from controlplane.topology.models import Node, Worker

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet():
    call_command("load_sample_fleets", stdout=io.StringIO())


def login(client, role):
    user = get_user_model().objects.create_user(f"{role}-user", password="pw-123456789")
    set_role(user, role)
    client.force_login(user)
    return user


def test_pages_need_login(client, fleet):
    for url in ("/", "/models/", "/plans/", "/tables/", "/changelog/", "/live/poll"):
        response = client.get(url)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"], url


@pytest.mark.parametrize("url", ["/", "/models/", "/plans/", "/tables/", "/changelog/",
                                 "/live/poll", "/?cluster=nope&role=bogus&status=x"])
def test_every_page_renders_for_a_viewer(client, fleet, url):
    login(client, "viewer")
    assert client.get(url).status_code == 200


def test_topology_shows_nodes_gpus_nvlink_and_links(client, fleet):
    login(client, "viewer")
    html = client.get("/").content.decode()
    assert "h200nvl-01" in html and "rtxpro-02" in html
    assert html.count('class="gpu ') == 48
    # H200 NVL nodes have two NVLink groups of four; RTX PRO 6000 nodes have none.
    assert html.count('class="nvl linked"') == 4 * 2
    assert "400 Gb/s infiniband · RDMA" in html and "100 Gb/s ethernet · TCP" in html
    # No agent has reported: bars say "no data", not 0%.
    assert "memory no data" in html and "memory 0%" not in html
    assert "no gateway registered" in html


def test_filters_are_kept_in_the_url_and_applied(client, fleet):
    login(client, "viewer")
    html = client.get("/?cluster=two-rtxpro-servers").content.decode()
    assert "rtxpro-01" in html and "h200nvl-01" not in html
    assert 'ws-connect="/ws/live/?cluster=two-rtxpro-servers"' in html


def test_stale_node_is_greyed_with_last_seen(client, fleet):
    Node.objects.filter(hostname="rtxpro-01").update(status="stale")
    login(client, "viewer")
    html = client.get("/?cluster=two-rtxpro-servers").content.decode()
    assert 'class="node status-stale stale"' in html
    assert "last seen never" in html


def test_node_page_and_drain_permissions(client, fleet):
    worker = Worker.objects.get(node__hostname="rtxpro-01", name="engine-0")
    url = f"/nodes/{worker.node_id}/workers/{worker.pk}/drain"
    login(client, "viewer")
    page = client.get(f"/nodes/{worker.node_id}/").content.decode()
    assert "engine-0" in page and ">drain</button>" not in page
    assert client.post(url).status_code == 403
    worker.refresh_from_db()
    assert worker.state == "active"

    login(client, "operator")
    page = client.get(f"/nodes/{worker.node_id}/").content.decode()
    assert ">drain</button>" in page
    response = client.post(url)
    assert response.status_code == 302
    worker.refresh_from_db()
    assert worker.state == "draining" and worker.generation == 2
    # Draining twice is refused with a message, not an error page.
    response = client.post(url, follow=True)
    assert "already draining" in response.content.decode()


def test_html_in_names_is_escaped(client, fleet):
    Node.objects.filter(hostname="rtxpro-01").update(hostname="<script>x</script>")
    login(client, "viewer")
    html = client.get("/").content.decode()
    assert "<script>x</script>" not in html and "&lt;script&gt;" in html
