"""Shared fixtures. The suite runs against PostgreSQL and a real Redis (see scripts/test.sh)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"


# How long a test waits for something it expects (a reply, a message, a condition). An upper
# bound, not a speed goal: on a 2-core CI box, beside the shard that runs two vLLM engines and
# Chromium, one live-page update took more than 10 s to arrive (quiet, the same test takes 2 s
# in all). A passing test waits only as long as the event takes.
WAIT_S = 30
# How long a test waits for a process it started to listen or be ready: with two test runs at
# once, one uvicorn took over 60 s to import the app and listen (its log empty, alive). Given
# the process, a wait ends at once if it exits.
START_S = 180


def pytest_configure(config):
    """A TERM (CI's time limit, a runner stopping its background shard) ends the run as
    Ctrl-C does, so the fixtures' teardowns still run. Under the default handler pytest
    died at once, and the processes the fixtures had started in their own sessions (the
    real vLLM engines, uvicorn, Celery) outlived it."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, interrupt)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports: every socket stays bound until all are picked (two
    free_port() calls can return the same port, the first closed before the second binds)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def wait_until(predicate, timeout: float = WAIT_S, interval: float = 0.2,
               what: str = "condition"):
    """Until ``predicate()`` is truthy; returns that value, or fails naming ``what`` and the
    last value seen."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}; last value {last!r}")


def wait_for_port(port: int, timeout: float = START_S, host: str = "127.0.0.1",
                  process: subprocess.Popen | None = None) -> None:
    """Until something listens on the port. Given the server's ``process``, a server that
    died stops the wait at once (its exit code in the error)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server for {host}:{port} exited with {process.returncode}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout}s")


# --------------------------------------------------------------------------- test tiers
# Some tiers need system parts that `make test` does not install (Debian's chromium and
# prometheus, the real-vLLM venv). On a person's machine a missing part skips its tier with
# one line saying what to install; in CI (CI=true) every tier is required and a missing part
# fails. A host that has the part but cannot run it (the P/D tier's NIXL probe) is reported
# the same loud way. Each note is printed again in one block at the end of the run.
TIER_NOTES: dict[str, str] = {}


def ci_requires_all_tiers() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def tier_note(tier: str, text: str) -> None:
    TIER_NOTES[tier] = text


def require_system_part(tier: str, missing: str, install: str) -> None:
    """Skip (or, in CI, fail) the calling test because ``missing`` is not on this machine."""
    if ci_requires_all_tiers():
        pytest.fail(f"{tier} tier: {missing} — CI requires every tier ({install})")
    tier_note(tier, f"skipped: {missing}; to run it: {install}")
    pytest.skip(f"{tier} tier: {missing}; to run it: {install}")


def pytest_terminal_summary(terminalreporter):
    if not TIER_NOTES:
        return
    terminalreporter.section("pdplane test tiers not run in full on this machine")
    for tier, text in sorted(TIER_NOTES.items()):
        terminalreporter.write_line(f"{tier}: {text}")


@pytest.fixture
def shared_dir() -> Path:
    if not SHARED.exists():
        # Not a system part CI could install: it is the brief's data, laid beside the clone.
        tier_note("shared-data", "skipped: ../shared (traces, scenarios) is not beside the "
                                 "checkout")
        pytest.skip("../shared is not present beside the checkout")
    return SHARED


def python_env(**overrides: str | None) -> dict[str, str]:
    """The current environment with overrides; a value of None removes the variable."""
    env = dict(os.environ)
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def stop_process(proc: subprocess.Popen | None, timeout: float = 10.0) -> None:
    """Terminate a child process (SIGTERM, the clean stop every server here handles); kill
    it if it has not exited within ``timeout`` seconds."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)


def processes_with(marker: str) -> list[int]:
    """PIDs of this machine's processes whose environment holds ``marker`` ("NAME=value").
    Tests tag what they spawn this way, so a grandchild that left its process group (an
    engine core, a daemonized server) is still found and stopped — by PID, nothing else."""
    needle = b"\0" + marker.encode() + b"\0"
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in b"\0" + (entry / "environ").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def run_python(
    *args: str, env: dict | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


# Hot state lives in a shared Redis, and a fresh test database restarts primary keys at 1:
# keys left by an earlier run could describe this run's node 1. A per-run key prefix (set
# before any subprocess starts, so servers and agents inherit it) keeps runs apart.
os.environ.setdefault("PDPLANE_TELEMETRY_PREFIX", f"pdp:test:{os.getpid()}:{int(time.time())}:")


@pytest.fixture(scope="session", autouse=True)
def _drop_hot_state_of_this_run():
    yield
    prefix = os.environ["PDPLANE_TELEMETRY_PREFIX"]
    try:
        import redis
        from django.conf import settings

        client = redis.Redis.from_url(settings.REDIS_URL)
        for key in client.scan_iter(match=prefix + "*", count=1000):
            client.delete(key)
    except Exception:  # cleanup is best effort; never fail the run for it
        pass


@pytest.fixture(autouse=True)
def _close_thread_sensitive_connections():
    """Channels runs a consumer's database calls (and asgiref's thread-sensitive
    sync_to_async) on asgiref's one shared thread; the connection it opens there outlives
    the test (CONN_MAX_AGE). Left open at the end of the run, pytest-django cannot drop the
    test database ("being accessed by other users", after PostgreSQL waited for it), so it
    is closed after each test that used that thread."""
    yield
    from asgiref.sync import SyncToAsync

    executor = SyncToAsync.single_thread_executor
    if not executor._threads:  # never used in this run: nothing opened there
        return
    from django.db import connections

    executor.submit(connections.close_all).result(timeout=WAIT_S)


# End-to-end tests that start real process trees (servers, agents, simulated fleets,
# Prometheus, Chromium) and wait on wall-clock events. On a loaded 2-core machine a wait can
# run out; one rerun separates that from a defect, which fails both tries.
PROCESS_TREE_MODULES = {
    "test_demo_smoke.py", "test_observability_prometheus.py", "test_agent_sim.py",
    "test_planner_e2e.py", "test_gateway_sim.py", "test_alerts_worker_kill.py",
    "test_dashboard_browser.py", "test_dashboard_live_agent.py", "test_sim_server_launcher.py",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in PROCESS_TREE_MODULES and not item.get_closest_marker("flaky"):
            item.add_marker(pytest.mark.flaky(reruns=1, reruns_delay=5))
