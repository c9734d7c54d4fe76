"""The models page's layout / measured-p95 history and the decision view's measured markers,
from plans and planner records stored in PostgreSQL."""

import io
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone

from controlplane.accounts.access import set_role
from controlplane.dashboard.decision import measured_after_apply
from controlplane.planner.models import ModelPlannerState, Plan
from controlplane.topology.models import ServedModel

pytestmark = pytest.mark.django_db


def _observe(layout, ttft_ms, itl_ms, rate=2.0):
    return {"observe": {"layout_label": layout, "measured_ttft_p95_ms": ttft_ms,
                        "measured_itl_p95_ms": itl_ms, "rate_rps": rate,
                        "ttft_target_ms": 2500, "itl_target_ms": 50}}


@pytest.fixture
def model():
    call_command("load_sample_fleets", stdout=io.StringIO())
    return ServedModel.objects.get(cluster__name="two-rtxpro-servers")


def _plan(model, created, record, **kw):
    plan = Plan.objects.create(cluster=model.cluster, served_model=model, record=record,
                               current_layout="aggregated", target_layout="2P:14D", **kw)
    Plan.objects.filter(pk=plan.pk).update(created=created)
    plan.refresh_from_db()
    return plan


def test_models_page_draws_layout_bands_and_p95_lines_with_targets(client, model):
    now = timezone.now()
    _plan(model, now - timedelta(hours=3), _observe("aggregated", 900, 54))
    _plan(model, now - timedelta(hours=2), _observe("aggregated", 950, 56))
    _plan(model, now - timedelta(hours=9), _observe("old", 1, 1))  # outside the window
    ModelPlannerState.objects.update_or_create(
        served_model=model, defaults={"last_run_at": now - timedelta(minutes=1),
                                      "last_record": _observe("2P:14D", 1200, 31)})
    user = get_user_model().objects.create_user("v", password="pw-123456789")
    set_role(user, "viewer")
    client.force_login(user)
    html = client.get("/models/").content.decode()
    section = html.split(f'id="model-{model.pk}"', 1)[1].split("</section>", 1)[0]
    assert "3 planner observations" in section
    assert "<title>aggregated</title>" in section and "<title>2P:14D</title>" in section
    assert "<title>old</title>" not in section
    assert section.count('class="slo"') >= 2  # both targets drawn
    assert "2 over" in section  # two ITL points above 50 ms
    assert "31 ms" in section  # the latest ITL p95


def test_an_applied_plan_is_measured_by_the_next_observation(model):
    applied_at = timezone.now() - timedelta(minutes=30)
    plan = _plan(model, applied_at - timedelta(minutes=5), _observe("aggregated", 900, 54),
                 status="applied", applied_at=applied_at)
    assert measured_after_apply(plan) is None  # nothing observed since
    ModelPlannerState.objects.update_or_create(
        served_model=model, defaults={"last_run_at": timezone.now(),
                                      "last_record": _observe("2P:14D", 1500, 40, 3.0)})
    assert measured_after_apply(plan)["itl_p95_s"] == 0.04
    # A later stored plan is the first observation after the apply: it wins.
    _plan(model, applied_at + timedelta(minutes=2), _observe("2P:14D", 1100, 33, 3.5))
    measured = measured_after_apply(plan)
    assert (measured["layout"], measured["ttft_p95_s"], measured["rate_rps"]) == \
        ("2P:14D", 1.1, 3.5)
    assert measured_after_apply(_plan(model, timezone.now(), {})) is None  # not applied


def test_an_applied_plan_with_nothing_measured_yet_says_so(model):
    from django.template.loader import render_to_string

    applied_at = timezone.now() - timedelta(seconds=30)
    plan = _plan(model, applied_at - timedelta(seconds=30), _observe("aggregated", 900, 54),
                 status="applied", applied_at=applied_at)
    ModelPlannerState.objects.update_or_create(
        served_model=model, defaults={"last_run_at": timezone.now(),
                                      "last_record": _observe("2P:14D", None, None, 0.0)})
    html = render_to_string("dashboard/_plan.html", {"plan": plan})
    line = html[html.index('class="measured-line"'):]
    assert "since applied: no request measured yet · 0.00 req/s served" in line
    assert "no data" not in line[:line.index("</p>")]
