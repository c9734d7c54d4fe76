"""The gateway's copy of the routing table: validate, apply, keep the last good one.

No Django, no I/O except the optional state file. The validation mirrors
controlplane/routing/schema/routing-table-v1.json (a unit test checks the two agree), so
the gateway refuses what the control plane would never have produced, including tables
from a newer schema it does not understand (NACK, keep serving the old table).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger(__name__)

MODES = ("aggregated", "disaggregated", "conditional")
ROLES = ("prefill", "decode", "both")
STATES = ("active", "draining")
LINKS = ("nvlink", "pcie", "rdma", "tcp")
_URL = re.compile(r"^https?://[^\s]+$")  # the schema's pattern, searched as JSON Schema does


class TableError(ValueError):
    """The table is invalid; ``problems`` lists every reason found."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems[:10]))
        self.problems = problems


@dataclass(frozen=True)
class KvPath:
    to: str
    link: str
    bandwidth_gbps: float
    rdma: bool


@dataclass(frozen=True)
class WorkerEntry:
    id: str
    url: str
    role: str
    state: str
    node: str
    engine: str = "vllm"
    previous_role: str | None = None
    kv_tokens: int = 0
    kv_events_endpoint: str | None = None
    kv_replay_endpoint: str | None = None
    kv_paths: dict[str, KvPath] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.state == "active"

    @property
    def can_prefill(self) -> bool:
        return self.role in ("prefill", "both")

    @property
    def can_decode(self) -> bool:
        return self.role in ("decode", "both")


# Routing fields a table may carry (else ModelRoute's defaults apply).
OPTIONAL_ROUTING = ("prefix_min_match", "imbalance_abs", "imbalance_rel",
                    "cache_balance_band", "first_token_deadline_ms",
                    "affinity_load_factor", "affinity_kv_limit", "ttft_itl_ratio")


@dataclass(frozen=True)
class ModelRoute:
    name: str
    mode: str
    kv_block_size: int
    block_size: int
    kv_overlap_weight: float
    load_weight: float
    temperature: float
    local_prefill_max_tokens: int
    kv_bytes_per_token: int
    workers: tuple[WorkerEntry, ...]
    # Prefix affinity (optional routing fields; the peers' cache_aware defaults): follow the
    # longest cached prefix when it covers at least `prefix_min_match` of the prompt, unless
    # in-flight requests are imbalanced by more than `imbalance_abs` AND `imbalance_rel`×.
    prefix_min_match: float = 0.3
    imbalance_abs: float = 64.0
    imbalance_rel: float = 1.5
    # Workers within this fraction of the lowest cost count as tied; the one that took the
    # least new KV lately wins (keeps every engine's cache history equally long). 0: off.
    cache_balance_band: float = 0.1
    # Prefix affinity bounded by load (gateway.router.AffinityBound): a holder is followed
    # only while its in-flight requests and queued prefill are at most this × the
    # candidates' mean (plus one request), and its KV in use at most `affinity_kv_limit` of
    # its capacity. 0: no bound (the imbalance rule above only).
    affinity_load_factor: float = 1.5
    affinity_kv_limit: float = 0.9
    # Streaming requests with no first token this long after they reached the gateway are
    # cancelled upstream and answered 503 (load shedding; policy shed_after_ttft_factor ×
    # the TTFT target). 0: never.
    first_token_deadline_ms: float = 0.0
    # The SLO's TTFT target ÷ its ITL target (the builder: policy ttft_p95_ms ÷ itl_p95_ms):
    # the cost counts a stall to a request in flight with more output tokens than this by
    # this ÷ its output tokens (gateway.router.stall_weight). 0: every stall in full.
    ttft_itl_ratio: float = 0.0

    def __post_init__(self) -> None:
        # Built once when the table is applied; a request looks workers up in O(1).
        object.__setattr__(self, "_by_id", {w.id: w for w in self.workers})

    def worker(self, worker_id: str) -> WorkerEntry | None:
        return self._by_id.get(worker_id)


@dataclass(frozen=True)
class RoutingTable:
    version: int
    cluster: str
    models: dict[str, ModelRoute]
    raw: dict[str, Any]

    def all_workers(self) -> list[WorkerEntry]:
        return [w for m in self.models.values() for w in m.workers]


# The checks below mirror controlplane/routing/schema/routing-table-v1.json and the control
# plane's semantic rules (unique names and ids, KV paths to known workers) one for one, so
# the gateway takes exactly what the control plane would publish (an adversarial test
# compares the two verdicts). JSON Schema's "integer" includes floats such as 3.0.


def _is_int(v, lo: int = 0) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, float):
        return v.is_integer() and v >= lo
    return isinstance(v, int) and v >= lo


def _is_num(v, lo: float = 0.0) -> bool:
    """A number ≥ ``lo`` that a float can hold (huge JSON integers would overflow)."""
    if not isinstance(v, int | float) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v) and v >= lo
    except OverflowError:
        return False


def _text(v, max_len: int | None = None) -> bool:
    return isinstance(v, str) and len(v) >= 1 and (max_len is None or len(v) <= max_len)


def _in(v, choices: tuple) -> bool:
    return (v is None or isinstance(v, str)) and v in choices


def _optional(obj: dict, key: str, check, nullable: bool = False) -> bool:
    """True when ``key`` is absent, or present and passes (null only if ``nullable``)."""
    if key not in obj:
        return True
    value = obj[key]
    return (nullable and value is None) or (value is not None and check(value))


def validate(raw: Any) -> list[str]:
    """Every problem with a decoded table (empty list = valid)."""
    p: list[str] = []
    if not isinstance(raw, dict):
        return ["(root): the table must be a JSON object"]
    if raw.get("schema_version") != 1 or isinstance(raw.get("schema_version"), bool):
        p.append(f"schema_version: unsupported {raw.get('schema_version')!r} (this gateway: 1)")
    if not _text(raw.get("cluster"), 64):
        p.append("cluster: must be a string of 1–64 characters")
    if not _is_int(raw.get("version")):
        p.append("version: must be a non-negative integer")
    models = raw.get("models")
    if not isinstance(models, list):
        return [*p, "models: must be a list"]
    names = set()
    for i, m in enumerate(models):
        where = f"models/{i}"
        if not isinstance(m, dict):
            p.append(f"{where}: must be an object")
            continue
        name = m.get("name")
        if not _text(name, 128):
            p.append(f"{where}/name: must be a string of 1–128 characters")
        elif name in names:
            p.append("models: model names must be unique")
        else:
            names.add(name)
        if not _in(m.get("mode"), MODES):
            p.append(f"{where}/mode: must be one of {MODES}")
        if not _optional(m, "mode_reason", lambda v: isinstance(v, str)):
            p.append(f"{where}/mode_reason: must be a string")
        if not _is_int(m.get("kv_block_size"), 1):
            p.append(f"{where}/kv_block_size: must be a positive integer")
        if not _optional(m, "kv_bytes_per_token", lambda v: _is_int(v, 1)):
            p.append(f"{where}/kv_bytes_per_token: must be a positive integer")
        if not _optional(m, "max_model_len", lambda v: _is_int(v, 1), nullable=True):
            p.append(f"{where}/max_model_len: must be null or a positive integer")
        routing = m.get("routing")
        if not isinstance(routing, dict):
            p.append(f"{where}/routing: must be an object")
        else:
            if not _is_int(routing.get("block_size"), 1):
                p.append(f"{where}/routing/block_size: must be a positive integer")
            for key in ("kv_overlap_weight", "load_weight", "temperature"):
                if not _is_num(routing.get(key)):
                    p.append(f"{where}/routing/{key}: must be a number ≥ 0")
            for key in OPTIONAL_ROUTING:
                if not _optional(routing, key, _is_num):
                    p.append(f"{where}/routing/{key}: must be a number ≥ 0")
        dis = m.get("disaggregation")
        if not isinstance(dis, dict) or not _is_int(dis.get("local_prefill_max_tokens")):
            p.append(f"{where}/disaggregation/local_prefill_max_tokens: must be an integer ≥ 0")
        workers = m.get("workers")
        if not isinstance(workers, list):
            p.append(f"{where}/workers: must be a list")
            continue
        # One set for the whole list (it used to be rebuilt per worker: quadratic).
        ids = [w.get("id") for w in workers if isinstance(w, dict) and _text(w.get("id"), 300)]
        id_set = set(ids)
        if len(id_set) != len(ids):
            p.append(f"{where}/workers: worker ids must be unique")
        for j, w in enumerate(workers):
            p.extend(_worker_problems(w, f"{where}/workers/{j}", id_set))
            if len(p) > MAX_PROBLEMS:
                return [*p[:MAX_PROBLEMS], "… (more problems not listed)"]
    return p


MAX_PROBLEMS = 100


def _worker_problems(w: Any, where: str, ids: set) -> list[str]:
    if not isinstance(w, dict):
        return [f"{where}: must be an object"]
    p = []
    if not _text(w.get("id"), 300):
        p.append(f"{where}/id: must be a string of 1–300 characters")
    url = w.get("url")
    if not isinstance(url, str) or not _URL.search(url):
        p.append(f"{where}/url: must be an http(s) URL")
    if not _in(w.get("role"), ROLES):
        p.append(f"{where}/role: must be one of {ROLES}")
    if "previous_role" in w and not _in(w["previous_role"], (*ROLES, None)):
        p.append(f"{where}/previous_role: must be null or one of {ROLES}")
    if not _in(w.get("state"), STATES):
        p.append(f"{where}/state: must be one of {STATES}")
    if not _text(w.get("node")):
        p.append(f"{where}/node: must be a non-empty string")
    if not _optional(w, "engine", lambda v: isinstance(v, str)):
        p.append(f"{where}/engine: must be a string")
    if not _optional(w, "metrics_url", lambda v: isinstance(v, str), nullable=True):
        p.append(f"{where}/metrics_url: must be null or a string")
    cap = w.get("capacity")
    if not isinstance(cap, dict):
        p.append(f"{where}/capacity: must be an object")
    else:
        for key, lo in (("gpus", 0), ("tp_size", 1), ("kv_tokens", 0)):
            if not _is_int(cap.get(key), lo):
                p.append(f"{where}/capacity/{key}: must be an integer ≥ {lo}")
        if not _optional(cap, "gpu_memory_bytes", _is_int):
            p.append(f"{where}/capacity/gpu_memory_bytes: must be an integer ≥ 0")
    events = w.get("kv_events")
    if events is not None:
        if not isinstance(events, dict) or not isinstance(events.get("endpoint"), str) or \
                not events["endpoint"].startswith(("tcp://", "ipc://", "inproc://")):
            p.append(f"{where}/kv_events/endpoint: must be a tcp://, ipc:// or inproc:// "
                     "endpoint")
        elif not _optional(events, "replay_endpoint", lambda v: isinstance(v, str),
                           nullable=True):
            p.append(f"{where}/kv_events/replay_endpoint: must be null or a string")
    paths = w.get("kv_paths")
    if not isinstance(paths, list):
        p.append(f"{where}/kv_paths: must be a list")
        return p
    for k, path in enumerate(paths):
        pw = f"{where}/kv_paths/{k}"
        if not isinstance(path, dict):
            p.append(f"{pw}: must be an object")
            continue
        to = path.get("to")
        if not _text(to) or to not in ids:
            p.append(f"{pw}/to: unknown worker {repr(to)[:80]}")
        if not _in(path.get("link"), LINKS):
            p.append(f"{pw}/link: must be one of {LINKS}")
        if not _is_num(path.get("bandwidth_gbps")):
            p.append(f"{pw}/bandwidth_gbps: must be a number ≥ 0")
        if not isinstance(path.get("rdma"), bool):
            p.append(f"{pw}/rdma: must be a boolean")
        if not _optional(path, "fabric", lambda v: isinstance(v, str), nullable=True):
            p.append(f"{pw}/fabric: must be null or a string")
    return p


def parse(raw: Any) -> RoutingTable:
    """Validate and build the gateway's view of a table; raises :class:`TableError`."""
    problems = validate(raw)
    if problems:
        raise TableError(problems)
    models = {}
    for m in raw["models"]:
        routing = m["routing"]
        workers = []
        for w in m["workers"]:
            events = w.get("kv_events") or {}
            workers.append(
                WorkerEntry(
                    id=w["id"],
                    url=w["url"].strip().rstrip("/"),
                    role=w["role"],
                    state=w["state"],
                    node=w["node"],
                    engine=str(w.get("engine") or "vllm"),
                    previous_role=w.get("previous_role"),
                    kv_tokens=int(w["capacity"]["kv_tokens"]),
                    kv_events_endpoint=events.get("endpoint"),
                    kv_replay_endpoint=events.get("replay_endpoint"),
                    kv_paths={
                        p["to"]: KvPath(p["to"], p["link"], float(p["bandwidth_gbps"]), p["rdma"])
                        for p in w["kv_paths"]
                    },
                )
            )
        models[m["name"]] = ModelRoute(
            name=m["name"],
            mode=m["mode"],
            kv_block_size=int(m["kv_block_size"]),
            block_size=int(routing["block_size"]),
            kv_overlap_weight=float(routing["kv_overlap_weight"]),
            load_weight=float(routing["load_weight"]),
            temperature=float(routing["temperature"]),
            local_prefill_max_tokens=int(m["disaggregation"]["local_prefill_max_tokens"]),
            kv_bytes_per_token=int(m.get("kv_bytes_per_token") or 1),
            workers=tuple(workers),
            **{key: float(routing[key]) for key in OPTIONAL_ROUTING if key in routing},
        )
    return RoutingTable(version=int(raw["version"]), cluster=raw["cluster"], models=models,
                        raw=raw)


@dataclass
class ApplyResult:
    outcome: str  # ack | stale | nack
    applied_version: int
    error: str = ""
    # Why a table was refused, for machines: invalid_table, wrong_cluster, not_json,
    # too_large, stale (empty on ACK); ``problems`` lists what validation found.
    reason: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def http_status(self) -> int:
        return {"ack": 200, "stale": 409, "nack": 422}[self.outcome]

    def as_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"status": self.outcome, "applied_version": self.applied_version}
        if self.error:
            body["error"] = self.error
        if self.reason:
            body["reason"] = self.reason
        if self.problems:
            body["problems"] = self.problems[:MAX_PROBLEMS]
        return body


class TableStore:
    """Holds the current table. A new one replaces it only if valid and newer."""

    def __init__(self, state_file: str | Path | None = None, cluster: str | None = None):
        self.current: RoutingTable | None = None
        self.last_error = ""
        self.state_file = Path(state_file) if state_file else None
        # The gateway's cluster: configured, or else pinned by the first table applied. A
        # signed table for another cluster is refused (one secret may serve several).
        self.cluster = cluster
        self._listeners: list = []

    @property
    def version(self) -> int:
        return self.current.version if self.current else 0

    def on_change(self, callback) -> None:
        self._listeners.append(callback)

    def apply(self, raw: Any, *, allow_same: bool = True) -> ApplyResult:
        try:
            table = parse(raw)
        except TableError as exc:
            return self.refuse("invalid_table", str(exc), exc.problems)
        except Exception as exc:  # validation missed something: still a refusal, not a 500
            log.exception("routing table could not be built")
            return self.refuse("invalid_table", f"table could not be built: {exc!r}"[:500])
        if self.cluster is not None and table.cluster != self.cluster:
            return self.refuse(
                "wrong_cluster",
                f"table is for cluster {table.cluster!r}; this gateway serves {self.cluster!r}")
        if self.current is not None:
            if table.version < self.current.version or (
                table.version == self.current.version
                and (not allow_same or table.raw != self.current.raw)
            ):
                return ApplyResult(
                    "stale", self.version,
                    f"version {table.version} is not newer than applied {self.version}",
                    reason="stale",
                )
            if table.version == self.current.version:
                return ApplyResult("ack", self.version)  # idempotent redelivery
        self.current = table
        self.cluster = table.cluster
        self.last_error = ""
        self._persist(raw)
        log.info("routing table v%d applied (%d models)", table.version, len(table.models))
        for callback in self._listeners:
            try:
                callback(table)
            except Exception:
                log.exception("table listener failed")
        return ApplyResult("ack", table.version)

    def refuse(self, reason: str, error: str, problems: list[str] | None = None) -> ApplyResult:
        """A NACK: the current table stays."""
        self.last_error = error
        log.warning("routing table refused (kept v%d): %s", self.version, error)
        return ApplyResult("nack", self.version, error, reason, list(problems or []))

    def load_file(self, path: str | Path) -> ApplyResult:
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            self.last_error = f"cannot read {path}: {exc}"
            return ApplyResult("nack", self.version, self.last_error)
        return self.apply(raw)

    def _persist(self, raw: dict) -> None:
        if not self.state_file:
            return
        try:
            self.state_file.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.state_file.parent, prefix=".table-")
            with os.fdopen(fd, "wb") as fh:
                fh.write(orjson.dumps(raw))
            os.replace(tmp, self.state_file)
        except OSError as exc:
            log.warning("could not save the table to %s: %s", self.state_file, exc)
