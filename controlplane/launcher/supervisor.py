"""Start child processes in their own process groups and stop every one of them cleanly.

Each child gets a new session so a Ctrl-C in the terminal reaches only the launcher, which
then stops children in reverse start order: SIGTERM to the whole group, a grace period,
SIGKILL for whatever is left. Nothing is left behind even when a child spawned its own
children (Celery's pool, the simulator's node processes).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log_path: Path


class Supervisor:
    def __init__(self, log_dir: Path, env: dict[str, str], cwd: Path):
        self.log_dir = log_dir
        self.env = env
        self.cwd = cwd
        self.children: list[Child] = []
        log_dir.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        log_path = self.log_dir / f"{name}.log"
        log = open(log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        proc = subprocess.Popen(
            argv, cwd=self.cwd, env={**self.env, **(env or {})}, stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        log.close()
        child = Child(name, proc, log_path)
        self.children.append(child)
        return child

    def dead(self) -> list[Child]:
        return [c for c in self.children if c.proc.poll() is not None]

    def stop_all(self, grace_s: float = 10.0) -> None:
        for child in reversed(self.children):
            _signal_group(child.proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in reversed(self.children):
            remaining = max(0.1, deadline - time.monotonic())
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=remaining)
        for child in self.children:
            # The group may hold grandchildren even after the leader exited.
            _signal_group(child.proc, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=5)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
