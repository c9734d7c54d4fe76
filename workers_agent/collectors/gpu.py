"""GPU collector: NVML through nvidia-ml-py, or the simulator's fake GPUs.

Without an NVIDIA driver (no libnvidia-ml, or NVML init fails) the NVML collector reports
``available = False`` with the reason, an empty inventory and no samples — the agent keeps
running and still reports engines and links.
"""

from __future__ import annotations

import logging
import time

from .counters import RateTracker
from .sim_source import SimNodeSource

log = logging.getLogger(__name__)


class NvmlGpuCollector:
    def __init__(self):
        self.available = False
        self.reason = ""
        self.rates = RateTracker()
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.count = pynvml.nvmlDeviceGetCount()
            self.available = True
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, driver missing…
            self.reason = f"NVML unavailable: {exc}"
            log.info("%s; reporting no GPUs", self.reason)

    def _handle(self, index: int):
        return self.nvml.nvmlDeviceGetHandleByIndex(index)

    def _text(self, value) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    def _nvlink_peers(self) -> dict[int, list[int]]:
        """GPU index → indexes of the GPUs its active NVLinks reach (via PCI bus ids).
        Links to NVSwitches show up as unknown bus ids and are ignored; then every GPU on
        the switch is a peer of every other (``all_to_all`` when any link is up)."""
        nvml = self.nvml
        peers: dict[int, set[int]] = {}
        try:
            bus = {}
            for i in range(self.count):
                bus[self._text(nvml.nvmlDeviceGetPciInfo(self._handle(i)).busId).lower()] = i
            switched = set()
            for i in range(self.count):
                h = self._handle(i)
                for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
                    try:
                        if nvml.nvmlDeviceGetNvLinkState(h, link) != 1:
                            continue
                        remote = self._text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)
                    except Exception:  # noqa: S112 (links beyond the GPU's count raise)
                        continue
                    j = bus.get(remote.lower())
                    if j is None:
                        switched.add(i)
                    elif j != i:
                        peers.setdefault(i, set()).add(j)
            for i in switched:
                peers.setdefault(i, set()).update(switched - {i})
        except Exception as exc:
            log.info("NVLink topology unavailable: %s", exc)
        return {i: sorted(p) for i, p in peers.items()}

    def inventory(self) -> list[dict]:
        if not self.available:
            return []
        peers = self._nvlink_peers()
        out = []
        for i in range(self.count):
            try:
                h = self._handle(i)
                out.append({
                    "index": i,
                    "uuid": self._text(self.nvml.nvmlDeviceGetUUID(h)),
                    "name": self._text(self.nvml.nvmlDeviceGetName(h)),
                    "memory_total_bytes": int(self.nvml.nvmlDeviceGetMemoryInfo(h).total),
                    "nvlink_peers": peers.get(i, []),
                })
            except Exception as exc:
                log.warning("NVML inventory of GPU %d failed: %s", i, exc)
        return out

    def _nvlink_bytes(self, h) -> tuple[float | None, float | None]:
        try:
            fields = [self.nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                      self.nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX]
            values = self.nvml.nvmlDeviceGetFieldValues(h, fields)
            # Throughput counters are in KiB.
            return tuple(float(v.value.ullVal) * 1024 if v.nvmlReturn == 0 else None
                         for v in values)
        except Exception:
            return None, None

    def sample(self) -> list[dict]:
        if not self.available:
            return []
        now = time.monotonic()
        out = []
        for i in range(self.count):
            try:
                h = self._handle(i)
                mem = self.nvml.nvmlDeviceGetMemoryInfo(h)
                util = self.nvml.nvmlDeviceGetUtilizationRates(h)
                item = {"index": i, "memory_used_bytes": int(mem.used),
                        "memory_total_bytes": int(mem.total),
                        "utilization": min(1.0, util.gpu / 100.0)}
                try:
                    item["temperature_c"] = float(self.nvml.nvmlDeviceGetTemperature(
                        h, self.nvml.NVML_TEMPERATURE_GPU))
                except Exception:
                    item["temperature_c"] = None
                try:
                    item["power_w"] = self.nvml.nvmlDeviceGetPowerUsage(h) / 1000.0
                except Exception:
                    item["power_w"] = None
                tx, rx = self._nvlink_bytes(h)
                item["nvlink_tx_gbps"] = self.rates.gbps(f"{i}:tx", tx, now)
                item["nvlink_rx_gbps"] = self.rates.gbps(f"{i}:rx", rx, now)
                out.append(item)
            except Exception as exc:
                log.warning("NVML sample of GPU %d failed: %s", i, exc)
        return out


class SimGpuCollector:
    """The simulated node's GPUs, in the same shapes as the NVML collector."""

    available = True
    reason = ""

    def __init__(self, source: SimNodeSource):
        self.source = source
        self.rates = RateTracker()

    def inventory(self) -> list[dict]:
        doc = self.source.fetch()
        gpus = doc.get("gpus", [])
        group = doc.get("nvlink_group_size") or 0  # GPUs index // group share NVLink

        def peers(g: dict) -> list[int]:
            if "nvlink_peers" in g:
                return list(g["nvlink_peers"])
            if group > 1:
                return [o["index"] for o in gpus if o["index"] != g["index"]
                        and o["index"] // group == g["index"] // group]
            return []

        return [{"index": g["index"], "uuid": g["uuid"], "name": g.get("name") or "",
                 "memory_total_bytes": int(g["memory_total_bytes"]), "nvlink_peers": peers(g)}
                for g in gpus]

    def sample(self) -> list[dict]:
        now = time.monotonic()
        out = []
        for g in self.source.fetch().get("gpus", []):
            i = g["index"]
            out.append({
                "index": i,
                "memory_used_bytes": int(min(g.get("memory_used_bytes") or 0,
                                             g["memory_total_bytes"])),
                "memory_total_bytes": int(g["memory_total_bytes"]),
                "utilization": min(1.0, max(0.0, float(g.get("utilization") or 0.0))),
                "temperature_c": g.get("temperature_c"),
                "power_w": g.get("power_w"),
                "nvlink_tx_gbps": self.rates.gbps(f"{i}:tx", g.get("nvlink_tx_bytes"), now),
                "nvlink_rx_gbps": self.rates.gbps(f"{i}:rx", g.get("nvlink_rx_bytes"), now),
            })
        return out
