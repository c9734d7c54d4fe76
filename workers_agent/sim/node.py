"""A simulated node: fake GPUs and NICs, its engines, and a telemetry endpoint.

``GET /sim/v1/node`` is what the agent's GPU and link collectors read instead of NVML and
sysfs when ``--sim-telemetry`` points at a simulated node (format in docs/sim.md):

- GPU memory used = model weights (÷ TP) + KV blocks in use (÷ TP) + activation overhead,
  for every engine on that GPU; utilisation = the engine's busy share of the last sampling
  interval; temperature and power follow utilisation.
- NVLink byte counters (per GPU) and NIC byte counters move with KV transfers: the prefill
  side counts bytes as sent, the decode side as received.
- ``POST /sim/v1/engines/<id>/role`` records a role (the engine serves any work: as with
  vLLM ``kv_both``, the gateway enforces roles).
- ``POST /sim/v1/nics/<name>/faults`` adds to a NIC's error/drop counters (for alert tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import web

import pdcatalog as catalog
from pdcatalog.gpus import GB
from workers_agent.sim import profiles
from workers_agent.sim.fleetconfig import ROLES, EngineConfig, FleetConfig, NodeConfig
from workers_agent.sim.server import EngineServer, SimClock
from workers_agent.sim.server.pd import EngineLocation, KvPath, NicInfo, nvlink_group_of

log = logging.getLogger(__name__)

SAMPLE_INTERVAL_S = 0.5  # wall seconds between utilisation samples


@dataclass
class _Gpu:
    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    power_limit_w: float
    utilization: float = 0.0
    nvlink_tx_bytes: int = 0
    nvlink_rx_bytes: int = 0


@dataclass
class _Nic:
    name: str
    line_rate_gbps: float
    transport: str
    rdma: bool
    tx_bytes: int = 0
    rx_bytes: int = 0
    rx_errors: int = 0
    tx_errors: int = 0
    rx_drops: int = 0
    tx_drops: int = 0


def gpu_uuid(hostname: str, index: int) -> str:
    """Stable per (hostname, index), shaped like NVML's ``GPU-xxxxxxxx-…``."""
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"pdplane-sim.{hostname}.gpu{index}"))


class SimNode:
    def __init__(
        self,
        node: NodeConfig,
        engines: list[EngineConfig],
        *,
        host: str = "127.0.0.1",
        clock: SimClock | None = None,
        kv_batch_format: str = "array",
    ) -> None:
        self.cfg = node
        self.host = host
        self.clock = clock or SimClock()
        self.hardware = profiles.get_hardware(node.gpu)
        # NVML's product name and the board power limit of the part, from the catalog.
        spec = catalog.lookup_gpu(self.hardware.name).spec
        name, power = spec.nvml_name, spec.tdp_w
        self.gpus = [
            _Gpu(i, gpu_uuid(node.hostname, i), name, int(self.hardware.memory_bytes), power)
            for i in range(node.gpu_count)
        ]
        self.nics = {n.name: _Nic(n.name, n.line_rate_gbps, n.transport, n.rdma) for n in node.nics}
        nic_infos = tuple(NicInfo(n.name, n.line_rate_gbps, n.transport, n.rdma) for n in node.nics)
        self.engines: dict[str, EngineServer] = {}
        for cfg in engines:
            location = EngineLocation(
                node=node.hostname,
                engine_id=cfg.id,
                gpus=cfg.gpus,
                nvlink_group=nvlink_group_of(cfg.gpus, node.nvlink_group_size),
                nics=nic_infos,
            )
            self.engines[cfg.id] = EngineServer(
                cfg, gpu_profile=node.gpu, location=location, host=host, clock=self.clock,
                telemetry=self, kv_batch_format=kv_batch_format,
            )
        self._busy: dict[str, tuple[float, float]] = {}
        self._runner: web.AppRunner | None = None
        self._sampler: asyncio.Task | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def telemetry_url(self) -> str:
        return f"http://{self.host}:{self.cfg.telemetry_port}/sim/v1/node"

    async def start(self) -> None:
        started: list[EngineServer] = []
        try:
            for engine in self.engines.values():
                await engine.start()
                started.append(engine)
            app = web.Application()
            app.router.add_get("/sim/v1/node", self.node_view)
            app.router.add_get("/health", self.health)
            app.router.add_post("/sim/v1/engines/{engine_id}/role", self.set_role)
            app.router.add_post("/sim/v1/nics/{nic}/faults", self.nic_faults)
            self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
            await self._runner.setup()
            site = web.TCPSite(self._runner, self.host, self.cfg.telemetry_port,
                               reuse_address=True)
            await site.start()
        except BaseException:
            for engine in started:
                with contextlib.suppress(Exception):
                    await engine.stop()
            raise
        self._sampler = asyncio.create_task(self._sample(), name=f"node-{self.cfg.hostname}")

    async def stop(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
        if self._runner is not None:
            await self._runner.cleanup()
        for engine in self.engines.values():
            with contextlib.suppress(Exception):
                await engine.stop()

    # ------------------------------------------------------------------ state

    async def _sample(self) -> None:
        while True:
            self.sample_utilization()
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    def sample_utilization(self) -> None:
        now = self.clock.now()
        per_gpu = [0.0] * len(self.gpus)
        for engine_id, engine in self.engines.items():
            busy = float(engine.engine.stats().busy_seconds)
            last = self._busy.get(engine_id)
            self._busy[engine_id] = (now, busy)
            if last is None or now <= last[0]:
                continue
            share = min(max((busy - last[1]) / (now - last[0]), 0.0), 1.0)
            for index in engine.cfg.gpus:
                per_gpu[index] = min(per_gpu[index] + share, 1.0)
        for gpu, util in zip(self.gpus, per_gpu, strict=True):
            gpu.utilization = util

    def record_kv_transfer(self, engine_id: str, path: KvPath, direction: str,
                           nbytes: int) -> None:
        """Move the byte counters for a KV transfer of ``engine_id`` (``tx`` or ``rx``)."""
        engine = self.engines.get(engine_id)
        if engine is None or nbytes <= 0:
            return
        if path.kind == "nvlink":
            share = nbytes // len(engine.cfg.gpus)
            for index in engine.cfg.gpus:
                gpu = self.gpus[index]
                if direction == "tx":
                    gpu.nvlink_tx_bytes += share
                else:
                    gpu.nvlink_rx_bytes += share
        elif path.kind == "network":
            nic = self.nics.get(path.src_nic if direction == "tx" else path.dst_nic or "")
            if nic is not None:
                if direction == "tx":
                    nic.tx_bytes += nbytes
                else:
                    nic.rx_bytes += nbytes

    def _memory_used(self) -> list[int]:
        used = [0.0] * len(self.gpus)
        overhead = self.hardware.activation_overhead_gb * GB
        for engine in self.engines.values():
            stats = engine.engine.stats()
            tp = engine.cfg.tp
            kv = stats.num_used_blocks * engine.cfg.block_size * engine.kv_bytes_per_token
            weights = float(engine.model_profile.weight_bytes)
            for index in engine.cfg.gpus:
                used[index] += weights / tp + kv / tp + overhead
        return [int(min(u, g.memory_total_bytes)) for u, g in zip(used, self.gpus, strict=True)]

    def snapshot(self) -> dict[str, Any]:
        memory = self._memory_used()
        gpus = []
        for gpu, used in zip(self.gpus, memory, strict=True):
            util = gpu.utilization
            idle_power = gpu.power_limit_w * 0.12
            gpus.append({
                "index": gpu.index,
                "uuid": gpu.uuid,
                "name": gpu.name,
                "memory_total_bytes": gpu.memory_total_bytes,
                "memory_used_bytes": used,
                "utilization": round(util, 4),
                "temperature_c": round(32.0 + 43.0 * util, 1),
                "power_w": round(idle_power + (gpu.power_limit_w - idle_power) * util, 1),
                "nvlink_tx_bytes": gpu.nvlink_tx_bytes,
                "nvlink_rx_bytes": gpu.nvlink_rx_bytes,
            })
        nics = [
            {
                "name": n.name, "line_rate_gbps": n.line_rate_gbps, "transport": n.transport,
                "rdma": n.rdma, "tx_bytes": n.tx_bytes, "rx_bytes": n.rx_bytes,
                "rx_errors": n.rx_errors, "tx_errors": n.tx_errors,
                "rx_drops": n.rx_drops, "tx_drops": n.tx_drops,
            }
            for n in self.nics.values()
        ]
        return {
            "hostname": self.cfg.hostname,
            "kind": "sim",
            "pid": os.getpid(),
            "gpu_profile": self.hardware.name,
            "nvlink_group_size": self.cfg.nvlink_group_size,
            "time_scale": self.clock.time_scale,
            "ts": time.time(),
            "gpus": gpus,
            "nics": nics,
            "engines": [e.describe() for e in self.engines.values()],
        }

    # ------------------------------------------------------------------ HTTP

    async def node_view(self, request: web.Request) -> web.Response:
        return web.json_response(self.snapshot())

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _json_body(self, request: web.Request) -> dict[str, Any] | web.Response:
        try:
            body = json.loads(await request.read() or b"{}")
        except (ValueError, UnicodeDecodeError):
            return _error(400, "body is not valid JSON")
        if not isinstance(body, dict):
            return _error(400, "body must be a JSON object")
        return body

    async def set_role(self, request: web.Request) -> web.Response:
        engine = self.engines.get(request.match_info["engine_id"])
        if engine is None:
            return _error(404, f"no engine {request.match_info['engine_id']!r} on this node")
        body = await self._json_body(request)
        if isinstance(body, web.Response):
            return body
        role = body.get("role")
        if role not in ROLES:
            return _error(400, f"role must be one of {', '.join(ROLES)}")
        previous, engine.role = engine.role, role
        log.info("node %s: engine %s role %s -> %s", self.cfg.hostname, engine.cfg.id,
                 previous, role)
        return web.json_response({"id": engine.cfg.id, "role": role, "previous_role": previous})

    async def nic_faults(self, request: web.Request) -> web.Response:
        nic = self.nics.get(request.match_info["nic"])
        if nic is None:
            return _error(404, f"no NIC {request.match_info['nic']!r} on this node")
        body = await self._json_body(request)
        if isinstance(body, web.Response):
            return body
        fields = ("rx_errors", "tx_errors", "rx_drops", "tx_drops")
        for name in fields:
            value = body.get(name, 0)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                return _error(400, f"{name} must be a non-negative integer")
        for name in fields:
            setattr(nic, name, getattr(nic, name) + body.get(name, 0))
        return web.json_response({name: getattr(nic, name) for name in ("name", *fields)})


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


async def run_nodes(config: FleetConfig, hostnames: list[str], stop: asyncio.Event,
                    *, kv_batch_format: str = "array", on_ready=None) -> None:
    """Start the named nodes of a (port-resolved) fleet in this loop; run until ``stop``."""
    clock = SimClock(config.time_scale)
    nodes = [
        SimNode(config.node(h), config.engines_on(h), host=config.host, clock=clock,
                kv_batch_format=kv_batch_format)
        for h in hostnames
    ]
    started: list[SimNode] = []
    try:
        for node in nodes:
            await node.start()
            started.append(node)
        if on_ready is not None:
            on_ready(nodes)
        await stop.wait()
    finally:
        for node in reversed(started):
            await node.stop()
