"""The decision view during a real move: a real planning cycle (controlplane.planner.service
with hot state in real Redis, as tests/integration/test_planner_apply.py seeds it) proposes a
multi-step move; step 1 is approved, drained and applied by the real apply code; the next
real cycle continues the move. Chromium, against a real ASGI server on the same database,
shows "step k of n", the chart, and the measured markers on the applied plan.

Not the demo's processes (agents, simulated engines, Celery beat): those need minutes of
warm-up on this box; the planner, apply and page code here are the same ones."""

import io
import time
import uuid

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from controlplane.accounts.access import set_role
from controlplane.planner import apply
from controlplane.planner.models import ModelPlannerState, PlanStatus
from controlplane.planner.service import approve_plan, run_planning
from controlplane.policies.models import Policy
from controlplane.telemetry import hotstate
from controlplane.topology.models import Cluster
from tests.integration.test_planner_apply import rag_load, write_hot_state

from .conftest import ARTIFACTS, WAIT_MS, login, screenshot

pytestmark = pytest.mark.browser

PASSWORD = "correct-horse-battery"


@pytest.fixture
def redis_prefix(settings):
    settings.TELEMETRY_REDIS_PREFIX = f"test:decision:{uuid.uuid4().hex[:8]}:"
    yield
    client = hotstate.sync_redis()
    for key in client.scan_iter(settings.TELEMETRY_REDIS_PREFIX + "*"):
        client.delete(key)


def _cluster():
    call_command("load_sample_fleets", stdout=io.StringIO())
    cluster = Cluster.objects.get(name="four-h200nvl-servers")
    Policy.objects.update_or_create(
        cluster=cluster, served_model=None,
        defaults={"ttft_p95_ms": 2500, "itl_p95_ms": 50, "cooldown_s": 0,
                  "max_changes_per_cycle": 2, "overload_change_share": 0,
                  "rebalancing_mode": "recommend"})
    for sm in cluster.served_models.all():
        ModelPlannerState.objects.update_or_create(
            served_model=sm, defaults={"expected_output_tokens": 300})
    return cluster


def test_decision_view_during_a_real_move(asgi_server, page, redis_prefix):
    cluster = _cluster()
    user = get_user_model().objects.create_user("operator1", password=PASSWORD)
    set_role(user, "operator")

    # Cycle 1 proposes a move of more steps than one cycle may take.
    write_hot_state(cluster, rag_load)
    (first,) = run_planning(cluster)
    assert first.status == PlanStatus.PROPOSED and first.target_layout != "aggregated"
    # Step 1: approve, drain, apply (a fresh report with no work in flight ends the drain).
    approve_plan(first.pk, user)
    write_hot_state(cluster, lambda w: {**rag_load(w), "running": 0, "waiting": 0},
                    received_at=time.time() + 1)
    assert apply.advance(first.pk).status == PlanStatus.APPLIED
    # Cycle 2 sees the move under way and proposes its next step.
    write_hot_state(cluster, rag_load, received_at=time.time() + 2)
    (second,) = run_planning(cluster)
    move = (second.record.get("observe") or {}).get("move")
    assert move and move["step"] >= 2 and move["steps_total"] >= move["step"], second.record

    login(page, asgi_server, "operator1", PASSWORD)
    page.goto(f"{asgi_server}/plans/")
    # The page is live: wait for the socket's first message, so the regions below are not
    # replaced while they are read and photographed. Its status fragment ("on") comes in
    # one message with every region (dashboard/consumers.py); later ones carry only what
    # changed, and nothing does here.
    page.wait_for_selector("#live-status.on", timeout=WAIT_MS)
    head = page.inner_text(f"#plan-{second.pk} .progress")
    assert f"step {move['step']} of {move['steps_total']}" in head, head
    assert page.locator(f"#plan-{second.pk} .dchart").count() == 3
    assert page.locator(f"#plan-{second.pk} line.slo").count() == 2
    # The applied first step: what cycle 2 measured on the layout it left, as markers.
    measured = page.inner_text(f"#plan-{first.pk} .measured-line")
    assert "since applied" in measured and "req/s served" in measured, measured
    # Mid-move the running layout ("2P + 1D + 29 both") is no candidate of the first plan,
    # so the first plan says it in text; the second plan decided from that layout and draws
    # what was measured on it beside its prediction (hollow markers), one per chart.
    assert page.locator(f"#plan-{second.pk} path.measured.then").count() == 3
    assert "measured when decided" in page.inner_text(f"#plan-{second.pk} .legend-small")
    ARTIFACTS.mkdir(exist_ok=True)
    page.set_viewport_size({"width": 1440, "height": 900})
    page.screenshot(path=str(ARTIFACTS / "decision-view-move.png"))
    page.locator(f"#plan-{second.pk}").screenshot(
        path=str(ARTIFACTS / "decision-view-move-plan.png"))
    page.locator(f"#plan-{first.pk}").screenshot(
        path=str(ARTIFACTS / "decision-view-applied-measured.png"))

    # The models page: the history of layout and measured p95 vs target.
    page.goto(f"{asgi_server}/models/")
    model_id = second.served_model_id
    history = page.locator(f"#model-{model_id} figure.history")
    assert "planner observation" in history.inner_text()
    assert history.locator("rect.band").count() >= 1
    assert history.locator("line.slo").count() == 2
    screenshot(page, "models-history")
