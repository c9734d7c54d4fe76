"""The agent's collection side: inventory for hello, one report per interval.

Sources: the simulator's node endpoint when ``sim_node_url`` is set (GPUs, NICs and the
engine list), else NVML + sysfs and the engines of the config file. Each engine gets an
:class:`EngineMetricsCollector` and, when it publishes KV events, a
:class:`KVEventSubscriber` running in its own thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from . import metrics as agent_metrics
from .collectors.engine_metrics import EngineMetricsCollector
from .collectors.gpu import NvmlGpuCollector, SimGpuCollector
from .collectors.kv_events import KVEventSubscriber
from .collectors.links import SimLinkCollector, SysfsLinkCollector
from .collectors.sim_source import SimNodeSource
from .config import AgentConfig
from .protocol import ENGINE_KINDS, PROTOCOL_VERSION, ROLES, SUPPORTED_VERSIONS

log = logging.getLogger(__name__)

AGENT_VERSION = "0.1.0"


@dataclass
class EngineHandle:
    spec: dict
    metrics: EngineMetricsCollector | None
    kv: KVEventSubscriber | None
    role: str | None = None
    generation: int | None = None
    extra: dict = field(default_factory=dict)


def _engine_inventory(spec: dict) -> dict:
    kind = spec.get("kind") or "vllm"
    out = {
        "id": spec["id"], "model": spec["model"],
        "kind": kind if kind in ENGINE_KINDS else "vllm",
        "gpus": list(spec.get("gpus") or []),
        "tp": int(spec.get("tp") or max(1, len(spec.get("gpus") or []))),
    }
    for key in ("api_url", "metrics_url", "kv_events_endpoint", "kv_replay_endpoint"):
        if spec.get(key):
            out[key] = spec[key]
    if spec.get("role") in ROLES:
        out["role"] = spec["role"]
    for key in ("block_size", "num_gpu_blocks"):
        if isinstance(spec.get(key), int):
            out[key] = spec[key]
    return out


class Agent:
    def __init__(self, cfg: AgentConfig):
        self.cfg = cfg
        self.sim = SimNodeSource(cfg.sim_node_url) if cfg.sim_node_url else None
        if self.sim:
            self.gpus = SimGpuCollector(self.sim)
            self.links = SimLinkCollector(self.sim)
        else:
            self.gpus = NvmlGpuCollector()
            self.links = SysfsLinkCollector(cfg.sysfs_root, cfg.nics)
        self.engines: dict[str, EngineHandle] = {}
        self.seq = 0
        self.announced: dict | None = None
        self.hooks = dict(cfg.hooks)
        if self.sim and "set_role" not in self.hooks:
            # The simulator records roles itself; other commands need an operator's hook.
            self.hooks["set_role"] = {"http": {
                "method": "POST",
                "url": self.sim.base_url + "/sim/v1/engines/{engine}/role",
                "json": {"role": "{role}"}}}

    # ------------------------------------------------------------------ engines

    def _engine_specs(self) -> list[dict]:
        if self.cfg.engines:
            return self.cfg.engines
        if self.sim:
            return list(self.sim.fetch(max_age_s=0.0).get("engines", []))
        return []

    def refresh_engines(self) -> None:
        specs = {s["id"]: s for s in self._engine_specs()}
        for eid in list(self.engines):
            if eid not in specs:
                self._stop_engine(self.engines.pop(eid))
        for eid, spec in specs.items():
            handle = self.engines.get(eid)
            if handle is not None:
                handle.spec = spec
                if self.sim and spec.get("role") in ROLES:
                    handle.role = spec["role"]
                continue
            metrics = None
            if spec.get("metrics_url"):
                metrics = EngineMetricsCollector(
                    spec["metrics_url"], window_s=self.cfg.quantile_window_s,
                    num_gpu_blocks=spec.get("num_gpu_blocks"))
            kv = None
            if spec.get("kv_events_endpoint"):
                kv = KVEventSubscriber(spec["kv_events_endpoint"],
                                       spec.get("kv_replay_endpoint"))
                kv.start()
            self.engines[eid] = EngineHandle(spec, metrics, kv,
                                             role=spec.get("role") if spec.get("role") in ROLES
                                             else None)

    def _stop_engine(self, handle: EngineHandle) -> None:
        if handle.kv is not None:
            handle.kv.stop()

    def close(self) -> None:
        for handle in self.engines.values():
            self._stop_engine(handle)

    def engine_ids(self) -> set[str]:
        return set(self.engines)

    def command_applied(self, command: str, values: dict) -> None:
        """Remember what a successful command changed, for the next reports."""
        handle = self.engines.get(values.get("engine", ""))
        if handle is None:
            return
        if command == "set_role" and values.get("role") in ROLES:
            handle.role = values["role"]
        if values.get("generation", "").isdigit():
            handle.generation = int(values["generation"])

    # ------------------------------------------------------------------ hello / report

    def inventory(self) -> dict:
        self.refresh_engines()
        inv = {
            "gpus": self.gpus.inventory(),
            "nics": self.links.inventory(),
            "engines": [_engine_inventory(h.spec) for h in self.engines.values()],
        }
        gpu_ids = {g["index"] for g in inv["gpus"]}
        for eng in inv["engines"]:
            eng["gpus"] = [i for i in eng["gpus"] if i in gpu_ids]
        self.announced = inv
        return inv

    def hello(self) -> dict:
        msg = {"type": "hello", "protocol": list(SUPPORTED_VERSIONS),
               "agent_version": AGENT_VERSION, "hostname": self.cfg.hostname,
               "inventory": self.inventory()}
        if self.cfg.metrics_port:
            msg["metrics_port"] = self.cfg.metrics_port
        return msg

    def collect(self, agent_counters: dict | None = None) -> dict:
        """One report (blocking I/O: call it in a thread)."""
        started = time.perf_counter()
        if self.sim:
            self.refresh_engines()
        announced = self.announced or self.inventory()
        gpu_ids = {g["index"] for g in announced["gpus"]}
        nic_names = {n["name"] for n in announced["nics"]}
        engine_ids = {e["id"] for e in announced["engines"]}
        try:
            gpus = [g for g in self.gpus.sample() if g["index"] in gpu_ids]
        except Exception as exc:
            log.warning("GPU sample failed: %s", exc)
            agent_metrics.COLLECTOR_ERRORS.labels("gpu").inc()
            gpus = []
        try:
            nics = [n for n in self.links.sample() if n["name"] in nic_names]
        except Exception as exc:
            log.warning("link sample failed: %s", exc)
            agent_metrics.COLLECTOR_ERRORS.labels("links").inc()
            nics = []
        engines = []
        for eid, handle in self.engines.items():
            if eid not in engine_ids:
                continue
            item = {"id": eid, "up": False}
            if handle.metrics is not None:
                with agent_metrics.ENGINE_SCRAPE_DURATION.time():
                    sample = handle.metrics.scrape()
                if not sample.up:
                    agent_metrics.COLLECTOR_ERRORS.labels("engine").inc()
                item.update(sample.as_report())
            if handle.role:
                item["role"] = handle.role
            if handle.generation is not None:
                item["generation"] = handle.generation
            if handle.kv is not None:
                item["kv_events"] = handle.kv.stats()
            engines.append(item)
        self.seq += 1
        agent_metrics.COLLECT_DURATION.observe(time.perf_counter() - started)
        return {"type": "report", "seq": self.seq, "ts": time.time(), "gpus": gpus,
                "nics": nics, "engines": engines, "agent": agent_counters or {}}

    def inventory_changed(self) -> bool:
        """True when the engine set (sim) differs from what hello announced."""
        if not self.announced:
            return False
        return {e["id"] for e in self.announced["engines"]} != set(self.engines)

    async def acollect(self, agent_counters: dict | None = None) -> dict:
        return await asyncio.to_thread(self.collect, agent_counters)


__all__ = ["PROTOCOL_VERSION", "Agent"]
