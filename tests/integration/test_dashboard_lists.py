"""Plans and audit lists: the API's FilterSets, paging that keeps filters, a timeline;
routing history as readable diffs."""

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from controlplane.accounts.access import set_role
from controlplane.api.filters import filterset_for
from controlplane.api.views_planner import PlanViewSet
from controlplane.dashboard.routingview import change_lines
from controlplane.planner.models import Plan
from controlplane.topology.models import ServedModel

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer(client):
    call_command("load_sample_fleets", stdout=io.StringIO())
    user = get_user_model().objects.create_user("lists", password="pw-123456789")
    set_role(user, "viewer")
    client.force_login(user)
    return client


def _plans(n, status="proposed"):
    model = ServedModel.objects.get(cluster__name="two-rtxpro-servers")
    Plan.objects.bulk_create([
        Plan(cluster=model.cluster, served_model=model, current_layout="A8",
             target_layout=f"{i % 3 + 1}P:{7 - i % 3}D", status=status, explanation=f"p{i}")
        for i in range(n)])
    return model


def test_plans_page_filters_pages_and_keeps_filters_in_paging_links(viewer):
    model = _plans(30)
    _plans(4, status="rejected")
    html = viewer.get("/plans/").content.decode()
    assert "34 plans" in html and "page 1 of 2" in html and 'class="mark-proposed"' in html
    html = viewer.get("/plans/", {"status": "proposed", "served_model_id": model.pk}).content
    html = html.decode()
    assert "30 plans" in html
    assert f"status=proposed&amp;served_model_id={model.pk}&amp;page=2" in html
    page2 = viewer.get("/plans/", {"status": "proposed", "page": 2}).content.decode()
    assert page2.count('<section class="card">') == 5
    assert "4 plans" in viewer.get("/plans/?status=rejected").content.decode()
    # Bad filter values are shown inline, typed like the API's 400, never a 500.
    bad = viewer.get("/plans/?served_model_id=abc&status=nope")
    assert bad.status_code == 200 and 'class="errorlist"' in bad.content.decode()


def test_ui_and_api_share_one_filterset_class():
    assert filterset_for(Plan, PlanViewSet.filter_fields) is filterset_for(
        Plan, dict(PlanViewSet.filter_fields))


def test_audit_filters_and_paging(viewer):
    html = viewer.get("/changelog/", {"actor_kind": "user", "since": "2000-01-01T00:00"})
    assert html.status_code == 200
    bad = viewer.get("/changelog/", {"since": "yesterday"}).content.decode()
    assert 'class="errorlist"' in bad and "ISO 8601" in bad


def test_routing_history_reads_as_diffs():
    changes = [
        {"kind": "worker_changed", "model": "m", "worker": "n1/e0", "field": "kv_paths",
         "old": ["a", "b"], "new": ["a", "c", "d"]},
        {"kind": "worker_changed", "model": "m", "worker": "n1/e0", "field": "role",
         "old": "both", "new": "prefill"},
        {"kind": "worker_changed", "model": "m", "worker": "n1/e1", "field": "capacity",
         "old": {"weight": 0.4}, "new": {"weight": 0.6}},
    ]
    lines = change_lines(changes)
    assert [x["what"] for x in lines] == ["role", "capacity", "kv_paths"]
    assert lines[0]["detail"] == "both → prefill"
    assert lines[1]["detail"] == "weight 0.4 → 0.6"
    assert lines[2]["detail"] == "+2 / −1 (now 3)"


def test_topology_filterset_role_draining_and_not_monitored(viewer):
    from controlplane.topology.models import Node, Worker

    worker = Worker.objects.filter(node__hostname="rtxpro-01").first()
    Worker.objects.filter(pk=worker.pk).update(state="draining")
    html = viewer.get("/?role=draining").content.decode()
    assert "rtxpro-01" in html and "rtxpro-02" not in html
    Node.objects.exclude(hostname="rtxpro-02").update(status="online")
    html = viewer.get("/?status=not-monitored").content.decode()
    assert "rtxpro-02" in html and "rtxpro-01" not in html


def test_whatif_infeasible_answer_leads_with_the_binding_constraint(viewer):
    answer = viewer.get("/models/whatif", {
        "gpu": "RTX PRO 6000", "model": "llama-3.3-70b-fp8", "nodes": 2, "gpus_per_node": 8,
        "nic_gbps": 100, "isl": 4000, "osl": 300, "rate_rps": 4, "ttft_slo_ms": 2500,
        "itl_slo_ms": 50,
    }).content.decode()
    head = answer.index("No layout meets the targets.")
    binding = answer.index("<b>Binding: the ITL target 50 ms is below the batch-1 decode step")
    assert head < binding < answer.index('<table class="candidates">')


def test_live_views_plain_dict_query_filters_like_a_querydict(viewer):
    from controlplane.api.filters import apply_filters

    _plans(3)
    _plans(2, status="rejected")
    plans, errors = apply_filters(Plan.objects.all(), PlanViewSet.filter_fields,
                                  {"status": "rejected"})
    assert errors == {} and plans.count() == 2
