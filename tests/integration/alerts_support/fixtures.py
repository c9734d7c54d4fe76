"""Helpers for the alert integration tests: a receiver process and fleet snapshots."""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from controlplane.alerts.lifecycle import LifecycleConfig
from controlplane.alerts.rules import FleetSnapshot, NodeFacts
from tests.conftest import ROOT, WAIT_S, free_port, stop_process, wait_for_port

RECEIVER = Path(__file__).with_name("receiver.py")

# Alertmanager timers collapsed and a retry schedule of a few seconds in all.
FAST_SETTINGS = {
    "ALERTS_WEBHOOK_ALLOW": ["127.0.0.1/32"],
    "ALERTS_RETRY_SCHEDULE": (0, 0.3, 0.3, 0.5, 0.5, 0.5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1),
    "ALERTS_LIFECYCLE": LifecycleConfig(group_wait_s=0, group_interval_s=0, repeat_interval_s=3600),
    "ALERTS_KICK_SWEEPER": False,
    # A receiver that is up answers within this; a starved box must not turn a slow answer
    # into a timed-out attempt (an extra retry the tests would count).
    "ALERTS_DELIVERY_TIMEOUT_S": WAIT_S,
    "ALERTS_CLAIM_LEASE_S": 2 * WAIT_S,
}


class Receiver:
    def __init__(self, tmp_path: Path, secret: str, port: int | None = None):
        self.port = port or free_port()
        self.secret = secret
        self.log = tmp_path / f"receiver-{self.port}.jsonl"
        self.control_file = tmp_path / f"control-{self.port}.json"
        self.control()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def control(self, **values) -> None:
        self.control_file.write_text(json.dumps({"status": 200, **values}))

    def start(self) -> Receiver:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(RECEIVER),
                "--port",
                str(self.port),
                "--secret",
                self.secret,
                "--log",
                str(self.log),
                "--control",
                str(self.control_file),
            ],
            cwd=ROOT,
        )
        wait_for_port(self.port, process=self.proc)
        return self

    def stop(self) -> None:
        stop_process(self.proc, timeout=5)
        self.proc = None

    def requests(self) -> list[dict]:
        if not self.log.exists():
            return []
        lines = [json.loads(line) for line in self.log.read_text().splitlines() if line]
        return [r for r in lines if r["phase"] == "received"]

    def delivered(self) -> list[dict]:
        """Requests answered 2xx, one per webhook-id (what a deduping receiver keeps)."""
        out = {}
        for r in self.requests():
            if r["status"] < 300 and r["id"] not in out:
                out[r["id"]] = r
        return list(out.values())


@contextmanager
def running_receiver(tmp_path: Path, secret: str, port: int | None = None):
    r = Receiver(tmp_path, secret, port).start()
    try:
        yield r
    finally:
        r.stop()


def offline_snapshot(now: float, *nodes: str, cluster: str = "c1") -> FleetSnapshot:
    return FleetSnapshot(
        now=now,
        nodes=tuple(NodeFacts(cluster, n, last_report_age_s=3600.0) for n in nodes),
    )


