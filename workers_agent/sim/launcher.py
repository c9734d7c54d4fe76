"""Start a simulated fleet: one process per node (default) or every node in this process.

The launcher resolves every "auto" port first, so all endpoints are known before anything
starts; it then starts the nodes, waits until each answers ``/health``, prints the
endpoints, writes them as JSON when asked, and runs until SIGINT/SIGTERM or until a node
process dies. Stopping sends SIGTERM to every node process, waits, then SIGKILLs stragglers;
node processes also get SIGTERM from the kernel if the launcher itself dies (Linux
PR_SET_PDEATHSIG), so no engine outlives its launcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from workers_agent.sim.fleetconfig import FleetConfig, endpoints_document, resolve_ports

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 5.0


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def health_urls(config: FleetConfig) -> list[str]:
    urls = [f"http://{config.host}:{n.telemetry_port}/health" for n in config.nodes]
    urls += [f"http://{config.host}:{e.http_port}/health" for e in config.engines]
    return urls


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as resp:  # noqa: S310 - loopback URLs we built
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def write_endpoints(path: str | Path, document: dict[str, Any]) -> None:
    """Write atomically, so a reader polling for the file never sees half of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(document, indent=2) + "\n")
    os.replace(tmp, path)


def format_endpoints(document: dict[str, Any]) -> str:
    lines = [f"pdplane-sim fleet (time_scale {document['time_scale']:g})"]
    for node in document["nodes"]:
        lines.append(f"node {node['hostname']}: telemetry {node['telemetry_url']}")
        for engine in document["engines"]:
            if engine["node"] != node["hostname"]:
                continue
            lines.append(
                f"  engine {engine['id']} [{engine['role']}] model={engine['model']} "
                f"gpus={engine['gpus']} api={engine['api_url']} "
                f"kv-events={engine['kv_events_endpoint'] or '-'} "
                f"replay={engine['kv_replay_endpoint'] or '-'}"
            )
    return "\n".join(lines)


class FleetProcesses:
    """A fleet running as one child process per node."""

    def __init__(self, config: FleetConfig, *, kv_batch_format: str = "array",
                 log_level: str = "WARNING") -> None:
        self.config = resolve_ports(config)
        self.kv_batch_format = kv_batch_format
        self.log_level = log_level
        self.procs: dict[str, subprocess.Popen] = {}
        self._tmpdir = tempfile.TemporaryDirectory(prefix="pdplane-sim-")
        self.config_path = Path(self._tmpdir.name) / "fleet.resolved.json"

    @property
    def endpoints(self) -> dict[str, Any]:
        return endpoints_document(self.config)

    def start(self, timeout: float = READY_TIMEOUT_S) -> None:
        self.config_path.write_text(json.dumps(self.config.to_dict()))
        for node in self.config.nodes:
            cmd = [
                sys.executable, "-m", "workers_agent.sim.cli", "node",
                "--config", str(self.config_path), "--node", node.hostname,
                "--kv-batch-format", self.kv_batch_format, "--log-level", self.log_level,
            ]
            self.procs[node.hostname] = subprocess.Popen(
                cmd, preexec_fn=_die_with_parent, stdin=subprocess.DEVNULL
            )
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def wait_ready(self, timeout: float) -> None:
        pending = health_urls(self.config)
        deadline = time.monotonic() + timeout
        while pending:
            dead = self.dead_nodes()
            if dead:
                raise RuntimeError(f"node process(es) exited during start-up: {', '.join(dead)}")
            pending = [url for url in pending if not _healthy(url)]
            if not pending:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"not healthy after {timeout:g}s: {', '.join(pending)}")
            time.sleep(0.1)

    def dead_nodes(self) -> list[str]:
        return [h for h, p in self.procs.items() if p.poll() is not None]

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in self.procs.values():
            remaining = max(deadline - time.monotonic(), 0.1)
            try:
                proc.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_TIMEOUT_S)
        self._tmpdir.cleanup()


def run_fleet(config: FleetConfig, *, in_process: bool = False, endpoints_out: str | None = None,
              kv_batch_format: str = "array", log_level: str = "WARNING") -> int:
    """The body of ``pdplane-sim run``: returns the process exit code."""
    if in_process:
        return _run_in_process(resolve_ports(config), endpoints_out, kv_batch_format)
    fleet = FleetProcesses(config, kv_batch_format=kv_batch_format, log_level=log_level)
    stopping = False

    def on_signal(signum, frame):
        nonlocal stopping
        stopping = True

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            fleet.start()
        except (RuntimeError, TimeoutError) as exc:
            print(f"pdplane-sim: {exc}", file=sys.stderr)
            return 1
        document = fleet.endpoints
        print(format_endpoints(document), flush=True)
        if endpoints_out:
            write_endpoints(endpoints_out, document)
        code = 0
        while not stopping:
            dead = fleet.dead_nodes()
            if dead:
                print(f"pdplane-sim: node process(es) died: {', '.join(dead)}", file=sys.stderr)
                code = 1
                break
            time.sleep(0.2)
        return code
    finally:
        fleet.stop()
        for sig, handler in old.items():
            signal.signal(sig, handler)
        print("pdplane-sim: stopped", file=sys.stderr, flush=True)


def _run_in_process(config: FleetConfig, endpoints_out: str | None, kv_batch_format: str) -> int:
    from workers_agent.sim.node import run_nodes

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)

        def ready(nodes) -> None:
            document = endpoints_document(config)
            print(format_endpoints(document), flush=True)
            if endpoints_out:
                write_endpoints(endpoints_out, document)

        await run_nodes(config, [n.hostname for n in config.nodes], stop,
                        kv_batch_format=kv_batch_format, on_ready=ready)

    asyncio.run(main())
    print("pdplane-sim: stopped", file=sys.stderr, flush=True)
    return 0


def run_node_process(config: FleetConfig, hostnames: list[str], *,
                     kv_batch_format: str = "array") -> int:
    """The body of the internal ``pdplane-sim node`` command (one node process)."""
    from workers_agent.sim.node import run_nodes

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run_nodes(config, hostnames, stop, kv_batch_format=kv_batch_format)

    asyncio.run(main())
    return 0
