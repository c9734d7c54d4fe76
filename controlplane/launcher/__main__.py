"""`make run`: prepare the database, seed the fleets and run the whole demo.

Starts the ASGI server, a Celery worker and beat, a simulated fleet (3 nodes × 8 GPUs,
two models), one agent per simulated node, the gateway and a traffic generator whose mix
changes over time — the planner (in auto mode for the demo cluster) proposes and applies
role changes as it does. Embedded defaults (SQLite + private Redis) unless DATABASE_URL /
REDIS_URL are set. Prints the URL and an admin login; Ctrl-C stops every process.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from controlplane.core.wsprotocol import UVICORN_WS

ROOT = Path(__file__).resolve().parent.parent.parent


def step(message: str) -> None:
    print(f"[pdplane] {message}", flush=True)


def manage(*args: str) -> None:
    subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], check=True, cwd=ROOT)


def ensure_admin(var_dir: Path) -> tuple[str, str]:
    """Create the `admin` superuser once; its password lives in var/admin_password."""
    from django.contrib.auth import get_user_model

    password_file = var_dir / "admin_password"
    password = (password_file.read_text().strip() if password_file.exists()
                else secrets.token_urlsafe(12))
    user, created = get_user_model().objects.get_or_create(
        username="admin", defaults={"is_staff": True, "is_superuser": True}
    )
    if created or not password_file.exists():
        user.set_password(password)
        user.save()
        password_file.write_text(password)
        password_file.chmod(0o600)
    return "admin", password


def wait_until(check, timeout: float, what: str, sup=None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if sup is not None and sup.dead():
            break
        time.sleep(0.5)
    raise RuntimeError(f"timed out waiting for {what}")


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - our own http URL
            return resp.status == 200
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("PDPLANE_PORT", "8000")))
    parser.add_argument("--gateway-port", type=int,
                        default=int(os.environ.get("PDPLANE_GATEWAY_PORT", "8080")))
    parser.add_argument("--base-port", type=int,
                        default=int(os.environ.get("PDPLANE_DEMO_BASE_PORT", "18100")),
                        help="first of the simulated engines' ports (75 in a row)")
    parser.add_argument("--web-only", action="store_true",
                        help="serve the web app only: no simulated fleet, agents or traffic")
    parser.add_argument("--phases", default=os.environ.get("PDPLANE_DEMO_PHASES", ""),
                        help="traffic phases, e.g. chat=90,rag=120,quiet=60")
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    step("checking configuration (embedded SQLite + Redis unless DATABASE_URL/REDIS_URL set)")
    import django

    django.setup()
    from django.conf import settings

    var_dir = Path(settings.VAR_DIR)
    # pdplane's own /metrics, merged across the web, Celery and beat processes.
    prom_dir = var_dir / "prometheus-multiproc"
    shutil.rmtree(prom_dir, ignore_errors=True)
    prom_dir.mkdir(parents=True)
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(prom_dir), "PYTHONUNBUFFERED": "1"}
    if settings.EMBEDDED_REDIS:
        env["REDIS_URL"] = settings.REDIS_URL  # children share this process's private Redis

    step("applying database migrations")
    manage("migrate", "--no-input", "-v", "0")
    step("loading the sample fleets")
    manage("load_sample_fleets")
    username, password = ensure_admin(var_dir)

    from controlplane.launcher import demo
    from controlplane.launcher.supervisor import Supervisor, tail

    ports = demo.DemoPorts(web=args.port, gateway=args.gateway_port, base=args.base_port)
    check_ports = [args.port] if args.web_only else ports.all()
    taken = demo.busy_ports(check_ports)
    if taken:
        step(f"ports already in use: {taken[:10]} — stop what holds them or choose others "
             "(--port, --gateway-port, --base-port)")
        return 2

    seeded = None
    if not args.web_only:
        step("seeding the demo cluster (3 nodes × 8 simulated H200, two models)")
        seeded = demo.seed(ports, var_dir)

    sup = Supervisor(var_dir / "logs", env, ROOT)
    stopping = False

    def stop(*_):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    web_url = f"http://{args.host}:{args.port}"
    py = sys.executable
    try:
        step(f"starting the web server on {web_url}/")
        sup.start("web", [py, "-m", "uvicorn", "controlplane.asgi:application", "--host",
                          args.host, "--port", str(args.port), "--no-access-log",
                          "--log-level", "warning", "--ws", UVICORN_WS])
        wait_until(lambda: http_ok(f"http://127.0.0.1:{args.port}/healthz"), 90, "web", sup)
        if seeded:
            demo_dir = var_dir / "demo"
            step("starting a Celery worker and beat")
            sup.start("celery-worker", [py, "-m", "celery", "-A", "controlplane", "worker",
                                        "-P", "solo", "--loglevel", "WARNING"])
            sup.start("celery-beat", [py, "-m", "celery", "-A", "controlplane", "beat",
                                      "--loglevel", "WARNING", "--schedule",
                                      str(var_dir / "celerybeat-schedule")])
            step("starting the simulated fleet (24 engines)")
            endpoints = demo_dir / "endpoints.json"
            endpoints.unlink(missing_ok=True)
            sup.start("sim", [py, "-m", "workers_agent.sim.cli", "run", "--config",
                              str(seeded["fleet_file"]), "--endpoints-out", str(endpoints)])
            wait_until(endpoints.exists, 120, "the simulated fleet", sup)
            step("starting one agent per node")
            for i, host in enumerate(demo.NODES):
                sup.start(f"agent-{host}", [
                    py, "-m", "workers_agent.cli",
                    "--server", f"ws://127.0.0.1:{args.port}/ws/agent/v1/",
                    "--token-file", str(seeded["tokens"][host]), "--hostname", host,
                    "--sim-node-url", f"http://127.0.0.1:{ports.telemetry(i)}",
                    "--log-level", "WARNING",
                ])
            step("starting the gateway")
            sup.start("gateway", [
                py, "-m", "gateway", "--host", "127.0.0.1", "--port", str(args.gateway_port),
                "--control-plane", f"http://127.0.0.1:{args.port}", "--cluster", demo.CLUSTER,
                "--gateway-name", demo.GATEWAY_NAME,
                "--state-file", str(demo_dir / "gateway-table.json"),
            ], env={"PDPLANE_GATEWAY_SECRET": seeded["gateway_secret_file"].read_text().strip()})
            wait_until(lambda: http_ok(f"http://127.0.0.1:{args.gateway_port}/health"), 120,
                       "the gateway to load its first routing table", sup)
            step("starting demo traffic (chat → long-prompt RAG → quiet, repeating)")
            traffic_argv = [py, "-m", "controlplane.launcher.traffic", "--url",
                            f"http://127.0.0.1:{args.gateway_port}",
                            "--stats-file", str(demo_dir / "traffic.json")]
            for model in demo.MODELS:
                traffic_argv += ["--model", model]
            if args.phases:
                traffic_argv += ["--phases", args.phases]
            sup.start("traffic", traffic_argv)
        print(
            f"\n  pdplane is running: {web_url}/   (admin: {web_url}/admin/)\n"
            f"  login: {username} / {password}\n"
            + (f"  gateway (OpenAI API): http://127.0.0.1:{args.gateway_port}/v1/\n"
               if seeded else "")
            + f"  logs: {sup.log_dir}/\n  Ctrl-C stops everything.\n",
            flush=True,
        )
        last_status = time.monotonic()
        while not stopping:
            dead = sup.dead()
            if dead:
                for child in dead:
                    step(f"{child.name} exited ({child.proc.returncode}); last lines:\n"
                         f"{tail(child.log_path)}")
                step("stopping")
                return 1
            if seeded and time.monotonic() - last_status > 30:
                last_status = time.monotonic()
                print_status(var_dir)
            time.sleep(0.5)
        return 0
    except RuntimeError as exc:
        step(f"start-up failed: {exc}")
        for child in sup.dead():
            step(f"{child.name} exited ({child.proc.returncode}); last lines:\n"
                 f"{tail(child.log_path)}")
        return 1
    finally:
        step("stopping every process")
        sup.stop_all()
        if settings.EMBEDDED_REDIS:
            from controlplane.core import embedded_redis

            embedded_redis.stop(var_dir)
        step("stopped")


def print_status(var_dir: Path) -> None:
    from django.db import close_old_connections

    from controlplane.planner.models import Plan
    from controlplane.topology.models import Node

    close_old_connections()
    try:
        traffic = json.loads((var_dir / "demo" / "traffic.json").read_text())
    except (OSError, ValueError):
        traffic = {}
    online = Node.objects.filter(cluster__name="demo", status="online").count()
    plans = Plan.objects.filter(cluster__name="demo")
    step(f"nodes online {online}/3 · traffic phase {traffic.get('phase', '?')}: "
         f"{traffic.get('ok', 0)} ok, {traffic.get('error', 0)} errors · plans "
         f"{plans.count()} ({plans.filter(status='applied').count()} applied)")


if __name__ == "__main__":
    sys.exit(main())
