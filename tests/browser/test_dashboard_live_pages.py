"""Every page that shows changing state updates in Chromium without a reload: models,
plans, routing, alerts and node pages, and the rack tiles of a big fleet."""

import io
import re

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone
from playwright.sync_api import Error as PlaywrightError

from controlplane.accounts.access import set_role
from controlplane.topology.models import Cluster, Node, ServedModel, Worker

from .conftest import WAIT_MS, login, screenshot

pytestmark = pytest.mark.browser

PASSWORD = "correct-horse-battery"


def _operator():
    user = get_user_model().objects.create_user("operator1", password=PASSWORD)
    set_role(user, "operator")
    return user


def _wait_live(page):
    page.wait_for_selector("#live-status.on", timeout=WAIT_MS)
    page.wait_for_function(
        "() => /updated \\d+ s ago/.test(document.getElementById('live-ago').textContent)")


def _new_plan(marker):
    from controlplane.planner.models import Plan

    model = ServedModel.objects.get(cluster__name="two-rtxpro-servers")
    return Plan.objects.create(cluster=model.cluster, served_model=model,
                               current_layout="A8", target_layout="2P:6D",
                               explanation=marker, diff=[])


@pytest.mark.parametrize("path,name", [("/plans/", "plans"), ("/models/", "models")])
def test_plans_and_models_pages_show_a_new_plan_without_reload(asgi_server, page, path, name):
    call_command("load_sample_fleets", stdout=io.StringIO())
    _operator()
    login(page, asgi_server, "operator1", PASSWORD)
    page.goto(asgi_server + path)
    _wait_live(page)
    plan = _new_plan(f"live {name} marker")
    page.wait_for_selector(f"#plan-{plan.pk}", timeout=WAIT_MS)
    assert f"live {name} marker" in page.inner_text(f"#plan-{plan.pk}")
    screenshot(page, f"{name}-live")


def test_routing_page_shows_a_new_table_version(asgi_server, page):
    from controlplane.routing.models import RoutingTableVersion

    call_command("load_sample_fleets", stdout=io.StringIO())
    _operator()
    login(page, asgi_server, "operator1", PASSWORD)
    page.goto(asgi_server + "/tables/")
    _wait_live(page)
    cluster = Cluster.objects.get(name="two-rtxpro-servers")
    RoutingTableVersion.objects.create(cluster=cluster, version=41, body={"version": 41},
                                       cause="browser test", actor="test")
    page.wait_for_selector("#routing-live >> text=v41", timeout=WAIT_MS)
    screenshot(page, "routing-live")


def test_alerts_page_shows_a_new_alert(asgi_server, page):
    from controlplane.alerts.models import Alert

    call_command("load_sample_fleets", stdout=io.StringIO())
    _operator()
    login(page, asgi_server, "operator1", PASSWORD)
    page.goto(asgi_server + "/alerts/")
    _wait_live(page)
    now = timezone.now()
    Alert.objects.create(fingerprint="b" * 16, rule="GpuMemoryHigh", severity="warning",
                         status="firing", is_open=True,
                         labels={"cluster": "two-rtxpro-servers", "node": "rtxpro-01"},
                         annotations={"summary": "GPU 0 on rtxpro-01 memory at 97%"},
                         group_key="g", active_since=now, starts_at=now, last_evaluated_at=now)
    page.wait_for_selector("#alerts-live >> text=memory at 97%", timeout=WAIT_MS)
    screenshot(page, "alerts-live")


def test_node_page_shows_a_drain_started_elsewhere(asgi_server, page):
    call_command("load_sample_fleets", stdout=io.StringIO())
    _operator()
    node = Node.objects.get(hostname="h200nvl-01")
    worker = node.workers.get(name="engine-0")
    login(page, asgi_server, "operator1", PASSWORD)
    page.goto(f"{asgi_server}/nodes/{node.pk}/")
    _wait_live(page)
    Worker.objects.filter(pk=worker.pk).update(state="draining")
    page.wait_for_selector(f"#engine-{worker.pk} button:has-text('resume')", timeout=WAIT_MS)
    # The button that arrived live still works (its form carries a CSRF token).
    page.once("dialog", lambda dialog: dialog.accept())
    page.click(f"#engine-{worker.pk} button:has-text('resume')")
    page.wait_for_selector("text=Resume requested")
    screenshot(page, "node-live")


def _report_utilisation(cluster, nodes):
    """Hot state as if every node's agent had just reported (utilisation varies)."""
    import time

    import orjson

    from controlplane.telemetry import hotstate

    now = time.time()
    hotstate.sync_redis().hset(hotstate.Keys().cluster(cluster.pk), mapping={
        f"n:{n.pk}": orjson.dumps({"node_id": n.pk, "received_at": now, "interval_s": 60.0,
                                   "gpus": [{"index": 0, "utilization": (i * 37 % 100) / 100}],
                                   "nics": []})
        for i, n in enumerate(nodes)})


def test_decision_view_reads_in_one_line_with_a_chart(asgi_server, page):
    from controlplane.planner.models import Plan

    call_command("load_sample_fleets", stdout=io.StringIO())
    _operator()
    model = ServedModel.objects.get(cluster__name="two-rtxpro-servers")
    candidates = [("aggregated", 0.29, 0.9, 0.054), ("1P:15D", 2.1, 1.9, 0.046),
                  ("2P:14D", 3.9, 1.2, 0.041), ("3P:13D", 3.7, 0.8, 0.043),
                  ("4P:12D", 3.1, 0.7, 0.047)]
    plan = Plan.objects.create(
        cluster=model.cluster, served_model=model, current_layout="aggregated",
        target_layout="2P:14D", current_goodput_rps=0.29, predicted_goodput_rps=3.9,
        explanation=("llama-3.3-70b-fp8 on 16 worker(s) (RTX PRO 6000, TP1), aggregated: "
                     "4.0 req/s now; prompts 4,000 tokens, answers 300. "
                     "Now aggregated: a batch-1 decode step of 54 ms is over the 50 ms ITL "
                     "target. Binding constraint of 2P:14D: decode. "
                     "→ move toward 2P:14D (predicted goodput 3.9 req/s vs 0.29 req/s now): "
                     "rtxpro-01/engine-0 both→prefill, rtxpro-01/engine-1 both→prefill."),
        predictions={"candidates": [
            {"layout": lay, "goodput_rps": g, "ttft_p95_s": t, "itl_p95_s": i}
            for lay, g, t, i in candidates]},
        record={"action": "change", "choose": {"binding": "decode step time (ITL)"},
                "observe": {"ttft_target_ms": 2500, "itl_target_ms": 50}},
        diff=[{"worker": "engine-0", "node": "rtxpro-01", "from_role": "both",
               "to_role": "prefill", "done": False}],
    )
    login(page, asgi_server, "operator1", PASSWORD)
    page.goto(f"{asgi_server}/plans/")
    # The page is live: let the socket connect and send its first fragments, so the plan's
    # region is not swapped out while it is read and photographed (seen: "Element is not
    # attached to the DOM" from the element screenshot under load).
    page.wait_for_selector("#live-status.on", timeout=WAIT_MS)
    page.wait_for_timeout(1500)
    verdict = page.inner_text(f"#plan-{plan.pk} .verdict")
    assert verdict.startswith("Move toward 2P:14D")
    assert "decode step time" in page.inner_text(f"#plan-{plan.pk} .binding")
    assert page.locator(f"#plan-{plan.pk} .dchart").count() == 3
    assert page.locator(f"#plan-{plan.pk} line.slo").count() == 2
    for attempt in range(3):  # a live swap mid-screenshot detaches the element: take it anew
        try:
            page.locator(f"#plan-{plan.pk}").screenshot(path=str(screenshot_path("decision-view")))
            break
        except PlaywrightError:
            if attempt == 2:
                raise
            page.wait_for_timeout(500)


def screenshot_path(name):
    from .conftest import ARTIFACTS

    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS / f"{name}.png"


def test_big_fleet_shows_rack_tiles_that_drill_down(asgi_server, page):
    from tests.integration.test_dashboard_live_pages import _big_fleet

    _user, cluster, nodes = _big_fleet(racks=12, per_rack=16)
    _report_utilisation(cluster, nodes)
    login(page, asgi_server, "big-viewer", "pw-123456789")
    page.wait_for_selector("#live-status.on", timeout=WAIT_MS)
    assert page.locator(".rack-tile").count() == 12
    assert page.locator(".rack-tile .cells a").count() == 12 * 16
    screenshot(page, "topology-racks")
    page.click(".rack-tile >> nth=2 >> header a")
    page.wait_for_selector(".node")
    assert page.locator(".node").count() == 16
    assert re.search(r"rack=r\d+", page.url)
    screenshot(page, "topology-rack-drilldown")


def test_plans_list_pages_with_filters_kept(asgi_server, page):
    from controlplane.planner.models import Plan

    call_command("load_sample_fleets", stdout=io.StringIO())
    _operator()
    model = ServedModel.objects.get(cluster__name="two-rtxpro-servers")
    Plan.objects.bulk_create([Plan(cluster=model.cluster, served_model=model,
                                   current_layout="A8", target_layout="1P:7D",
                                   status="rejected", explanation=f"plan {i}")
                              for i in range(30)])
    login(page, asgi_server, "operator1", PASSWORD)
    page.goto(f"{asgi_server}/plans/?status=rejected")
    assert "30 plans" in page.inner_text("#plans-live")
    page.click("#plans-live a.older")
    page.wait_for_url("**page=2")
    assert "status=rejected" in page.url and "page 2 of 2" in page.inner_text("#plans-live")
    screenshot(page, "plans-paged")


def test_whatif_infeasible_answer_in_the_browser(asgi_server, page):
    call_command("load_sample_fleets", stdout=io.StringIO())
    _operator()
    login(page, asgi_server, "operator1", PASSWORD)
    page.goto(f"{asgi_server}/models/")
    page.select_option("select[name=gpu]", label="RTX PRO 6000")
    page.select_option("select[name=model]", label="llama-3.3-70b-fp8")
    for name, value in (("nodes", "2"), ("gpus_per_node", "8"), ("nic_gbps", "100"),
                        ("isl", "4000"), ("osl", "300"), ("rate_rps", "4"),
                        ("ttft_slo_ms", "2500"), ("itl_slo_ms", "50")):
        page.fill(f"input[name={name}]", value)
    page.click(".whatif-form button[type=submit]")
    page.wait_for_selector("#whatif-answer .infeasible")
    text = page.inner_text("#whatif-answer .infeasible")
    assert text.startswith("No layout meets the targets.")
    assert "Binding: the ITL target 50 ms is below the batch-1 decode step" in text
    page.locator("#whatif").screenshot(path=str(screenshot_path("whatif-infeasible")))
