"""The dashboard in headless Chromium against a live ASGI server and real Redis."""

import io
from concurrent.futures import ThreadPoolExecutor

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.core.management import call_command

from controlplane.accounts.access import set_role
from controlplane.dashboard.consumers import cluster_group
from controlplane.topology.models import Node

from .conftest import WAIT_MS, login, screenshot

pytestmark = pytest.mark.browser

PASSWORD = "correct-horse-battery"


def hint_nodes_changed(cluster_id: int, node_ids: list[int]) -> None:
    """What the ingest does after writing hot state (from a thread: Playwright owns a loop)."""
    message = {"type": "telemetry.changed", "node_ids": node_ids}
    send = async_to_sync(get_channel_layer().group_send)
    with ThreadPoolExecutor(1) as pool:
        pool.submit(send, cluster_group(cluster_id), message).result(timeout=WAIT_MS / 1000)


def make_user(role: str):
    user = get_user_model().objects.create_user(f"{role}1", password=PASSWORD)
    set_role(user, role)
    return user


def test_topology_renders_and_a_stale_node_greys_out_live(asgi_server, page):
    call_command("load_sample_fleets", stdout=io.StringIO())
    make_user("viewer")
    login(page, asgi_server, "viewer1", PASSWORD)
    assert page.locator(".gpu").count() == 48
    page.wait_for_selector("#live-status.on", timeout=WAIT_MS)
    screenshot(page, "topology")

    node = Node.objects.get(hostname="rtxpro-01")
    assert "stale" not in (page.get_attribute(f"#node-{node.pk}", "class") or "")
    Node.objects.filter(pk=node.pk).update(status="stale")
    hint_nodes_changed(node.cluster_id, [node.pk])
    page.wait_for_selector(f"#node-{node.pk}.stale", timeout=WAIT_MS)
    assert "last seen" in page.inner_text(f"#node-{node.pk} .seen")
    screenshot(page, "topology-stale-node")


def test_viewer_sees_no_drain_button_operator_does(asgi_server, page):
    call_command("load_sample_fleets", stdout=io.StringIO())
    make_user("viewer")
    make_user("operator")
    node = Node.objects.get(hostname="h200nvl-01")
    login(page, asgi_server, "viewer1", PASSWORD)
    page.goto(f"{asgi_server}/nodes/{node.pk}/")
    assert page.locator("button:has-text('drain')").count() == 0

    page.context.clear_cookies()
    login(page, asgi_server, "operator1", PASSWORD)
    page.goto(f"{asgi_server}/nodes/{node.pk}/")
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator("#engine-{} button:has-text('drain')".format(
        node.workers.get(name="engine-0").pk)).click()
    page.wait_for_selector("text=Drain requested")
    assert node.workers.get(name="engine-0").state == "draining"
    screenshot(page, "node-page-drained")


def test_operator_approves_a_plan_in_the_browser_viewer_cannot(asgi_server, page):
    from controlplane.planner.models import Plan
    from controlplane.topology.models import ServedModel

    call_command("load_sample_fleets", stdout=io.StringIO())
    make_user("viewer")
    make_user("operator")
    model = ServedModel.objects.get(cluster__name="two-rtxpro-servers")
    plan = Plan.objects.create(
        cluster=model.cluster, served_model=model, current_layout="aggregated",
        target_layout="2P:6D", explanation="long prompts push ITL p95 over 50 ms → split",
        diff=[],
    )
    login(page, asgi_server, "viewer1", PASSWORD)
    page.goto(f"{asgi_server}/models/")
    assert "long prompts push ITL" in page.inner_text(f"#plan-{plan.pk}")
    assert page.locator(f"#plan-{plan.pk} button.approve").count() == 0

    page.context.clear_cookies()
    login(page, asgi_server, "operator1", PASSWORD)
    page.goto(f"{asgi_server}/models/")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click(f"#plan-{plan.pk} button.approve")
    page.wait_for_selector(f"text=Plan #{plan.pk} approved")
    plan.refresh_from_db()
    assert plan.status != "proposed" and plan.decided_by.username == "operator1"
    screenshot(page, "plan-approved")


def test_falls_back_to_polling_when_websockets_fail(asgi_server, page):
    """A proxy that refuses websocket upgrades: the page polls the same fragments instead."""
    call_command("load_sample_fleets", stdout=io.StringIO())
    make_user("viewer")
    page.route_web_socket("**/ws/live/**", lambda ws: ws.close())
    login(page, asgi_server, "viewer1", PASSWORD)
    page.wait_for_selector("#live-status.poll", timeout=WAIT_MS)
    node = Node.objects.get(hostname="rtxpro-02")
    Node.objects.filter(pk=node.pk).update(status="stale")
    # No hint is needed: polling re-reads every node the page shows.
    page.wait_for_selector(f"#node-{node.pk}.stale", timeout=WAIT_MS)
    screenshot(page, "topology-polling-fallback")
