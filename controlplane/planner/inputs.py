"""Glue: topology (database) + hot state (Redis) + policy → the planner's pure inputs.

The planner core never sees Django objects; this module is the only place that reads them.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import NamedTuple

from django.conf import settings
from django.utils import timezone

from controlplane.policies.models import effective_policy_for
from controlplane.telemetry import hotstate
from controlplane.topology.models import Cluster, ServedModel

from .calibration import CalibrationBook
from .costmodel import DEFAULT_PARAMS, Link, ModelSpec, WorkerShape, gpu_profile_for
from .derive import (
    PEAK_DECAY,
    FirstTokens,
    _num,
    carry_mix,
    counting_roles,
    derive_load,
    in_system,
    local_prefill_share,
    with_arrivals,
    with_arriving_mix,
    worst_p95,
)
from .models import OPEN_STATUSES, ModelPlannerState, Plan
from .placement import NicInput, NodeLinks, WorkerInput
from .planner import LoadInput, ModelInput
from .record import MoveMemory, Regime

log = logging.getLogger(__name__)

_reader = None


class Measured(NamedTuple):
    """What the fleet measured over the planning window for one model (seconds; prompt
    tokens), for calibration and the plan's stored inputs."""

    ttft_p95_s: float | None
    itl_p95_s: float | None
    source: str
    itl_mean_s: float | None = None  # the mean token gap (ITL histogram sum ÷ count)
    # Mean prompt of the window's first tokens (FleetEngineStats.first_token_prompt_mean)
    first_token_prompt_mean: float | None = None
    # Why the window is not a steady state ('' when it is): a backlog filling or draining
    # (derive.with_arrivals), or a new mix arriving (derive.with_arriving_mix).
    # Calibration does not compare such a window.
    backlog: str = ""


NOT_MEASURED = Measured(None, None, "none")


@dataclass
class ClusterInputs:
    models: list[ModelInput]
    nodes_total: int
    nodes_stale: int
    measured: dict[int, Measured]
    states: dict[int, ModelPlannerState]
    snapshot_at: float


def _prometheus():
    global _reader
    url = getattr(settings, "PROMETHEUS_URL", None)
    if not url:
        return None
    if _reader is None or _reader.url != url:
        from controlplane.observability.promread import FleetLatencyReader

        _reader = FleetLatencyReader(url)
    return _reader


def measured_latency(
    served_model: ServedModel, worker_states: list[dict]
) -> tuple[float | None, float | None, str]:
    """(TTFT p95 s, ITL p95 s, source): Prometheus when ``PROMETHEUS_URL`` is set and has
    data, else the worst windowed p95 the model's agents reported."""
    reader = _prometheus()
    if reader is not None:
        figures = reader.model_figures(served_model.name)
        if figures is not None:
            return figures.ttft_p95_s, figures.itl_p95_s, "prometheus"

    return (*worst_p95(worker_states), "agents")


def model_spec(sm: ServedModel) -> ModelSpec:
    # Parameters from the weights: bytes ÷ bytes per parameter (KV dtype as the proxy
    # for the weight dtype: FP8 KV usually goes with FP8 weights).
    dtype = 1.0 if sm.kv_dtype_bytes <= 1 else 2.0
    return ModelSpec(
        name=sm.name,
        layers=sm.layers,
        kv_heads=sm.kv_heads,
        head_dim=sm.head_dim,
        kv_dtype_bytes=sm.kv_dtype_bytes,
        params_b=sm.weight_bytes / dtype / 1e9,
        weight_bytes=float(sm.weight_bytes),
        kv_bytes_per_token_explicit=sm.kv_bytes_per_token_explicit,
        max_model_len=sm.max_model_len,
    )


def _node_links(node) -> NodeLinks:
    gpus = [g for g in node.gpus.all() if not g.missing]
    pcie = Link.pcie(5, 16)
    nvlink = None
    if gpus:
        g = gpus[0]
        pcie = Link("pcie", g.pcie_gbs, f"PCIe Gen{g.pcie_generation} x{g.pcie_width}")
        nv = [x.nvlink_bandwidth_gbs for x in gpus if x.nvlink_group is not None]
        if nv and max(nv) > 0:
            # Inventory gives the per-GPU total; a transfer uses one direction.
            nvlink = Link.nvlink(min(nv) / 2)
    nics = tuple(
        NicInput(n.fabric.name if n.fabric_id else f"{n.transport}-default",
                 n.line_rate_gbps, n.rdma)
        for n in node.nics.all()
        if not n.missing
    )
    return NodeLinks(pcie, nvlink, nics)


def gather_cluster(cluster: Cluster) -> ClusterInputs:
    try:
        snap = hotstate.cluster_snapshot(cluster.pk)
    except Exception as exc:  # Redis down: every node counts as stale → fail-static
        log.warning("hot state unavailable for cluster %s: %s", cluster.pk, exc)
        snap = {"nodes": {}, "workers": {}, "at": 0.0}
    hot_nodes, hot_workers = snap["nodes"], snap["workers"]
    nodes = list(cluster.nodes.prefetch_related("gpus", "nics__fabric"))
    stale_nodes = {
        n.pk for n in nodes if not hot_nodes.get(n.pk) or hot_nodes[n.pk].get("stale")
    }
    links = {n.hostname: _node_links(n) for n in nodes}
    open_models = set(
        Plan.objects.filter(cluster=cluster, status__in=OPEN_STATUSES).exclude(
            status="proposed"
        ).values_list("served_model_id", flat=True)
    )
    models, measured, states = [], {}, {}
    served = ServedModel.objects.filter(cluster=cluster).prefetch_related(
        "workers__gpus", "workers__node"
    )
    for sm in served:
        workers = list(sm.workers.all())
        if not workers:
            continue
        state, _ = ModelPlannerState.objects.get_or_create(served_model=sm)
        states[sm.pk] = state
        policy, _sources = effective_policy_for(sm)
        shapes = Counter()
        gpu_rows = {}
        for w in workers:
            gpus = list(w.gpus.all())
            if gpus:
                key = (gpus[0].product_name, w.tp_size)
                shapes[key] += 1
                gpu_rows[key] = gpus[0]
        if shapes:
            (product, tp), _ = max(shapes.items(), key=lambda kv: (kv[1], kv[0]))
            g = gpu_rows[(product, tp)]
            gpu = gpu_profile_for(product, g.memory_bytes, g.memory_bandwidth_gbs,
                                  (g.nvlink_bandwidth_gbs or 0) / 2, g.pcie_gbs)
        else:
            tp, gpu = 1, gpu_profile_for("")
        winputs, wstates = [], []
        for w in sorted(workers, key=lambda x: (x.node.hostname, x.name)):
            hs = hot_workers.get(w.pk)
            if hs:
                wstates.append(hs)
            group = next((g.nvlink_group for g in w.gpus.all()), None)
            winputs.append(WorkerInput(
                id=w.pk, name=str(w), node=w.node.hostname, nvlink_group=group,
                role=w.desired_role, state=w.state,
                changed_at=w.role_changed_at.timestamp() if w.role_changed_at else None,
                running=int(_num(hs, "running")), waiting=int(_num(hs, "waiting")),
                kv_usage=_num(hs, "kv_usage"),
                stale=(hs is None or bool(hs.get("stale")) or w.node_id in stale_nodes),
            ))
        # Finished requests are counted under these roles: a worker changing role counts as
        # "both" while its old kind's requests can still finish in the window.
        roles = counting_roles(winputs, time.time(), max(float(policy.rebalance_interval_s),
                                                         10.0))
        peak_before = state.peak_rps
        load = _load(sm, state, wstates, roles)
        ttft, itl, source = measured_latency(sm, wstates)
        itl_mean = first_token_isl = first_tokens = None
        # The engines' own counters and histograms, merged over one window: the load the
        # planner predicts for and the fleet p95 it calibrates against come from the same
        # requests (issue 17, item 3). Old agents send none: the token-rate derivation and
        # the agents' windowed p95s above stay in force.
        stats = _fleet_stats(sm.name, roles, float(policy.rebalance_interval_s))
        if stats is not None and stats.request_rate:
            load = _load_from_stats(load, stats, state)
            if stats.ttft_p95_s is not None or stats.itl_p95_s is not None:
                ttft = stats.ttft_p95_s if stats.ttft_p95_s is not None else ttft
                itl = stats.itl_p95_s if stats.itl_p95_s is not None else itl
                source = f"fleet histograms ({stats.source}, {stats.window_s:g} s)"
            itl_mean = stats.itl_mean_s
            first_token_isl = stats.first_token_prompt_mean
            first_tokens = _first_tokens(stats, winputs, state)
        load = _with_affinity(load, sm.name, max(float(policy.rebalance_interval_s), 10.0))
        load = _with_local_prefill(load, sm.name, roles, stats, policy.local_prefill_max_tokens,
                                   max(float(policy.rebalance_interval_s), 10.0))
        # A window without finished requests keeps the last mix with traffic (the load the
        # planner was given last cycle), so the planned peak is priced with real prompts.
        load, carried = carry_mix(load, (state.last_inputs or {}).get("load"))
        # The rate requests arrive at, when the engines' backlog filled or drained over the
        # window (finished requests are then the fleet's pace, not the load).
        load, backlog = with_arrivals(load, in_system(winputs), _held_before(state),
                                      _window_s(state), peak_before)
        # The mix the requests starting in the window bring, when the finished ones still
        # read the last kind of traffic (a change of kind, seen a window early).
        load, mixed = with_arriving_mix(load, first_tokens)
        if backlog or mixed:
            state.peak_rps = load.peak_rps
        load = replace(load, first_token_isl=first_token_isl)
        # Neither window is a steady state for calibration to compare.
        measured[sm.pk] = Measured(ttft, itl, source, itl_mean, first_token_isl,
                                   backlog or mixed)
        # The overload rule reads the measured p95s too (ms; None = unknown).
        load = replace(
            load,
            measured_ttft_p95_ms=ttft * 1000.0 if ttft is not None else None,
            measured_itl_p95_ms=itl * 1000.0 if itl is not None else None,
        )
        # Factors of this window's workload bucket (a phase change switches buckets);
        # a factor that wants out of [0.5, 2] is named in the record as a model error.
        bucket, cal = CalibrationBook.from_dict(state.calibration).factors_for(
            load.isl_mean, load.osl_mean, load.rate_rps)
        notes = tuple(
            f"model error: the {e['metric']} calibration factor wants {e['wanted']:.2f}, "
            f"outside [0.5, 2] (held at {e['held_at']:g}) for workload bucket {bucket}"
            for e in cal.model_errors()
        ) + tuple(note for note in (carried, backlog, mixed) if note)
        models.append(ModelInput(
            served_model_id=sm.pk, model=model_spec(sm), shape=WorkerShape(gpu, tp),
            workers=tuple(winputs), load=load, policy=policy, node_links=links,
            params=cal.apply(DEFAULT_PARAMS), change_in_progress=sm.pk in open_models,
            memory=MoveMemory.from_dict(state.move_memory), notes=notes,
            regime=Regime.from_dict((state.last_record or {}).get("regime")),
        ))
    return ClusterInputs(models, len(nodes), len(stale_nodes), measured, states, snap["at"])


def _first_tokens(stats, winputs: list[WorkerInput], state: ModelPlannerState
                  ) -> FirstTokens | None:
    """The window's first tokens beside its finished requests (derive.with_arriving_mix);
    None without both counts."""
    prompts = stats.request_prompt_tokens
    if stats.first_token_rate is None or stats.first_token_prompt_mean is None or not prompts:
        return None
    window = stats.span_s or stats.window_s
    before = _last_workers(state)
    waiting_before = (sum(max(int(_num(w, "waiting")), 0) for w in before)
                      if before else None)
    waiting = sum(max(w.waiting, 0) for w in winputs)
    return FirstTokens(stats.first_token_rate, stats.first_token_prompt_mean, window,
                       prompts.count,
                       waiting - waiting_before if waiting_before is not None else None)


def _last_workers(state: ModelPlannerState) -> list[dict]:
    workers = (state.last_inputs or {}).get("workers")
    return [w for w in workers if isinstance(w, dict)] if isinstance(workers, list) else []


def _held_before(state: ModelPlannerState) -> int | None:
    """Requests the engines held at the last cycle (running + waiting, from its stored
    inputs); None when unknown."""
    workers = _last_workers(state)
    if not workers:
        return None
    return in_system(WorkerInput(0, "", "", None, running=int(_num(w, "running")),
                                 waiting=int(_num(w, "waiting")))
                     for w in workers)


def _window_s(state: ModelPlannerState) -> float:
    """Seconds since the last cycle (0: none yet)."""
    if state.last_run_at is None:
        return 0.0
    return max((timezone.now() - state.last_run_at).total_seconds(), 0.0)


def _load(sm, state: ModelPlannerState, wstates: list[dict], roles: dict) -> LoadInput:
    """Request rate and lengths from the agents' counters and token rates (see
    :func:`.derive.derive_load`); Prometheus's request rate when agents report none."""
    ext = None
    if not any(_num(s, "requests_per_s") for s in wstates):
        reader = _prometheus()
        fig = reader.model_figures(sm.name) if reader is not None else None
        ext = fig.request_rate if fig is not None and fig.request_rate else None
    d = derive_load(wstates, roles, float(state.expected_output_tokens or 256), state.peak_rps,
                    ext)
    state.peak_rps = d.peak_rps
    return LoadInput(
        rate_rps=d.rate_rps, peak_rps=d.peak_rps, isl_mean=d.isl_mean, isl_p95=None,
        osl_mean=d.osl_mean, prefix_hit=d.prefix_hit, inflight=d.inflight,
        inflight_peak=d.inflight,
    )


def _fleet_stats(name: str, roles: dict, window_s: float):
    try:
        from controlplane.telemetry.enginestats import fleet_engine_stats
    except ImportError:  # pragma: no cover - telemetry without engine stats
        return None
    try:
        return fleet_engine_stats(name, roles, window_s=max(window_s, 10.0))
    except Exception as exc:  # no engine stats must never stop planning
        log.warning("engine stats for %s unavailable: %s", name, exc)
        return None


def _with_affinity(load: LoadInput, name: str, window_s: float) -> LoadInput:
    """The share of requests the gateway routed by prefix affinity, from its routing
    decisions in Prometheus over the planning window; unchanged (None: the cost model's
    estimate from the hit rate) without Prometheus or without an answer."""
    reader = _prometheus()
    if reader is None:
        return load
    try:
        share = reader.affinity_share(name, window_s)
    except Exception as exc:  # a bug or outage there must not stop planning
        log.warning("routing decisions for %s unavailable: %s", name, exc)
        share = None
    if share is None:
        return load
    return replace(load, affinity_share=share,
                   affinity_source=f"gateway decisions, prometheus, {window_s:g} s")


def _with_local_prefill(load: LoadInput, name: str, roles: dict, stats, max_tokens: int,
                        window_s: float) -> LoadInput:
    """The share of requests conditional P/D prefills on their decode worker, best source
    first: (a) the gateway's own decisions in Prometheus ("pd_local_prefill" ÷ its P/D
    decisions; none while the fleet is aggregated), (b) the fleet's merged prompt-length
    histogram (the agents' engine snapshots) at ``max_tokens ÷ (1 − hit)`` — approximate:
    every prompt taken to hit the mean share (derive.local_prefill_share), (c) unchanged
    (None: the cost model places it on its fitted prompts)."""
    if max_tokens <= 0 or not settings.PLANNER_LOCAL_PREFILL_SHARE:
        return load  # no local prefill, or the share is not used (settings: opt-in)
    reader = _prometheus()
    if reader is not None:
        try:
            share = reader.local_prefill_share(name, window_s)
        except Exception as exc:  # a bug or outage there must not stop planning
            log.warning("routing decisions for %s unavailable: %s", name, exc)
            share = None
        if share is not None:
            return replace(load, local_prefill_share=share, local_prefill_source=(
                f"gateway decisions, prometheus, {window_s:g} s"))
    hist, where = getattr(stats, "request_prompt_tokens", None), getattr(stats, "source", "")
    if hist is None and stats is not None and where != "agents":
        # The fleet figures came from Prometheus, which carries no buckets here: the
        # agents' snapshots of the same engines still do.
        try:
            from controlplane.telemetry.enginestats import agents_fleet_stats

            hist, where = agents_fleet_stats(roles, window_s).request_prompt_tokens, "agents"
        except Exception as exc:  # Redis down: unknown, as before
            log.warning("engine snapshots for %s unreadable: %s", name, exc)
            hist = None
    share = local_prefill_share(hist, load.prefix_hit, float(max_tokens))
    if share is None:
        return load
    return replace(load, local_prefill_share=share, local_prefill_source=(
        f"prompt histogram ({where}, {stats.window_s:g} s) at {max_tokens} tokens ÷ "
        f"(1 − {load.prefix_hit:.0%} cached), every prompt taken to hit the mean share"))


def _load_from_stats(load: LoadInput, stats, state: ModelPlannerState) -> LoadInput:
    """Rate from the finished-request counters; prompt and answer lengths (mean, p50, p95)
    from the per-request token histograms, all over the same window."""
    rate = float(stats.request_rate)
    isl = stats.prompt_tokens_mean
    if isl is None and stats.prompt_tokens_per_s is not None:
        isl = stats.prompt_tokens_per_s / rate
    osl = stats.generation_tokens_mean
    if osl is None and stats.generation_tokens_per_s is not None:
        osl = stats.generation_tokens_per_s / rate
    peak = max(rate, state.peak_rps * PEAK_DECAY)
    state.peak_rps = peak
    return replace(
        load, rate_rps=rate, peak_rps=peak,
        isl_mean=isl if isl is not None else load.isl_mean,
        isl_p50=stats.prompt_tokens_p50, isl_p95=stats.prompt_tokens_p95,
        osl_mean=osl if osl is not None else load.osl_mean,
        osl_p95=stats.generation_tokens_p95,
    )
