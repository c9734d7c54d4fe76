"""Alert rules: pure evaluation over a plain snapshot of the fleet.

No Django import. :func:`evaluate` takes a :class:`FleetSnapshot` (built by
``controlplane.alerts.inputs`` from topology and hot state), the thresholds and a small
``memory`` mapping carried from the previous evaluation (previous NIC counters, cache-hit
baselines), and returns the conditions that are true *now* as :class:`Observation` objects
plus the memory for the next run. Whether an observation becomes a firing alert — the
``for`` duration, dedupe, silences, grouping — is decided by ``lifecycle``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pdcatalog as catalog

# --- Rule names (the ``alertname`` label) ------------------------------------------------
NODE_OFFLINE = "NodeOffline"
GPU_MEMORY_HIGH = "GpuMemoryHigh"
KV_CACHE_HIGH = "KvCacheUsageHigh"
TTFT_OVER_SLO = "TtftP95OverSlo"
ITL_OVER_SLO = "ItlP95OverSlo"
NIC_ERRORS_RISING = "NicErrorsRising"
KV_EVENTS_STALLED = "KvEventsStalled"
CACHE_HIT_COLLAPSED = "CacheHitRateCollapsed"
ROUTING_PUSH_FAILING = "RoutingPushFailing"
GATEWAY_LAGGING = "GatewayLagging"
PLAN_FAILED = "PlanFailed"
AGENT_SKEW = "AgentVersionSkew"
WEBHOOK_ENDPOINT_DISABLED = "WebhookEndpointDisabled"
GPU_PROFILE_ESTIMATED = "GpuProfileEstimated"
PD_PAIR_UNHEALTHY = "PdPairUnhealthy"

SEVERITIES = ("info", "warning", "critical")
SEVERITY_RANK = {name: rank for rank, name in enumerate(SEVERITIES)}


@dataclass(frozen=True)
class RuleConfig:
    """One rule's knobs. ``threshold`` means what the rule's doc says (a fraction, a count…)."""

    enabled: bool = True
    severity: str = "warning"
    for_s: float = 0.0
    threshold: float = 0.0


# Sane defaults; AlertRule rows (per cluster or global) override them field by field.
DEFAULT_RULES: dict[str, RuleConfig] = {
    # threshold: seconds since the last report before a node counts as offline
    NODE_OFFLINE: RuleConfig(severity="critical", for_s=60, threshold=60),
    # threshold: used / total GPU memory
    GPU_MEMORY_HIGH: RuleConfig(severity="warning", for_s=300, threshold=0.97),
    # threshold: KV-cache usage fraction
    KV_CACHE_HIGH: RuleConfig(severity="warning", for_s=300, threshold=0.95),
    # threshold: ratio of measured p95 to the policy SLO (1.0 = at the SLO)
    TTFT_OVER_SLO: RuleConfig(severity="warning", for_s=300, threshold=1.0),
    ITL_OVER_SLO: RuleConfig(severity="warning", for_s=300, threshold=1.0),
    # threshold: new errors + drops per second on one NIC
    NIC_ERRORS_RISING: RuleConfig(severity="warning", for_s=120, threshold=1.0),
    # threshold: seconds without a KV event from a worker that has traffic
    KV_EVENTS_STALLED: RuleConfig(severity="warning", for_s=60, threshold=120),
    # threshold: the baseline hit rate that makes a drop to zero alarming
    CACHE_HIT_COLLAPSED: RuleConfig(severity="warning", for_s=300, threshold=0.10),
    # threshold: consecutive failed pushes (or any recorded error) — see the rule
    ROUTING_PUSH_FAILING: RuleConfig(severity="critical", for_s=60, threshold=1),
    # threshold: versions behind the latest routing table
    GATEWAY_LAGGING: RuleConfig(severity="warning", for_s=120, threshold=2),
    PLAN_FAILED: RuleConfig(severity="warning", for_s=0, threshold=0),
    AGENT_SKEW: RuleConfig(severity="warning", for_s=0, threshold=0),
    WEBHOOK_ENDPOINT_DISABLED: RuleConfig(severity="warning", for_s=0, threshold=0),
    # A GPU model the hardware catalog does not know: the planner uses an estimate for it.
    GPU_PROFILE_ESTIMATED: RuleConfig(severity="warning", for_s=0, threshold=0),
    # A prefill→decode pair the gateway stopped pairing (circuit open or probing); threshold:
    # failures of the pair so far before it pages (0: any unhealthy pair).
    PD_PAIR_UNHEALTHY: RuleConfig(severity="warning", for_s=60, threshold=0),
}


class RuleConfigError(ValueError):
    """A rule override names an unknown rule or field, or has an out-of-range value."""


def merge_rule_config(base: RuleConfig, override: Mapping[str, Any]) -> RuleConfig:
    unknown = set(override) - {"enabled", "severity", "for_s", "threshold"}
    if unknown:
        raise RuleConfigError(f"unknown rule field(s): {', '.join(sorted(unknown))}")
    values = {k: v for k, v in override.items() if v is not None}
    merged = replace(base, **values)
    if merged.severity not in SEVERITY_RANK:
        raise RuleConfigError(f"severity {merged.severity!r} is not one of {SEVERITIES}")
    if merged.for_s < 0:
        raise RuleConfigError("for_s must not be negative")
    return merged


# --- Snapshot ------------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuFacts:
    index: int
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None


@dataclass(frozen=True)
class NicFacts:
    name: str
    errors_total: int | None = None  # cumulative counters as the agent reports them
    drops_total: int | None = None


@dataclass(frozen=True)
class NodeFacts:
    cluster: str
    node: str
    # Seconds since the last report; None = never reported.
    last_report_age_s: float | None = None
    # False: no agent ever reported for this node — "not monitored" on every page, and
    # not offline either (nothing to page anyone about; nothing else is judged).
    monitored: bool = True
    maintenance: bool = False
    agent_version: str = ""
    agent_protocol: int | None = None
    gpus: tuple[GpuFacts, ...] = ()
    nics: tuple[NicFacts, ...] = ()
    gpu_products: tuple[str, ...] = ()  # product names of the node's GPUs (inventory)


@dataclass(frozen=True)
class WorkerFacts:
    cluster: str
    node: str
    model: str
    worker: str
    stale: bool = False  # its node stopped reporting: its numbers are old, judge nothing
    active: bool = True
    kv_usage: float | None = None  # 0..1
    ttft_p95_ms: float | None = None
    itl_p95_ms: float | None = None
    ttft_slo_ms: float | None = None
    itl_slo_ms: float | None = None
    has_traffic: bool = False
    kv_events_age_s: float | None = None  # seconds since the last KV event, if known
    # Or the feed's sequence number: the rules remember when it last moved.
    kv_events_seq: int | None = None
    kv_events_connected: bool | None = None
    # The agent's own verdict on the feed (events were expected and none came, or its
    # liveness probe went unanswered): its picture of the cache is not to be trusted.
    kv_events_stalled: bool | None = None
    prefix_hit_rate: float | None = None  # 0..1


@dataclass(frozen=True)
class PdPairFacts:
    """A prefill→decode pair as one gateway sees it (only pairs that have failed are
    tracked by the gateway; a healthy one may be listed after it recovered)."""

    prefill: str
    decode: str
    state: str  # healthy | unhealthy | probing
    failures: int = 0
    last_failure: str = ""  # prefill_failed | transfer_refused | …


@dataclass(frozen=True)
class GatewayFacts:
    cluster: str
    gateway: str
    applied_version: int = 0
    latest_version: int | None = None  # None: no routing table yet (routing app absent)
    push_error: str = ""  # the last push's error, "" after a successful ACK
    consecutive_push_failures: int = 0
    pd_pairs: tuple[PdPairFacts, ...] = ()  # from the gateway's health answer, if read
    # (worker id in the table, reason) of the KV-event streams the gateway found stalled:
    # it routes those workers on its approximate index meanwhile.
    stalled_kv_streams: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class PlanFacts:
    cluster: str
    model: str
    status: str  # ok | failed | infeasible | all-layouts-miss (holding: every layout misses)
    reason: str = ""
    plan_id: str = ""


@dataclass(frozen=True)
class EndpointFacts:
    endpoint: str
    disabled_reason: str


@dataclass(frozen=True)
class FleetSnapshot:
    now: float  # Unix seconds
    nodes: tuple[NodeFacts, ...] = ()
    workers: tuple[WorkerFacts, ...] = ()
    gateways: tuple[GatewayFacts, ...] = ()
    plans: tuple[PlanFacts, ...] = ()
    disabled_endpoints: tuple[EndpointFacts, ...] = ()
    # The protocol the control plane speaks and the agent version it ships with.
    expected_agent_protocol: int | None = None
    expected_agent_version: str = ""


@dataclass(frozen=True)
class Observation:
    """A rule's condition holding for one subject right now."""

    rule: str
    severity: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    for_s: float = 0.0

    @property
    def all_labels(self) -> dict[str, str]:
        return {"alertname": self.rule, "severity": self.severity, **self.labels}


@dataclass
class EvaluationResult:
    observations: list[Observation] = field(default_factory=list)
    memory: dict[str, Any] = field(default_factory=dict)


def _labels(**values: str | None) -> dict[str, str]:
    return {k: str(v) for k, v in values.items() if v not in (None, "")}


def _fmt_pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def _major(version: str) -> str:
    return version.split(".", 1)[0].lstrip("v") if version else ""


def evaluate(
    snapshot: FleetSnapshot,
    rules: Mapping[str, RuleConfig] | None = None,
    memory: Mapping[str, Any] | None = None,
) -> EvaluationResult:
    """Every rule over the snapshot. Deterministic: the same inputs give the same output."""
    cfg = dict(DEFAULT_RULES)
    cfg.update(rules or {})
    memory = dict(memory or {})
    out = EvaluationResult()
    new_nic_counters: dict[str, list] = {}
    new_hit_baselines: dict[str, float] = {}
    new_kv_seq: dict[str, list] = {}

    def emit(rule: str, labels: dict[str, str], summary: str, description: str = "") -> None:
        rc = cfg[rule]
        annotations = {"summary": summary}
        if description:
            annotations["description"] = description
        out.observations.append(Observation(rule, rc.severity, labels, annotations, rc.for_s))

    def on(rule: str) -> bool:
        return cfg[rule].enabled

    stale_nodes = set()
    for n in snapshot.nodes:
        labels = _labels(cluster=n.cluster, node=n.node)
        if not n.monitored:
            stale_nodes.add((n.cluster, n.node))
            continue
        offline = not n.maintenance and (
            n.last_report_age_s is None or n.last_report_age_s > cfg[NODE_OFFLINE].threshold
        )
        if offline:
            stale_nodes.add((n.cluster, n.node))
            if on(NODE_OFFLINE):
                age = (
                    "never reported"
                    if n.last_report_age_s is None
                    else f"last report {n.last_report_age_s:.0f} s ago"
                )
                emit(NODE_OFFLINE, labels, f"Node {n.node} is offline ({age})")
            continue  # an offline node's other numbers are stale: judge nothing else

        if on(GPU_MEMORY_HIGH):
            limit = cfg[GPU_MEMORY_HIGH].threshold
            for g in n.gpus:
                if g.memory_used_bytes is None or not g.memory_total_bytes:
                    continue
                used = g.memory_used_bytes / g.memory_total_bytes
                if used >= limit:
                    emit(
                        GPU_MEMORY_HIGH,
                        {**labels, "gpu": str(g.index)},
                        f"GPU {g.index} on {n.node} memory at {_fmt_pct(used)}",
                        f"Threshold {_fmt_pct(limit)}.",
                    )

        for nic in n.nics:
            key = f"{n.cluster}/{n.node}/{nic.name}"
            if nic.errors_total is None and nic.drops_total is None:
                continue
            total = (nic.errors_total or 0) + (nic.drops_total or 0)
            new_nic_counters[key] = [total, snapshot.now]
            prev = memory.get("nic", {}).get(key)
            if not on(NIC_ERRORS_RISING) or not prev:
                continue
            prev_total, prev_at = prev
            elapsed = snapshot.now - prev_at
            # A counter that went down means the agent or the NIC restarted: a new baseline.
            if elapsed <= 0 or total < prev_total:
                continue
            rate = (total - prev_total) / elapsed
            if rate >= cfg[NIC_ERRORS_RISING].threshold:
                emit(
                    NIC_ERRORS_RISING,
                    {**labels, "nic": nic.name},
                    f"NIC {nic.name} on {n.node}: {rate:.1f} errors+drops/s",
                )

        if on(GPU_PROFILE_ESTIMATED):
            for product in sorted(set(n.gpu_products)):
                found = catalog.lookup_gpu(product)
                if found.estimated:
                    emit(GPU_PROFILE_ESTIMATED, {**labels, "gpu_product": product},
                         f"GPU {product!r} on {n.node} is not in the hardware catalog: "
                         "the planner uses an estimated profile", found.reason)

        if on(AGENT_SKEW):
            reasons = []
            if (
                snapshot.expected_agent_protocol is not None
                and n.agent_protocol is not None
                and n.agent_protocol != snapshot.expected_agent_protocol
            ):
                reasons.append(
                    f"protocol {n.agent_protocol}, control plane speaks "
                    f"{snapshot.expected_agent_protocol}"
                )
            if (
                snapshot.expected_agent_version
                and n.agent_version
                and _major(n.agent_version) != _major(snapshot.expected_agent_version)
            ):
                reasons.append(
                    f"agent {n.agent_version}, control plane ships "
                    f"{snapshot.expected_agent_version}"
                )
            if reasons:
                emit(AGENT_SKEW, labels, f"Agent on {n.node} is skewed: {'; '.join(reasons)}")

    for w in snapshot.workers:
        if w.stale or (w.cluster, w.node) in stale_nodes or not w.active:
            continue
        labels = _labels(cluster=w.cluster, node=w.node, model=w.model, worker=w.worker)
        if (
            on(KV_CACHE_HIGH)
            and w.kv_usage is not None
            and w.kv_usage >= cfg[KV_CACHE_HIGH].threshold
        ):
            emit(KV_CACHE_HIGH, labels, f"KV cache of {w.worker} at {_fmt_pct(w.kv_usage)}")
        for rule, measured, slo, what in (
            (TTFT_OVER_SLO, w.ttft_p95_ms, w.ttft_slo_ms, "TTFT"),
            (ITL_OVER_SLO, w.itl_p95_ms, w.itl_slo_ms, "ITL"),
        ):
            if not on(rule) or measured is None or not slo:
                continue
            if measured > slo * cfg[rule].threshold:
                emit(
                    rule,
                    labels,
                    f"{what} p95 of {w.worker} is {measured:.0f} ms (SLO {slo:.0f} ms)",
                )
        kv_age = w.kv_events_age_s
        if kv_age is None and w.kv_events_seq is not None:
            key = f"{w.cluster}/{w.node}/{w.worker}"
            prev = memory.get("kvseq", {}).get(key)
            # The feed is alive while its sequence number moves; a disconnected feed
            # does not move either, so both read as "stalled since the last change".
            since = prev[1] if prev and prev[0] == w.kv_events_seq else snapshot.now
            new_kv_seq[key] = [w.kv_events_seq, since]
            kv_age = snapshot.now - since
        if (
            on(KV_EVENTS_STALLED)
            and w.has_traffic
            and kv_age is not None
            and kv_age > cfg[KV_EVENTS_STALLED].threshold
        ):
            emit(
                KV_EVENTS_STALLED,
                labels,
                f"No KV events from {w.worker} for {kv_age:.0f} s while serving",
                "KV-aware routing is working from a stale picture of this worker's cache.",
            )
        elif on(KV_EVENTS_STALLED) and w.kv_events_stalled:
            emit(
                KV_EVENTS_STALLED,
                labels,
                f"KV-event stream of {w.worker} is stalled (the agent's verdict)",
                "Events were expected and none came; routing falls back to the approximate "
                "prefix index for this worker until the stream answers again.",
            )
        if w.prefix_hit_rate is not None:
            key = f"{w.cluster}/{w.node}/{w.worker}"
            baseline = float(memory.get("hit", {}).get(key, 0.0))
            # Slow-moving baseline: a collapse is measured against the recent normal,
            # and the baseline itself decays so an intended change settles in.
            new_hit_baselines[key] = max(w.prefix_hit_rate, baseline * 0.99)
            if (
                on(CACHE_HIT_COLLAPSED)
                and w.has_traffic
                and w.prefix_hit_rate <= 0.001
                and baseline >= cfg[CACHE_HIT_COLLAPSED].threshold
            ):
                emit(
                    CACHE_HIT_COLLAPSED,
                    labels,
                    f"Prefix-cache hit rate of {w.worker} fell to zero (was {_fmt_pct(baseline)})",
                )

    for g in snapshot.gateways:
        labels = _labels(cluster=g.cluster, gateway=g.gateway)
        if (
            on(ROUTING_PUSH_FAILING)
            and g.push_error
            and g.consecutive_push_failures >= cfg[ROUTING_PUSH_FAILING].threshold
        ):
            emit(
                ROUTING_PUSH_FAILING,
                labels,
                f"Routing table push to {g.gateway} failing: {g.push_error[:200]}",
            )
        if on(PD_PAIR_UNHEALTHY):
            for pair in g.pd_pairs:
                if pair.state == "healthy" or pair.failures < cfg[PD_PAIR_UNHEALTHY].threshold:
                    continue
                emit(
                    PD_PAIR_UNHEALTHY,
                    {**labels, "prefill": pair.prefill, "decode": pair.decode},
                    f"P/D pair {pair.prefill} → {pair.decode} is {pair.state} at {g.gateway}"
                    + (f" ({pair.last_failure})" if pair.last_failure else ""),
                    f"{pair.failures} failure(s) so far; the gateway routes around the pair "
                    "and re-probes it.",
                )
        if on(KV_EVENTS_STALLED):
            for worker_id, reason in g.stalled_kv_streams:
                emit(
                    KV_EVENTS_STALLED,
                    {**labels, "worker": worker_id},
                    f"Gateway {g.gateway} finds the KV-event stream of {worker_id} stalled"
                    + (f" ({reason})" if reason else ""),
                    "It routes that worker on its approximate prefix index until the stream "
                    "answers again.",
                )
        if on(GATEWAY_LAGGING) and g.latest_version is not None:
            behind = g.latest_version - g.applied_version
            if behind >= cfg[GATEWAY_LAGGING].threshold:
                emit(
                    GATEWAY_LAGGING,
                    labels,
                    f"Gateway {g.gateway} is {behind} routing versions behind "
                    f"(applied {g.applied_version}, latest {g.latest_version})",
                )

    if on(PLAN_FAILED):
        for p in snapshot.plans:
            if p.status in ("failed", "infeasible", "all-layouts-miss"):
                emit(
                    PLAN_FAILED,
                    _labels(cluster=p.cluster, model=p.model),
                    f"Plan for {p.model} is {p.status}" + (f": {p.reason}" if p.reason else ""),
                )

    if on(WEBHOOK_ENDPOINT_DISABLED):
        for e in snapshot.disabled_endpoints:
            emit(
                WEBHOOK_ENDPOINT_DISABLED,
                _labels(endpoint=e.endpoint),
                f"Webhook endpoint {e.endpoint} was disabled: {e.disabled_reason}",
            )

    out.memory = {"nic": new_nic_counters, "hit": new_hit_baselines, "kvseq": new_kv_seq}
    return out
