"""Planner end to end: simulated node + real agent + ASGI server + Celery worker + gateway.

A policy that requires one prefill worker makes the planner propose a role change from the
agents' hot state; approving it drains the worker (table republished and pushed to the
gateway with the worker ``draining``), the next agent report shows it idle, the worker takes
the prefill role (``set_role`` travels through the agent to the simulated engine, whose
report then shows the new role), and the gateway's table follows.

The load shift of the issue (short chat → long-prompt RAG making the planner split on its
own) is covered by the unit tests and bench/planner_quality.py, not here: with engines in
real time on a 2-core CI box it would take minutes and depend on timing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
from django.db import connection

from controlplane.planner import apply
from controlplane.planner.models import PlanStatus
from controlplane.planner.service import approve_plan, run_planning
from controlplane.policies.models import Policy
from controlplane.routing.service import latest_table
from controlplane.telemetry import hotstate
from controlplane.telemetry.tokens import issue_token
from controlplane.topology.models import Cluster, Gateway, Node, ServedModel, Worker
from tests.conftest import ROOT, free_port, python_env, stop_process
from tests.integration.gateway.conftest import CeleryWorker, GatewayProcess
from tests.integration.test_agent_sim import Server, database_url, one_node_fleet, wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
    pytest.mark.skipif(connection.vendor != "postgresql",
                       reason="the Celery worker and the server need a shared database"),
]

MODEL = "llama-3.1-8b"
HOST = "sim-planner-1"


def table_roles(table: dict) -> dict[str, tuple[str, str]]:
    out = {}
    for model in table.get("models") or []:
        for w in model.get("workers") or []:
            out[w["id"]] = (w.get("role"), w.get("state"))  # id = "<node>/<engine>"
    return out


def test_plan_approve_drain_switch_and_gateway_follows(tmp_path, settings):
    prefix = f"test:{uuid.uuid4().hex[:8]}:"
    settings.TELEMETRY_REDIS_PREFIX = prefix
    queue = f"planner-e2e-{uuid.uuid4().hex[:8]}"
    settings.ROUTING_PUSH_QUEUE = queue

    fleet = one_node_fleet(HOST, 4, 1.0)
    (tmp_path / "fleet.json").write_text(json.dumps(fleet))
    endpoints = tmp_path / "endpoints.json"

    cluster = Cluster.objects.create(name="planner-e2e")
    ServedModel.objects.create(cluster=cluster, name=MODEL, layers=32, kv_heads=8,
                               head_dim=128, kv_dtype_bytes=2, weight_bytes=16 * 10**9)
    Policy.objects.create(cluster=cluster, disaggregation_mode="disaggregated",
                          min_prefill_workers=1, cooldown_s=0, max_changes_per_cycle=1,
                          rebalancing_mode="recommend")
    node = Node.objects.create(cluster=cluster, hostname=HOST)
    (tmp_path / "token").write_text(issue_token(node))

    env = python_env(DATABASE_URL=database_url(), PDPLANE_TELEMETRY_PREFIX=prefix,
                     PDPLANE_REPORT_INTERVAL_S="0.5", PDPLANE_AGENT_MAX_REPORTS_PER_S="20")
    procs: list[subprocess.Popen] = []
    server = Server(env, free_port(), tmp_path / "server.log")
    gw = GatewayProcess(tmp_path)
    celery = CeleryWorker(queue, tmp_path / "celery.log")
    try:
        with open(tmp_path / "sim.log", "w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "workers_agent.sim.cli", "run", "--config",
                 str(tmp_path / "fleet.json"), "--endpoints-out", str(endpoints),
                 "--in-process"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))
        wait_until(endpoints.exists, 60, what="sim endpoints")
        sim = json.loads(endpoints.read_text())
        server.start()
        gw.start(wait_healthy=False)
        celery.start()
        Gateway.objects.create(cluster=cluster, name="gw1", url=gw.url, secret=gw.secret)
        with open(tmp_path / "agent.log", "w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "workers_agent.cli", "--server",
                 f"ws://127.0.0.1:{server.port}/ws/agent/v1/", "--token-file",
                 str(tmp_path / "token"), "--hostname", HOST, "--sim-node-url",
                 sim["nodes"][0]["telemetry_url"]],
                cwd=ROOT, env=python_env(), stdout=log, stderr=subprocess.STDOUT))

        # Agents report: workers exist (with GPUs) and their hot state is fresh.
        wait_until(lambda: Worker.objects.filter(node=node).count() == 4, 40, what="workers")
        ids = list(Worker.objects.filter(node=node).values_list("pk", flat=True))
        wait_until(lambda: all((s := hotstate.worker_state(i)) and not s["stale"] for i in ids),
                   20, what="fresh hot state")

        # 1. The planner proposes (the policy requires a prefill worker).
        plans = run_planning(cluster)
        assert len(plans) == 1, "expected one plan"
        plan = plans[0]
        assert plan.status == PlanStatus.PROPOSED and plan.explanation
        to_prefill = [d for d in plan.diff if d["to_role"] == "prefill"]
        assert len(to_prefill) == 1
        target = Worker.objects.get(pk=to_prefill[0]["worker_id"])

        # 2. Approve: the worker drains, the table is republished and reaches the gateway.
        applying = approve_plan(plan.pk)
        assert applying.status in (PlanStatus.APPLYING, PlanStatus.APPLIED)
        row = Gateway.objects.get(cluster=cluster)
        first = latest_table(cluster.pk)
        key = f"{HOST}/{target.name}"
        if applying.status == PlanStatus.APPLYING:
            assert table_roles(first.body)[key] == ("both", "draining")
        wait_until(lambda: Gateway.objects.get(pk=row.pk).applied_table_version >= first.version,
                   40, what=f"gateway ACK; celery log: {celery.tail()}")

        # 3. A fresh agent report shows no work: the worker switches, the plan completes.
        done = wait_until(
            lambda: (p := apply.advance(plan.pk)).status == PlanStatus.APPLIED and p, 30,
            what="drain to complete")
        assert done.applied_at is not None
        target.refresh_from_db()
        assert (target.desired_role, target.state) == ("prefill", "active")
        assert target.generation >= 2

        # 4. set_role reached the engine through the agent; the gateway has the new table.
        wait_until(lambda: (hotstate.worker_state(target.pk) or {}).get("role") == "prefill",
                   20, what="engine to report the prefill role")
        final = latest_table(cluster.pk)
        assert table_roles(final.body)[key] == ("prefill", "active")
        wait_until(lambda: Gateway.objects.get(pk=row.pk).applied_table_version == final.version,
                   40, what=f"gateway to apply the final table; celery log: {celery.tail()}")
        seen = gw.admin_table()
        assert seen["applied_version"] == final.version
        assert table_roles(seen["table"])[key] == ("prefill", "active")
    finally:
        for proc in reversed(procs):
            stop_process(proc)
        server.stop()
        gw.stop()
        celery.stop()
        client = hotstate.sync_redis()
        keys = list(client.scan_iter(prefix + "*"))
        if keys:
            client.delete(*keys)
