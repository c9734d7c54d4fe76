"""Link collector: NIC counters and line rate from /sys/class/net, RDMA port counters from
/sys/class/infiniband; or the simulator's fake NICs.

Units out: line rate and throughput in Gb/s (10⁹ bit/s); errors and drops as cumulative
counts. ``speed`` in sysfs is Mb/s (−1 or unreadable when unknown: reported as null).
InfiniBand ``port_xmit_data``/``port_rcv_data`` count 4-byte words.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from .counters import RateTracker
from .sim_source import SimNodeSource

VIRTUAL_PREFIXES = ("lo", "veth", "docker", "br-", "virbr", "cni", "flannel", "cali", "tun",
                    "tap")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    raw = _read(path)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


class SysfsLinkCollector:
    def __init__(self, root: str = "/sys", include: list[str] | None = None):
        self.root = Path(root)
        self.include = include
        self.rates = RateTracker()

    def _net_names(self) -> list[str]:
        base = self.root / "class/net"
        try:
            names = sorted(p.name for p in base.iterdir())
        except OSError:
            return []
        if self.include is not None:
            return [n for n in names if n in self.include]
        return [n for n in names if not n.startswith(VIRTUAL_PREFIXES)]

    def _ib_ports(self) -> list[tuple[str, Path]]:
        base = self.root / "class/infiniband"
        out = []
        try:
            for dev in sorted(base.iterdir()):
                for port in sorted((dev / "ports").iterdir()):
                    name = f"{dev.name}/{port.name}"
                    if self.include is None or name in self.include or dev.name in self.include:
                        out.append((name, port))
        except OSError:
            pass
        return out

    def inventory(self) -> list[dict]:
        out = []
        for name in self._net_names():
            speed = _read_int(self.root / f"class/net/{name}/speed")
            out.append({"name": name, "line_rate_gbps": speed / 1000 if speed and speed > 0
                        else None, "transport": "ethernet", "rdma": False})
        for name, port in self._ib_ports():
            rate = _read(port / "rate") or ""
            m = re.match(r"([\d.]+)\s*Gb/sec", rate)
            link = (_read(port / "link_layer") or "").lower()
            out.append({"name": name[:32], "line_rate_gbps": float(m.group(1)) if m else None,
                        "transport": "roce" if link == "ethernet" else "infiniband",
                        "rdma": True})
        return out

    def sample(self) -> list[dict]:
        now = time.monotonic()
        out = []
        for name in self._net_names():
            stats = self.root / f"class/net/{name}/statistics"
            out.append({
                "name": name,
                "tx_gbps": self.rates.gbps(f"{name}:tx", _read_int(stats / "tx_bytes"), now),
                "rx_gbps": self.rates.gbps(f"{name}:rx", _read_int(stats / "rx_bytes"), now),
                "rx_errors": _read_int(stats / "rx_errors"),
                "tx_errors": _read_int(stats / "tx_errors"),
                "rx_drops": _read_int(stats / "rx_dropped"),
                "tx_drops": _read_int(stats / "tx_dropped"),
            })
        for name, port in self._ib_ports():
            counters = port / "counters"
            tx = _read_int(counters / "port_xmit_data")
            rx = _read_int(counters / "port_rcv_data")
            out.append({
                "name": name[:32],
                "tx_gbps": self.rates.gbps(f"{name}:tx", tx * 4 if tx is not None else None, now),
                "rx_gbps": self.rates.gbps(f"{name}:rx", rx * 4 if rx is not None else None, now),
                "rx_errors": _read_int(counters / "port_rcv_errors"),
                "tx_errors": None,
                "rx_drops": _read_int(counters / "port_rcv_switch_relay_errors"),
                "tx_drops": _read_int(counters / "port_xmit_discards"),
            })
        return out


class SimLinkCollector:
    def __init__(self, source: SimNodeSource):
        self.source = source
        self.rates = RateTracker()

    def inventory(self) -> list[dict]:
        return [{"name": n["name"], "line_rate_gbps": n.get("line_rate_gbps"),
                 "transport": n.get("transport") or "ethernet", "rdma": bool(n.get("rdma"))}
                for n in self.source.fetch().get("nics", [])]

    def sample(self) -> list[dict]:
        now = time.monotonic()
        return [{
            "name": n["name"],
            "tx_gbps": self.rates.gbps(f"{n['name']}:tx", n.get("tx_bytes"), now),
            "rx_gbps": self.rates.gbps(f"{n['name']}:rx", n.get("rx_bytes"), now),
            **{k: n.get(k) for k in ("rx_errors", "tx_errors", "rx_drops", "tx_drops")},
        } for n in self.source.fetch().get("nics", [])]
