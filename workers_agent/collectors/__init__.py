"""Collectors: each turns one source (NVML, sysfs, engine /metrics, KV events, the
simulator's node endpoint) into plain dicts in the units of docs/agent-protocol.md."""
