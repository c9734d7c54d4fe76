"""Gateway configuration: a JSON or TOML file, then command-line flags, then environment.

Secrets may come from the environment (``PDPLANE_GATEWAY_SECRET``) or a file
(``admin_secret_file``) rather than the command line.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any


class GatewayConfigError(ValueError):
    pass


@dataclass
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    # HMAC secrets accepted on the admin API (several: rotation). Empty = admin API off.
    admin_secrets: list[str] = field(default_factory=list)
    admin_secret_file: str | None = None
    # Where the first table comes from: a file, the saved state, and/or the control plane.
    table_file: str | None = None
    state_file: str | None = None
    control_plane_url: str | None = None
    cluster: str | None = None
    gateway_name: str | None = None
    pull_interval_s: float = 30.0
    # Upstream behaviour.
    connect_timeout_s: float = 2.0
    request_timeout_s: float = 600.0
    retry_before_first_byte: bool = True
    max_attempts: int = 3  # tries per request before the first byte (workers or P/D pairs)
    pd_prefill_timeout_s: float = 60.0
    pd_pair_cooldown_s: float = 5.0  # a failing P/D pair is skipped this long, then probed
    # Prefix index.
    approx_ttl_s: float = 120.0
    kv_events: bool = True
    # A worker whose KV-event stream stays silent this long after it was sent uncached
    # prompt blocks is "stalled": routed on the approximate index until events come back.
    kv_stall_s: float = 15.0
    # Largest routing table accepted (push or pull), checked while it streams in.
    max_table_bytes: int = 32 * 1024 * 1024
    # Share of routing decisions kept in the admin decision log (fallbacks and avoidable
    # prefills are always kept).
    decision_log_sample: float = 0.05
    tokenize_via_engine: bool = False
    seed: int | None = None
    # Gateway processes sharing the port (SO_REUSEPORT) and their routing state; the
    # index is set for each child by the supervisor (PDPLANE_GATEWAY_WORKER_INDEX).
    workers: int = 1
    worker_index: int = 0
    log_level: str = "WARNING"
    access_log: bool = False
    # "lean": the gateway's own HTTP/1.1 server (gateway/front.py); "aiohttp": aiohttp's.
    server: str = "lean"

    def validate(self) -> None:
        if not 0 <= self.port <= 65535:
            raise GatewayConfigError(f"port must be 0–65535, got {self.port}")
        if self.control_plane_url and not (self.cluster and self.gateway_name):
            raise GatewayConfigError("control_plane_url needs cluster and gateway_name")
        if self.control_plane_url and not self.admin_secrets:
            raise GatewayConfigError("pulling from the control plane needs an admin secret")
        if not 0 <= self.decision_log_sample <= 1:
            raise GatewayConfigError("decision_log_sample must be within 0–1")
        if self.server not in ("lean", "aiohttp"):
            raise GatewayConfigError("server must be 'lean' or 'aiohttp'")
        if not 1 <= self.workers <= 64 or not 0 <= self.worker_index < self.workers:
            raise GatewayConfigError("workers must be 1–64 (worker_index below it)")
        if self.max_attempts < 1:
            raise GatewayConfigError("max_attempts must be ≥ 1")
        if self.max_table_bytes < 1024:
            raise GatewayConfigError("max_table_bytes must be at least 1024")
        if not self.approx_ttl_s > 0:  # the index's decay divides by it
            raise GatewayConfigError("approx_ttl_s must be > 0 (seconds)")
        if self.pull_interval_s < 0:
            raise GatewayConfigError("pull_interval_s must be ≥ 0 (0 = pull only at start)")
        if self.log_level.upper() not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
            raise GatewayConfigError(f"unknown log_level {self.log_level!r}")


FIELD_NAMES = {f.name for f in fields(GatewayConfig)}


def load_file(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise GatewayConfigError(f"cannot read {p}: {exc}") from exc
    try:
        data = tomllib.loads(text) if p.suffix == ".toml" else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise GatewayConfigError(f"{p} is not valid {p.suffix or 'JSON'}: {exc}") from exc
    if not isinstance(data, dict):
        raise GatewayConfigError(f"{p} must hold an object")
    return data


def build_config(
    file_values: dict[str, Any] | None = None,
    overrides: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> GatewayConfig:
    values: dict[str, Any] = {}
    flags = {k: v for k, v in (overrides or {}).items() if v is not None}
    for source in (file_values or {}, flags):
        unknown = set(source) - FIELD_NAMES - {"admin_secret"}
        if unknown:
            raise GatewayConfigError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        values.update(source)
    secret = values.pop("admin_secret", None)
    secrets = list(values.get("admin_secrets") or [])
    if secret:
        secrets.append(secret)
    env = os.environ if env is None else env
    if env.get("PDPLANE_GATEWAY_SECRET"):
        secrets.append(env["PDPLANE_GATEWAY_SECRET"])
    secret_file = values.get("admin_secret_file")
    if secret_file:
        try:
            secrets.append(Path(secret_file).read_text().strip())
        except OSError as exc:
            raise GatewayConfigError(f"cannot read admin_secret_file: {exc}") from exc
    values["admin_secrets"] = [s for s in secrets if s]
    try:
        config = GatewayConfig(**values)
    except TypeError as exc:
        raise GatewayConfigError(str(exc)) from exc
    config.validate()
    return config
