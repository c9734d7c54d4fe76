"""The planner's inputs and outputs as plain data: what a planning cycle is given (a model's
workers, load and policy; the settings) and what it returns (the decisions and their role
changes). A module of its own so the steps (steps.py), the explanation (explain.py) and the
cycle that ties them (planner.py) all read these types without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controlplane.policies.effective import DEFAULT_POLICY, EffectivePolicy

from .costmodel import DEFAULT_PARAMS, CostParams, ModelSpec, Prediction, WorkerShape, Workload
from .placement import NodeLinks, WorkerInput
from .record import DecisionRecord, MoveMemory, Regime


@dataclass(frozen=True)
class LoadInput:
    """What the model's workers see now (from hot state), all optional-zero."""

    rate_rps: float = 0.0
    peak_rps: float = 0.0  # recent peak (e.g. max of the last few windows)
    isl_mean: float = 0.0
    isl_p95: float | None = None
    osl_mean: float = 0.0
    prefix_hit: float = 0.0
    inflight: int = 0  # sequences running now, all workers
    inflight_peak: int = 0
    # Measured p95 latencies now (Prometheus or the agents' windows), ms; None = unknown.
    measured_ttft_p95_ms: float | None = None
    measured_itl_p95_ms: float | None = None
    osl_p95: float | None = None
    isl_p50: float | None = None  # with isl_p95: the prompt-length spread (lognormal fit)
    # Share of the aggregated path's routing decisions that followed a cached prefix (the
    # gateway's decisions by reason, from Prometheus); None = unknown: the cost model's
    # bound from the hit rate. ``affinity_source`` says where a known share came from.
    affinity_share: float | None = None
    affinity_source: str = ""
    # Share of requests whose part not cached is at most the policy's
    # local_prefill_max_tokens (conditional P/D prefills those on their decode worker):
    # the gateway's "pd_local_prefill" decisions ÷ its P/D decisions (Prometheus), else
    # the fleet's prompt-length histogram × (1 − hit) (inputs._with_local_prefill); None =
    # unknown: the cost model counts it on its fitted prompts. ``local_prefill_source``
    # says where a known share came from.
    local_prefill_share: float | None = None
    local_prefill_source: str = ""
    # Mean prompt of the requests whose first token came in the window (the prefill side's
    # prompt-token counter ÷ its TTFT count); None = unknown. The lengths above come from
    # finished requests and trail a change of mix by a request's life; this does not.
    first_token_isl: float | None = None


@dataclass(frozen=True)
class ModelInput:
    served_model_id: int
    model: ModelSpec
    shape: WorkerShape
    workers: tuple[WorkerInput, ...]
    load: LoadInput
    policy: EffectivePolicy = DEFAULT_POLICY
    node_links: dict[str, NodeLinks] = field(default_factory=dict)
    params: CostParams = DEFAULT_PARAMS
    change_in_progress: bool = False
    memory: MoveMemory | None = None  # the last move, from the previous cycles' records
    # The load regime as of the previous cycle (its record's ``regime``); None: moves are
    # not priced this cycle (no age or cycle period known yet).
    regime: Regime | None = None
    notes: tuple[str, ...] = ()  # facts the glue wants in the record (e.g. calibration)


@dataclass(frozen=True)
class PlannerSettings:
    growth_margin: float = 0.2  # plan for the recent peak × (1 + margin)
    stale_share_limit: float = 0.5  # fail-static when at least this share of nodes is stale
    exhaustive_limit: int = 48  # above this many workers, search P:D coarse-to-fine
    # Overload's measured half also holds when a measured p95 (TTFT or ITL) is at least
    # this many times its target: far past what windowed-p95 noise or a calibration error
    # explains (see docs/planner.md, step 7).
    overload_latency_factor: float = 1.5
    # No A → B → A within this many seconds of the A → B decision unless the load moved by
    # more than the hysteresis since then.
    dwell_s: float = 900.0
    # ... and the load must have moved by more than max(hysteresis, this) to turn back.
    reverse_margin: float = 0.25
    # A worker still in its cooldown may change again when the load moved past that same
    # margin since the last move (dwell.cooldown_waiver); off: the cooldown always holds.
    waive_cooldown_on_shift: bool = True
    # Prepare for a surge while the load is low (surge.surge_move): leave a layout that
    # serves the load for one predicted to keep the targets at surge_factor × the load the
    # layout as it is can take at this mix, when the planned load is at most
    # surge_load_share of that. 0 turns it off.
    surge_factor: float = 1.5
    surge_load_share: float = 0.5


DEFAULT_SETTINGS = PlannerSettings()


@dataclass(frozen=True)
class RoleChange:
    worker_id: int
    worker: str
    node: str
    from_role: str
    to_role: str

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class ModelDecision:
    served_model_id: int
    model: str
    action: str  # keep | change | hold
    reason: str  # short code: no-traffic, within-hysteresis, better-layout, fail-static, …
    current: Prediction | None  # the layout as it is (the hold option), at the planned load
    target: Prediction | None
    step: Prediction | None  # the layout after this cycle's changes
    current_now: Prediction | None  # the layout as it is at the load measured now
    candidates: list[Prediction]
    changes: list[RoleChange]
    plan_rate_rps: float
    workload: Workload | None
    explanation: str = ""
    notes: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)  # layout → why infeasible
    overload: dict | None = None  # set when this cycle's step was raised for overload
    record: DecisionRecord | None = None

    @property
    def changed(self) -> bool:
        return bool(self.changes)

    @property
    def memory(self) -> MoveMemory | None:
        return self.record.memory if self.record else None

    def predictions_dict(self) -> dict:
        return {
            "plan_rate_rps": round(self.plan_rate_rps, 6),
            "current": self.current.as_dict() if self.current else None,
            "current_now": self.current_now.as_dict() if self.current_now else None,
            "target": self.target.as_dict() if self.target else None,
            "step": self.step.as_dict() if self.step else None,
            "candidates": [p.as_dict() for p in self.candidates],
            "rejected": dict(self.rejected),
            "overload": dict(self.overload) if self.overload else None,
        }


@dataclass
class ClusterDecision:
    models: list[ModelDecision]
    fail_static: bool = False
    reason: str = ""
    stale_nodes: int = 0
    nodes: int = 0
