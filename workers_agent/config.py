"""Agent configuration: a TOML or JSON file, then environment, then command-line flags
(later wins). Unknown keys are errors, so a typo does not silently change behaviour.

Example (TOML)::

    server = "wss://pdplane.example/ws/agent/v1/"
    token_file = "/etc/pdplane/agent.token"     # or token = "...", or PDPLANE_AGENT_TOKEN
    hostname = "gpu-node-07"                   # default: the machine's hostname
    # sim_node_url = "http://127.0.0.1:9100"   # read GPUs/NICs/engines from a sim node

    [[engines]]
    id = "vllm-0"
    kind = "vllm"
    model = "llama-3.3-70b"
    api_url = "http://127.0.0.1:8000"
    metrics_url = "http://127.0.0.1:8000/metrics"
    kv_events_endpoint = "tcp://127.0.0.1:5557"
    kv_replay_endpoint = "tcp://127.0.0.1:5558"
    gpus = [0, 1]
    tp = 2
    role = "both"
    block_size = 16

    [hooks.set_role]
    http = { method = "POST", url = "http://127.0.0.1:9100/sim/v1/engines/{engine}/role",
             json = { role = "{role}" } }
    [hooks.restart_engine]
    shell = "systemctl restart vllm@{engine}"
    timeout_s = 120
"""

from __future__ import annotations

import json
import os
import socket
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path


class ConfigError(ValueError):
    pass


ENGINE_KEYS = {"id", "kind", "model", "api_url", "metrics_url", "kv_events_endpoint",
               "kv_replay_endpoint", "gpus", "tp", "role", "block_size", "num_gpu_blocks"}
HOOK_KEYS = {"shell", "http", "timeout_s"}


@dataclass
class AgentConfig:
    server: str = ""
    token: str = field(default="", repr=False)
    token_file: str = ""
    hostname: str = ""
    sim_node_url: str = ""
    sysfs_root: str = "/sys"
    nics: list[str] | None = None
    report_interval_s: float | None = None  # None: use the server's (welcome)
    quantile_window_s: float = 30.0
    buffer_size: int = 32
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 60.0
    heartbeat_s: float = 20.0
    engines: list[dict] = field(default_factory=list)
    hooks: dict[str, dict] = field(default_factory=dict)
    log_level: str = "INFO"
    metrics_port: int | None = None  # the agent's own /metrics; None: off
    metrics_addr: str = "0.0.0.0"

    def resolve_token(self) -> str:
        if self.token:
            return self.token
        if self.token_file:
            try:
                return Path(self.token_file).read_text().strip()
            except OSError as exc:
                raise ConfigError(f"cannot read token_file: {exc}") from None
        return ""

    def validate(self) -> None:
        if not self.server.startswith(("ws://", "wss://")):
            raise ConfigError("server must be a ws:// or wss:// URL (…/ws/agent/v1/)")
        if not self.resolve_token():
            raise ConfigError("no agent token: set token, token_file or PDPLANE_AGENT_TOKEN")
        if self.buffer_size < 1:
            raise ConfigError("buffer_size must be ≥ 1")
        if not 0 < self.backoff_base_s <= self.backoff_cap_s:
            raise ConfigError("need 0 < backoff_base_s ≤ backoff_cap_s")
        for eng in self.engines:
            unknown = set(eng) - ENGINE_KEYS
            if unknown:
                raise ConfigError(f"engine {eng.get('id')!r}: unknown keys {sorted(unknown)}")
            if not eng.get("id") or not eng.get("model"):
                raise ConfigError("every engine needs an id and a model")
        for name, hook in self.hooks.items():
            unknown = set(hook) - HOOK_KEYS
            if unknown:
                raise ConfigError(f"hook {name!r}: unknown keys {sorted(unknown)}")
            if ("shell" in hook) == ("http" in hook):
                raise ConfigError(f"hook {name!r}: give exactly one of shell or http")


ENV_KEYS = {
    "PDPLANE_AGENT_SERVER": "server",
    "PDPLANE_AGENT_TOKEN": "token",
    "PDPLANE_AGENT_TOKEN_FILE": "token_file",
    "PDPLANE_AGENT_HOSTNAME": "hostname",
    "PDPLANE_AGENT_SIM_NODE_URL": "sim_node_url",
    "PDPLANE_AGENT_REPORT_INTERVAL_S": "report_interval_s",
    "PDPLANE_AGENT_LOG_LEVEL": "log_level",
    "PDPLANE_AGENT_METRICS_PORT": "metrics_port",
}


def _coerce(name: str, value):
    kinds = {f.name: f.type for f in fields(AgentConfig)}
    kind = kinds[name]
    if value is None:
        return None
    if "float" in str(kind):
        return float(value)
    if "int" in str(kind) and "list" not in str(kind):
        return int(value)
    return value


def load_file(path: str) -> dict:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    try:
        if p.suffix == ".json":
            return json.loads(raw)
        return tomllib.loads(raw.decode())
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None


def load(path: str | None = None, env: dict | None = None, overrides: dict | None = None
         ) -> AgentConfig:
    env = os.environ if env is None else env
    values: dict = {}
    path = path or env.get("PDPLANE_AGENT_CONFIG")
    if path:
        data = load_file(path)
        known = {f.name for f in fields(AgentConfig)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"{path}: unknown keys {sorted(unknown)}")
        values.update(data)
    for var, key in ENV_KEYS.items():
        if env.get(var):
            values[key] = env[var]
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        cfg = AgentConfig(**{k: _coerce(k, v) for k, v in values.items()})
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    if not cfg.hostname:
        cfg.hostname = socket.gethostname()
    cfg.validate()
    return cfg
