"""Server-rendered dashboard pages against PostgreSQL."""

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from controlplane.accounts.access import set_role
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


def test_whatif_form_answers_with_arithmetic_and_inline_errors(client, fleet):
    login(client, "viewer")
    page = client.get("/models/").content.decode()
    assert 'id="whatif"' in page
    answer = client.get("/models/whatif", {
        "gpu": "RTX PRO 6000", "model": "llama-3.3-70b-fp8", "nodes": 2, "gpus_per_node": 8,
        "nic_gbps": 100, "isl": 4000, "osl": 300, "rate_rps": 2, "ttft_slo_ms": 2500,
        "itl_slo_ms": 50,
    }).content.decode()
    assert "Best:" in answer and "aggregated" in answer.lower()
    assert "the arithmetic" in answer
    bad = client.get("/models/whatif", {"nodes": "0", "prefix_hit": "2"}).content.decode()
    assert 'class="errorlist"' in bad and "prefix_hit" in bad and "nodes" in bad


def _proposed_plan():
    from controlplane.planner.models import Plan
    from controlplane.topology.models import ServedModel

    model = ServedModel.objects.get(cluster__name="two-rtxpro-servers")
    worker = model.workers.order_by("node__hostname", "name").first()
    return Plan.objects.create(
        cluster=model.cluster, served_model=model, current_layout="A8", target_layout="1P:7D",
        explanation="transfer of a 4,000-token prompt over 100 G TCP takes 53 ms",
        diff=[{"worker_id": worker.pk, "worker": worker.name, "node": worker.node.hostname,
               "from_role": "both", "to_role": "prefill", "done": False}],
        predictions={"candidates": [{"layout": "A8", "ttft_p95_s": 0.5, "itl_p95_s": 0.04,
                                     "kv_capacity_seqs": 96, "goodput_per_gpu": 0.1,
                                     "meets_slo": True}]},
    )


def test_operator_approves_a_plan_viewer_cannot(client, fleet):
    plan = _proposed_plan()
    login(client, "viewer")
    page = client.get("/models/").content.decode()
    assert "53 ms" in page and ">approve</button>" not in page
    assert client.post(f"/plans/{plan.pk}/approve").status_code == 403
    plan.refresh_from_db()
    assert plan.status == "proposed"

    login(client, "operator")
    assert ">approve</button>" in client.get("/plans/").content.decode()
    response = client.post(f"/plans/{plan.pk}/approve", {"next": "https://evil.example/"})
    assert response.status_code == 302 and response["Location"] == "/plans/"
    plan.refresh_from_db()
    assert plan.status in {"approved", "applying", "applied"}
    again = client.post(f"/plans/{plan.pk}/approve", follow=True).content.decode()
    assert "only proposed plans can be approved" in again


def test_policies_page_shows_sources_and_operators_edit_with_inline_errors(client, fleet):
    from controlplane.policies.models import Policy
    from controlplane.topology.models import ServedModel

    model = ServedModel.objects.get(cluster__name="two-rtxpro-servers")
    edit_url = f"/policies/two-rtxpro-servers/models/{model.pk}/edit"
    login(client, "viewer")
    page = client.get("/policies/").content.decode()
    assert "ttft_p95_ms" in page and "cluster" in page and "default" in page
    assert "edit override" not in page
    assert client.get(edit_url).status_code == 403

    login(client, "operator")
    form = client.get(edit_url).content.decode()
    assert 'name="ttft_p95_ms"' in form
    bad = client.post(edit_url, {"attainment": "1.5", "ttft_p95_ms": "800"})
    assert bad.status_code == 200
    assert "must be in (0, 1]" in bad.content.decode()
    assert not Policy.objects.filter(served_model=model).exists()
    # Valid alone, contradictory once merged with the cluster default.
    Policy.objects.filter(cluster=model.cluster, served_model=None).update(max_decode_workers=2)
    clash = client.post(edit_url, {"min_decode_workers": "3"}).content.decode()
    assert "exceeds max_decode_workers" in clash
    ok = client.post(edit_url, {"ttft_p95_ms": "800"})
    assert ok.status_code == 302
    assert Policy.objects.get(served_model=model).ttft_p95_ms == 800
    page = client.get("/policies/").content.decode()
    assert ('<tr class="src-model"><td>TTFT target (p95) <code class="key">ttft_p95_ms</code>'
            '</td><td class="val">800 ms</td><td>model override</td>') in page
    assert "Unknown" not in client.get(edit_url).content.decode()


def test_applied_role_changes_appear_on_the_models_timeline(client, fleet):
    from django.utils import timezone

    plan = _proposed_plan()
    plan.status, plan.applied_at = "applied", timezone.now()
    plan.save()
    login(client, "viewer")
    page = client.get("/models/").content.decode()
    assert 'class="mark-applied"' in page
    assert f"#{plan.pk} A8 → 1P:7D (applied)" in page
