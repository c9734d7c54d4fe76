"""The adversarial suite's live control plane: uvicorn (with the websocket protocol the
deployments use) on the test database and Redis, one per module."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from controlplane.core.wsprotocol import UVICORN_WS
from tests.conftest import ROOT, WAIT_S, free_port, python_env, stop_process, wait_for_port


def database_url() -> str:
    from django.db import connection

    s = connection.settings_dict
    auth = s["USER"] or "postgres"
    if s.get("PASSWORD"):
        auth += f":{s['PASSWORD']}"
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


class LiveServer:
    def __init__(self, log_path: Path, prefix: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/ws/agent/v1/"
        self.log_path, self.prefix = log_path, prefix
        self.proc: subprocess.Popen | None = None

    def start(self) -> LiveServer:
        env = python_env(DATABASE_URL=database_url(), PDPLANE_TELEMETRY_PREFIX=self.prefix,
                         PDPLANE_AGENT_MAX_REPORTS_PER_S="1000", PDPLANE_AGENT_REPORT_BURST="1000")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "controlplane.asgi:application", "--host",
                 "127.0.0.1", "--port", str(self.port), "--ws", UVICORN_WS,
                 "--log-level", "warning"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        wait_for_port(self.port, process=self.proc)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def assert_no_crash(self) -> None:
        text = self.log()
        for marker in ("Exception in ASGI application", "Traceback", "RuntimeError"):
            assert marker not in text, text[-4000:]

    def stop(self) -> None:
        stop_process(self.proc)


@pytest.fixture(scope="module")
def cp_server(django_db_setup, django_db_blocker, tmp_path_factory):
    prefix = f"{os.environ['PDPLANE_TELEMETRY_PREFIX']}adv{uuid.uuid4().hex[:6]}:"
    server = LiveServer(tmp_path_factory.mktemp("adversarial") / "uvicorn.log", prefix)
    with django_db_blocker.unblock():
        server.start()
    time.sleep(0.5)
    yield server
    server.stop()


@pytest.fixture
def hot_prefix(cp_server, settings):
    """Read the hot state the live server writes; after the test, wait until the server's
    background database work (inventory reconciles, disconnect bookkeeping) is done, so
    the test database can be flushed without a deadlock."""
    settings.TELEMETRY_REDIS_PREFIX = cp_server.prefix
    yield cp_server.prefix
    wait_database_quiet()


def wait_database_quiet(timeout: float = WAIT_S) -> None:
    from django.db import connection

    from controlplane.topology.models import Node

    deadline = time.monotonic() + timeout
    quiet = 0
    while time.monotonic() < deadline and quiet < 3:
        with connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                        " AND pid <> pg_backend_pid() AND state <> 'idle'")
            busy = cur.fetchone()[0]
        # A node still online: its disconnect bookkeeping has not run yet.
        quiet = quiet + 1 if not busy and not Node.objects.filter(status="online").exists() \
            else 0
        time.sleep(0.1)
