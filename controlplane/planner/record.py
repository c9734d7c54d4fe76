"""The planner's decision as a record: one typed verdict per step, with its numbers.

Pure. :func:`controlplane.planner.planner.plan_model` runs observe → predict candidates →
choose → gate → step; each step returns one of the verdicts below. The explanation
(:mod:`.explain`), the API, the webhook text and the dashboard are rendered from the record,
so none of them can say something the code did not do. ``DecisionRecord.as_dict`` is what
is stored with the plan (``Plan.record``) and in the planner state.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from .costmodel import Prediction, layout_name

RECORD_VERSION = 1


@dataclass(frozen=True)
class LayoutState:
    """Worker roles as they are: pure prefill, pure decode, 'both' (serving whole requests
    in place) and draining (finishing old work; counted under the role they drain to)."""

    prefill: int = 0
    decode: int = 0
    both: int = 0
    draining: int = 0

    @property
    def workers(self) -> int:
        return self.prefill + self.decode + self.both

    @property
    def pure(self) -> bool:
        """Aggregated (all 'both') or a clean P:D split (no 'both' beside prefill)."""
        return (self.prefill == 0 and self.decode == 0) or (self.both == 0 and self.prefill > 0)

    def label(self) -> str:
        if self.prefill == 0 and self.decode == 0:
            text = "aggregated"
        elif self.both == 0 and self.prefill > 0:
            text = layout_name(self.prefill, self.decode)
        else:
            parts = [f"{n}{k}" for n, k in ((self.prefill, "P"), (self.decode, "D")) if n]
            if self.both:
                parts.append(f"{self.both} both")
            text = " + ".join(parts)
        return text + (f" ({self.draining} draining)" if self.draining else "")


@dataclass(frozen=True)
class MoveMemory:
    """What the planner remembers between cycles about its last move (A → B): where it
    started, where it is heading, when it decided and at which load. It makes a move under
    way visible as one move ("step 2 of 5") and keeps A → B → A out of a dwell window."""

    origin_prefill: int
    target_prefill: int
    origin_layout: str
    target_layout: str
    decided_at: float
    rate_rps: float
    isl_mean: float
    osl_mean: float
    step_limit: int = 1
    steps_total: int = 1
    reason: str = ""  # the gate's reason for the move (surge-headroom moves are continued)

    def as_dict(self) -> dict:
        return {k: _num(v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict | None) -> MoveMemory | None:
        """From a stored dict; None when absent or malformed (the planner then plans as if
        it had no memory, which is safe: it only loosens nothing)."""
        if not isinstance(data, dict):
            return None
        try:
            return cls(
                int(data["origin_prefill"]), int(data["target_prefill"]),
                str(data["origin_layout"]), str(data["target_layout"]),
                float(data["decided_at"]), float(data["rate_rps"]),
                float(data["isl_mean"]), float(data["osl_mean"]),
                max(int(data.get("step_limit", 1)), 1), max(int(data.get("steps_total", 1)), 1),
                str(data.get("reason", "")),
            )
        except (KeyError, TypeError, ValueError):
            return None


REGIME_LOAD = ("rate_rps", "isl_mean", "osl_mean", "prefix_hit", "isl_p50", "isl_p95")


@dataclass(frozen=True)
class Regime:
    """The load regime the planner is in (:mod:`.dwell`): since when (the start of the
    window that first showed it), last seen when, its reference load (``REGIME_LOAD``:
    rate, prompt mean, answer mean, prefix hit, prompt p50 and p95, 0 = unknown), over how
    many cycles, and the past regimes, oldest first, as (seconds lasted, *their load*)."""

    started_at: float
    last_seen: float
    load: tuple[float, ...]
    cycles: int = 1
    history: tuple[tuple[float, ...], ...] = ()  # a length < 0: censored (start not seen)
    censored: bool = False  # began before the planner looked (the first one seen)

    def as_dict(self) -> dict:
        return {"started_at": _num(self.started_at), "last_seen": _num(self.last_seen),
                "load": [_num(float(x)) for x in self.load], "cycles": self.cycles,
                "history": [[_num(float(x)) for x in h] for h in self.history],
                "censored": self.censored}

    @classmethod
    def from_dict(cls, data: dict | None) -> Regime | None:
        """From a stored dict; None when absent or malformed (the next move is then not
        priced: there is no basis for a dwell, as on the first cycle)."""
        if not isinstance(data, dict):
            return None
        try:
            n = len(REGIME_LOAD)
            load = tuple(float(x) for x in data["load"])
            hist = tuple(tuple(float(x) for x in h) for h in data.get("history") or ())
            t0, t1 = float(data["started_at"]), float(data["last_seen"])
            flat = (t0, t1, *load, *(x for h in hist for x in h))
            if len(load) != n or any(len(h) != n + 1 for h in hist) or not all(
                    math.isfinite(v) for v in flat):
                return None
            return cls(t0, t1, load, max(int(data.get("cycles", 1)), 1), hist,
                       bool(data.get("censored", False)))
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class MovePrice:
    """What a move would earn over the load regime's expected remaining dwell and what it
    costs (:func:`.dwell.price_move`): it is started or continued only when it pays."""

    gain_rps: float  # predicted goodput gain over holding, req/s
    age_s: float  # how long the regime has lasted
    dwell_s: float  # its expected remaining life
    dwell_basis: str  # how that was estimated
    delay_s: float  # until the whole gain is in place (drains, then one step per cycle)
    drain_s: float
    period_s: float  # the planning cycle's period
    changes: int  # workers into or out of prefill
    steps: int
    earned_req: float  # requests gained over the expected dwell
    cost_req: float  # requests' worth of capacity lost while workers drain
    # After the regime ends the fleet serves what comes next in the new layout until the
    # planner sees it and moves (``after_s``): the target's goodput minus holding's over
    # what may come next (dwell.next_mix), times that.
    after_s: float = 0.0
    after_gain_rps: float = 0.0
    after_req: float = 0.0
    regimes: int = 0  # distinct loads that mix was taken over
    after_basis: str = ""  # what followed past regimes like this one, or the past mix
    pays: bool = False
    waived: str = ""  # a measured breach: the time not priced (dwell.price_move)

    @property
    def value_req(self) -> float:
        return self.earned_req + self.after_req - self.cost_req


@dataclass(frozen=True)
class Observation:
    """Step 1, observe: the load now and planned for, and the layout as it is."""

    layout: LayoutState
    workers: int
    stale_workers: int
    rate_rps: float
    plan_rate_rps: float
    isl_mean: float
    isl_p95: float | None
    osl_mean: float
    prefix_hit: float
    inflight_peak: int
    measured_ttft_p95_ms: float | None
    measured_itl_p95_ms: float | None
    ttft_target_ms: float
    itl_target_ms: float
    gpu: str
    tp: int
    move: MoveProgress | None = None  # set while a move is under way
    gpu_estimate: str = ""  # why the GPU profile is an estimate ("" when catalogued)
    affinity_share: float | None = None  # measured prefix-affinity share (None: estimated)
    affinity_source: str = ""
    # Measured share of requests conditional P/D prefills on their decode worker (None:
    # counted on the fitted prompts) and where it came from.
    local_prefill_share: float | None = None
    local_prefill_source: str = ""


@dataclass(frozen=True)
class MoveProgress:
    """A move under way, as it is: 'aggregated → 10P:2D, step 2 of 5'."""

    origin_layout: str
    target_layout: str
    target_prefill: int
    step: int
    steps_total: int
    since_s: float  # seconds since the move was decided
    load_shift: float  # largest relative change of rate / prompt / answer since then

    def label(self, now_label: str) -> str:
        return f"{now_label} → {self.target_layout}, step {self.step} of {self.steps_total}"


@dataclass
class CandidateVerdict:
    """Step 2, predict candidates: every feasible layout at the load now; the hold option
    (the layout as it is) and the best few also at the planned load."""

    hold_now: Prediction
    hold_plan: Prediction
    candidates: list[Prediction]
    at_plan: dict[int, Prediction]
    rejected: dict[str, str]
    feasible: list[Prediction]


@dataclass(frozen=True)
class ChoiceVerdict:
    """Step 3, choose: the best layout on the decision score, or a hold because every layout
    is predicted to miss the targets (``all_miss``: an alert fires on it)."""

    best_layout: str
    best_prefill: int
    best_score: tuple
    hold_score: tuple
    all_miss: bool
    binding: str  # the best layout's busiest stage (what limits it)
    best_attainment: float
    hold_attainment: float


@dataclass(frozen=True)
class GateVerdict:
    """Step 4, gate: may the planner move toward the choice this cycle? ``verdict`` is
    go | hold | keep; for a move under way ``move_verdict`` is finish | hold | roll-back | retarget;
    ``extend`` when the choice carries the last move on past its target (dwell.extends_move)."""

    verdict: str
    reason: str
    detail: str = ""
    gain_now: bool = False
    gain_plan: bool = False
    hysteresis: float = 0.0
    target_score: tuple = ()
    hold_score: tuple = ()
    move_verdict: str = ""
    dwell_s: float = 0.0
    load_shift: float = 0.0
    forced: bool = False
    price: MovePrice | None = None  # the move priced against the regime's expected dwell
    # A measured breach the model predicts at this load (dwell.explained_breach): why it
    # did not lift the hysteresis.
    breach_note: str = ""


@dataclass(frozen=True)
class StepVerdict:
    """Step 5, step: the role changes made this cycle and the layout they leave."""

    changes: int
    limit: int
    wanted: int
    after: LayoutState | None
    blocked: dict[str, int] = field(default_factory=dict)
    raised_for_overload: bool = False
    overload: dict | None = None  # the facts behind a larger step (planner._overload)


@dataclass
class DecisionRecord:
    version: int
    model: str
    action: str
    reason: str
    observation: Observation | None
    candidates: CandidateVerdict | None = None
    choice: ChoiceVerdict | None = None
    gate: GateVerdict | None = None
    step: StepVerdict | None = None
    alert: str = ""  # non-empty: a condition an alert rule should raise (e.g. all-miss)
    memory: MoveMemory | None = None  # what the planner remembers after this cycle
    regime: Regime | None = None  # the load regime after this cycle (dwell.track_regime)

    @property
    def label(self) -> str:
        """The layout as it is, and the move under way if any."""
        obs = self.observation
        if obs is None:
            return ""
        now = obs.layout.label()
        return obs.move.label(now) if obs.move else now

    def as_dict(self) -> dict:
        obs = self.observation
        cand = self.candidates
        out = {
            "version": self.version,
            "model": self.model,
            "action": self.action,
            "reason": self.reason,
            "label": self.label,
            "alert": self.alert,
            "observe": _plain(asdict(obs)) if obs else None,
            "predict": None,
            "choose": _plain(asdict(self.choice)) if self.choice else None,
            "gate": _plain(asdict(self.gate)) if self.gate else None,
            "step": _plain(asdict(self.step)) if self.step else None,
            "memory": self.memory.as_dict() if self.memory else None,
            "regime": self.regime.as_dict() if self.regime else None,
        }
        if obs:
            out["observe"]["layout_label"] = obs.layout.label()
        if cand is not None:
            out["predict"] = {
                "hold_now": cand.hold_now.as_dict(),
                "hold_plan": cand.hold_plan.as_dict(),
                "candidates": [
                    {"layout": c.layout, "goodput_rps": _num(c.goodput_rps),
                     "attainment": _num(c.attainment), "meets_slo": c.meets_slo,
                     "bottleneck": c.bottleneck}
                    for c in cand.candidates
                ],
                "rejected": dict(cand.rejected),
            }
        return out


def _num(v):
    if isinstance(v, float):
        return None if math.isinf(v) or math.isnan(v) else round(v, 6)
    return v


def _plain(v):
    """JSON-safe copy: tuples to lists, non-finite floats to None."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return _num(v)
