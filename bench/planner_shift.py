"""The planner on shifting load, in the product's own loop, vs every static layout.

    .venv/bin/python bench/planner_shift.py [--quick] [--jobs 2] [--json OUT]

Virtual time (``workers_agent.sim.virtual``). Every control interval the loop does what the
product does, as far as it exists in pure code:

1. **agent reports** — per engine, what the agent sends: running/waiting, KV usage, prefix
   hit rate, prompt and generated tokens/s and finished requests/s from the engine's
   cumulative counters over the interval;
2. **the control plane's derivation** — :func:`controlplane.planner.derive.derive_load`
   (the function ``controlplane.planner.inputs`` calls on hot state) turns them into the
   planner's load; the measured p95 TTFT/ITL is the fleet's over the same interval (what
   merged engine histograms give);
3. **calibration** — :class:`controlplane.planner.calibration.CalibrationBook`: factors per
   workload bucket, compared only on a stable mix, bounded with model errors surfaced;
4. **the planner** — :func:`controlplane.planner.planner.plan_model` with its move memory;
5. **apply with drain** — role changes go to the fleet, which drains each worker before it
   takes its new role; routing is the fleet's router.

Workloads, each on both sample clusters: ``demo`` (chat → RAG → quiet, three cycles),
``azure-diurnal`` (Azure conversation lengths, rate 0.5× → 3× → 0.5× the trace's own),
(``demo`` rates: RAG at prediction_accuracy's load 1, chat at 0.3 of its load 1, quiet at
0.05),
``mooncake-step`` (Mooncake lengths and prefixes, rate 1× → 4× → 1×). Static layouts run on
the same arrivals: every P on the RTX cluster (8 workers), every fourth on the H200 one
(32 workers; ``--all-static`` for all). Goodput = requests that arrived in the window and met
both targets (TTFT, per-request mean ITL) per second.

Per workload: ``goodput_vs_best_static`` (whole run), ``worst_phase_vs_best_static_phase``
(min over phases of the planner's goodput in the phase ÷ the best static layout's in that
phase), ``flaps`` (A → B → A inside one phase, i.e. at constant load), ``role_changes``,
``moves_toward_predicted_worse`` (moves whose target the cost model, recomputed here, scores
below holding — must be 0), ``phase_oracle_vs_best_static`` (each phase's best static layout
stitched, as if a planner knew every phase ahead and moved for free, ÷ the best single static
layout: the most any planner could gain over it); ``summary`` has their minima and maxima;
``--demo-phases chat=60,rag=300,quiet=60`` gives the demo the launcher's own phase lengths
(with ``--interval 20``, its policy's planning interval); ``cycles`` lists every
cycle with its inputs. ``--live-load`` plans on each window's load as derived, as the live
path does (the loop's smoother is the bench's own).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from planner_quality import (  # noqa: E402
    CLUSTERS,
    MODEL,
    interval_itl_mean_ms,
    interval_p95,
    planner_topology,
    shape,
    sim_engines,
    sim_links,
    static_roles,
)
from shift_summary import summarise  # noqa: E402
from shift_workloads import DEMO_SCALE, build_workload  # noqa: E402

from controlplane.planner.calibration import CalibrationBook, LoadPoint  # noqa: E402
from controlplane.planner.costmodel import DEFAULT_PARAMS  # noqa: E402
from controlplane.planner.derive import (  # noqa: E402
    FirstTokens,
    LoadSmoother,
    carry_mix,
    counting_roles,
    derive_load,
    in_system,
    local_prefill_share,
    with_arrivals,
    with_arriving_mix,
)
from controlplane.planner.placement import Topology, WorkerInput  # noqa: E402
from controlplane.planner.planner import (  # noqa: E402
    DEFAULT_SETTINGS,
    LoadInput,
    ModelInput,
    decision_score,
    layout_state,
    plan_model,
    predict,
    predict_layout,
    workload_for,
)
from controlplane.policies.effective import EffectivePolicy  # noqa: E402
from controlplane.telemetry.histograms import Histogram  # noqa: E402
from workers_agent.sim.metrics import build_1_2_5_buckets  # noqa: E402
from workers_agent.sim.virtual import RoleChange, VirtualFleet  # noqa: E402

MOVING = ("better-layout", "roll-back", "policy-bound", "continue-move", "surge-headroom")


# --- The product's loop -------------------------------------------------------------------


def policy_for(slo: dict, n: int) -> EffectivePolicy:
    return EffectivePolicy(ttft_p95_ms=slo["ttft_ms"], itl_p95_ms=slo["itl_ms"],
                           cooldown_s=120, max_changes_per_cycle=max(2, n // 8),
                           hysteresis=0.10, rebalancing_mode="auto")


class ProductLoop:
    def __init__(self, cluster: dict, engines, slo: dict, phases, model=MODEL, policy=None,
                 smooth: bool = True, local_share: bool = False, prompt_spread: bool = True):
        self.cluster = cluster
        self.local_share = local_share
        self.prompt_spread = prompt_spread
        self.model = model
        self.prompt_le = build_1_2_5_buckets(model.max_model_len or 1_000_000)
        self.workers, self.links = planner_topology(cluster, engines)
        self.index = {w.name: w for w in self.workers}
        self.policy = policy or policy_for(slo, len(self.workers))
        self.phases = phases
        self.counters: dict[str, tuple] = {}
        self.changed_at: dict[str, float] = {}
        self.peak = 0.0
        self.held: int | None = None  # requests the engines held at the last cycle
        self.waiting: int | None = None  # of those, waiting in the engines' queues
        self.memory = None
        self.regime = None  # the load regime the planner remembers (record.regime)
        self.book = CalibrationBook({})
        self.smooth = LoadSmoother()
        # False: each window's load as derived, as the live path (controlplane.planner.inputs)
        # gives it — no smoother there; a window without finished requests has rate 0 and
        # keeps the last mix with traffic (derive.carry_mix).
        self.smoothing = smooth
        self.last_load: LoadInput | None = None
        self.log: list[dict] = []
        self.itl_seen: dict[str, int] = {}
        self.itl_mean_ms: float | None = None
        # The interval's finished requests' prompt lengths, each once (where it decoded):
        # what the engines' merged vllm:request_prompt_tokens histogram holds.
        self.prompts_done: list[int] = []
        self.prompt_hist = Histogram.from_values([], self.prompt_le)

    def phase_at(self, now: float) -> str:
        return next((p for p, a, b in self.phases if a <= now < b), self.phases[-1][0])

    def reports(self, snap) -> list[dict]:
        """Agent-style worker states: rates from the engines' cumulative counters."""
        dt = max(snap.interval_s, 1e-9)
        # The per-request prompt/generation token histograms' sums over the interval,
        # per engine that streamed the answer (counted when a request finishes).
        fin: dict[str, list[int]] = {}
        # Prefill halves an engine finished for another's decode (what its generation-token
        # histogram's le=1 bucket shows): its finished-request counter counts them too, as
        # each half finishes (the request's first token, a transfer later), whether or not
        # the answer has ended within the window. Counted at the answer's end instead, a
        # worker that had just begun prefilling for others read its own finishes twice.
        halves: dict[str, int] = {}
        for r in (*snap.recent_results, *snap.inflight_results):
            if (r.error is None and r.prefill_engine and r.prefill_engine != r.decode_engine
                    and r.first_token_time is not None
                    and snap.now - dt <= r.first_token_time < snap.now):
                halves[r.prefill_engine] = halves.get(r.prefill_engine, 0) + 1
        for r in snap.recent_results:
            if r.error is None and r.decode_engine:
                acc = fin.setdefault(r.decode_engine, [0, 0])
                acc[0] += r.prompt_tokens
                acc[1] += r.output_tokens
        self.prompts_done = [r.prompt_tokens for r in snap.recent_results
                             if r.error is None and r.decode_engine]
        # The interval's vllm:request_prompt_tokens histogram, as the engines would export
        # it: read by the prompt spread and the local-prefill share.
        self.prompt_hist = Histogram.from_values(self.prompts_done, self.prompt_le)
        out = []
        for e in snap.engines:
            s = e.stats
            now_c = (s.prompt_tokens, s.generation_tokens, s.prefix_cache_hits,
                     s.prefix_cache_queries, s.requests_finished)
            before = self.counters.get(e.engine_id, (0, 0, 0, 0, 0))
            self.counters[e.engine_id] = now_c
            d = [a - b for a, b in zip(now_c, before, strict=True)]
            out.append({
                "worker_id": self.index[e.engine_id].id, "running": s.num_running,
                "waiting": s.num_waiting, "kv_usage": s.kv_usage,
                "prompt_tokens_per_s": d[0] / dt, "generation_tokens_per_s": d[1] / dt,
                "prefix_hit_rate": d[2] / d[3] if d[3] else None,
                "requests_per_s": d[4] / dt,
                "prefill_only_requests_per_s": halves.get(e.engine_id, 0) / dt,
                "finished_prompt_tokens_per_s": fin.get(e.engine_id, [0, 0])[0] / dt,
                "finished_generation_tokens_per_s": fin.get(e.engine_id, [0, 0])[1] / dt,
            })
        return out

    def with_prompt_spread(self, load: LoadInput, window_isl: float) -> LoadInput:
        """Prompt p50 and p95 as the live path gives them (controlplane.telemetry.histograms
        .fleet_stats: the decode side's merged vllm:request_prompt_tokens histogram, vLLM's
        1-2-5 buckets, over the window the rate comes from). With the bench's smoother on, the
        window's spread is kept around the smoothed mean (both quantiles scaled by smoothed ÷
        window mean), so that mean, p50 and p95 describe one distribution."""
        if not self.prompts_done:
            return load
        p50, p95 = self.prompt_hist.quantile(0.5), self.prompt_hist.quantile(0.95)
        if p50 is None or p95 is None or p50 <= 0 or window_isl <= 0:
            return load
        k = load.isl_mean / window_isl if self.smoothing else 1.0
        return replace(load, isl_p50=p50 * k, isl_p95=p95 * k)

    def with_local_prefill(self, load: LoadInput) -> LoadInput:
        """As the live path without Prometheus (controlplane.planner.inputs
        ._with_local_prefill): the share of requests conditional P/D prefills on their
        decode worker, from the interval's prompt-length histogram in vLLM's token buckets
        at local_prefill_max_tokens ÷ (1 − hit)."""
        limit = self.policy.local_prefill_max_tokens
        if limit <= 0 or not self.local_share:
            return load
        share = local_prefill_share(self.prompt_hist, load.prefix_hit, float(limit))
        if share is None:
            return load
        return replace(load, local_prefill_share=share,
                       local_prefill_source="prompt histogram (bench interval)")

    def first_tokens(self, snap, now: float, workers) -> FirstTokens | None:
        """The window's first tokens as the engines' TTFT histogram count and prompt-token
        counter give them, beside its finished requests and the change in those queued."""
        waiting = sum(max(w.waiting, 0) for w in workers)
        before, self.waiting = self.waiting, waiting
        prompts = _first_token_prompts(snap, now)
        if not prompts:
            return None
        dt = snap.interval_s
        return FirstTokens(len(prompts) / dt, sum(prompts) / len(prompts), dt,
                           len(self.prompts_done),
                           waiting - before if before is not None else None)

    def fleet_p95(self, snap) -> tuple[float | None, float | None]:
        """TTFT and token-gap p95 (ms) over the interval, as merged histograms give them;
        the interval's mean token gap (the ITL histogram's sum ÷ count) in ``itl_mean_ms``."""
        self.itl_mean_ms = interval_itl_mean_ms(snap, self.itl_seen)
        result, self.itl_seen = interval_p95(snap, self.itl_seen)
        return result

    def __call__(self, now: float, snap) -> list[RoleChange]:
        wstates = self.reports(snap)
        workers = []
        for e in snap.engines:
            base = self.index[e.engine_id]
            workers.append(WorkerInput(
                base.id, base.name, base.node, base.nvlink_group, role=e.pending_role or e.role,
                state="draining" if e.state == "draining" else "active",
                changed_at=self.changed_at.get(e.engine_id),
                running=e.inflight_decode + e.inflight_prefill, waiting=e.stats.num_waiting,
                kv_usage=e.stats.kv_usage,
            ))
        roles = counting_roles(workers, now, snap.interval_s)  # as the live path counts
        peak_before = self.peak
        dl = derive_load(wstates, roles, 256, self.peak)
        self.peak = dl.peak_rps
        if self.smoothing:
            self.smooth, _phase_change = self.smooth.update(dl)
            sm = self.smooth
        else:
            sm = dl
        ttft_ms, itl_ms = self.fleet_p95(snap)
        first_token_isl = _first_token_isl(snap, now)  # what the TTFT p95 counted
        load = LoadInput(sm.rate_rps, max(dl.peak_rps, sm.rate_rps), sm.isl_mean, None,
                         sm.osl_mean, sm.prefix_hit, dl.inflight, dl.inflight, ttft_ms, itl_ms,
                         first_token_isl=first_token_isl)
        if self.prompt_spread:
            load = self.with_prompt_spread(load, dl.isl_mean)
        load = self.with_local_prefill(load)
        if not self.smoothing:
            load, _ = carry_mix(load, asdict(self.last_load) if self.last_load else None)
            self.last_load = load
            sm = load
        # As the live path (inputs.gather_cluster): the rate requests arrive at, when a
        # backlog fills or drains.
        held = in_system(workers)
        # The window's own finished rate (not the smoothed one) in the conservation sum.
        load, backlog = with_arrivals(load, held, self.held, snap.interval_s, peak_before,
                                      finished_rps=dl.rate_rps)
        self.held = held
        if backlog:
            self.peak = load.peak_rps
        # As the live path: the mix the requests starting in the window bring, when it
        # differs from the finished one's past noise.
        load, mixed = with_arriving_mix(load, self.first_tokens(snap, now, workers))
        bucket, cal = self.book.factors_for(dl.isl_mean, dl.osl_mean, sm.rate_rps)
        inp = ModelInput(1, self.model, shape(self.cluster), tuple(workers), load, self.policy,
                         self.links, cal.apply(DEFAULT_PARAMS), memory=self.memory,
                         regime=self.regime)
        d = plan_model(inp, now)
        self.memory = d.memory or self.memory
        self.regime = d.record.regime if d.record else self.regime
        if d.current_now is not None and not d.current_now.overloaded:
            # As the live path (service._calibrate): ITL on the mean token gap.
            itl_mean = self.itl_mean_ms
            self.book.observe(
                LoadPoint(sm.rate_rps, sm.isl_mean, sm.osl_mean),
                d.current_now.ttft_p95_s / cal.ttft_factor, ttft_ms / 1000 if ttft_ms else None,
                d.current_now.itl_mean_s / cal.itl_factor, itl_mean / 1000 if itl_mean else None,
                first_token_isl, backlog or mixed)
        worse = False
        if d.action == "change" and d.reason in MOVING and d.target is not None:
            worse = _predicted_worse(inp, d.target.n_prefill)
        self.log.append({
            "t": now, "phase": self.phase_at(now), "action": d.action, "reason": d.reason,
            # The cycle's inputs: what this window's reports derive to before the bench's
            # smoother, and what the window held (arrivals, finishes, and the mean prompt of
            # the requests whose first token came in it — what the engines' prompt-token
            # counter ÷ TTFT-histogram count would give): shows how far a load derived from
            # finished requests trails the arrivals after a shift.
            "derived": (round(dl.rate_rps, 2), round(dl.isl_mean), round(dl.osl_mean)),
            "arrived": snap.arrivals_since_last, "finished": len(snap.recent_results),
            "first_token_isl": first_token_isl,
            "label": d.record.label if d.record else "", "changes": len(d.changes),
            "target": d.target.layout if d.target else None,
            "target_p": d.target.n_prefill if d.target else None,
            "from_p": layout_state(workers).prefill, "worse": worse,
            "factors": (round(cal.ttft_factor, 3), round(cal.itl_factor, 3), bucket),
            "alert": d.record.alert if d.record else "",
            "measured_ms": (round(ttft_ms) if ttft_ms else None, round(itl_ms) if itl_ms else None),
            # The load the planner was given (after the smoother and the arrivals).
            "load": (round(load.rate_rps, 2), round(load.isl_mean), round(load.osl_mean)),
            "backlog": backlog, "mix": mixed,
        })
        out = []
        for c in d.changes:
            self.changed_at[c.worker] = now
            out.append(RoleChange(c.worker, c.to_role, d.reason))
        return out


def _first_token_prompts(snap, now: float) -> list[int]:
    """Prompt lengths of the requests whose first token came in the window ending now."""
    dt = snap.interval_s
    return [r.prompt_tokens for r in (*snap.recent_results, *snap.inflight_results)
            if r.first_token_time is not None and now - dt <= r.first_token_time < now]


def _first_token_isl(snap, now: float) -> int | None:
    got = _first_token_prompts(snap, now)
    return round(sum(got) / len(got)) if got else None


def _predicted_worse(inp: ModelInput, target_p: int) -> bool:
    """Recomputed from the cost model (not read from the record): is the target scored below
    holding the layout as it is?"""
    load, pol = inp.load, inp.policy
    plan_rate = max(load.rate_rps, load.peak_rps) * (1 + DEFAULT_SETTINGS.growth_margin)
    w_now, w_plan = workload_for(load, pol, load.rate_rps), workload_for(load, pol, plan_rate)
    topo = Topology(list(inp.workers), inp.node_links)
    hold = decision_score(
        predict_layout(inp, layout_state(inp.workers), w_now, topo),
        predict_layout(inp, layout_state(inp.workers), w_plan, topo), load.rate_rps)
    target = decision_score(predict(inp, target_p, w_now, topo),
                            predict(inp, target_p, w_plan, topo), load.rate_rps)
    return target < hold


# --- Runs ---------------------------------------------------------------------------------


def goodput(results, slo, a: float, b: float) -> float:
    ok = 0
    for r in results:
        if not a <= r.arrival < b or r.error is not None or r.ttft is None:
            continue
        tpot = sum(r.itls) / len(r.itls) if r.itls else 0.0
        ok += r.ttft * 1000 <= slo["ttft_ms"] and tpot * 1000 <= slo["itl_ms"]
    return ok / max(b - a, 1e-9)


def run_one(args):
    cname, wname, p, phase_s, cycles, interval, scale, *rest = args
    smooth = rest[0] if rest else True
    local_share = rest[1] if len(rest) > 1 else False
    prompt_spread = rest[2] if len(rest) > 2 else True
    demo_phases = rest[3] if len(rest) > 3 else None
    DEMO_SCALE["value"] = scale
    cluster = CLUSTERS[cname]
    wl, phases, slo = build_workload(cluster, wname, phase_s, cycles, demo_phases)
    roles = static_roles(cluster, p) if p is not None else None
    engines = sim_engines(cluster, roles)
    loop = ProductLoop(cluster, engines, slo, phases, smooth=smooth,
                       local_share=local_share,
                       prompt_spread=prompt_spread) if p is None else None
    deadline = 2.0 * slo["ttft_ms"] / 1000.0
    fleet = VirtualFleet(engines, sim_links(cluster), controller=loop,
                         control_interval_s=interval, queue_deadline_s=deadline)
    started = time.perf_counter()
    result = fleet.run(wl)
    end = phases[-1][2]
    out = {
        "cluster": cname, "workload": wname, "static": p,
        "whole": goodput(result.results, slo, 0.0, end),
        "phases": {name: goodput(result.results, slo, a, b) for name, a, b in phases},
        "phase_seconds": {name: b - a for name, a, b in phases},
        "role_changes": len(result.role_changes), "requests": len(result.results),
        "wall_s": time.perf_counter() - started,
    }
    if loop is not None:
        out["log"] = loop.log
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true",
                    help="RTX cluster, the demo's three cycles, statics every 2nd P, < 1 min")
    ap.add_argument("--phase", type=float, default=90.0, help="simulated seconds per phase")
    ap.add_argument("--cycles", type=int, default=3, help="demo chat → RAG → quiet cycles")
    ap.add_argument("--interval", type=float, default=30.0, help="planning interval, s")
    ap.add_argument("--clusters", default=",".join(CLUSTERS))
    ap.add_argument("--only", default="demo,azure-diurnal,mooncake-step")
    ap.add_argument("--all-static", action="store_true")
    ap.add_argument("--stride", type=int, default=0,
                    help="static layouts every STRIDE prefill counts (default 1 for 8 "
                         "workers, 4 above)")
    ap.add_argument("--demo-scale", type=float, default=1.0,
                    help="multiply the demo's chat and RAG rates")
    ap.add_argument("--live-load", action="store_true",
                    help="the planner's load per window as the live path derives it (no "
                         "smoother; a window without finishes has rate 0, keeps its mix)")
    ap.add_argument("--local-share", action="store_true",
                    help="give the planner the measured local-prefill share (the live "
                         "path's PLANNER_LOCAL_PREFILL_SHARE; off by default, see "
                         "docs/benchmarks.md)")
    ap.add_argument("--no-prompt-spread", action="store_true",
                    help="give the planner the mean prompt only (no p50/p95 from the "
                         "finished prompts' histogram), as the bench did before the "
                         "twelfth pass")
    ap.add_argument("--demo-phases", default="",
                    help="the demo's seconds per phase, e.g. chat=60,rag=300,quiet=60 (the "
                         "launcher's own, controlplane/launcher/traffic.py); default --phase "
                         "for each")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    clusters, names = args.clusters.split(","), args.only.split(",")
    demo_phases = {k: float(v) for k, _, v in (x.partition("=") for x in
                                               args.demo_phases.split(",") if x)} or None
    phase, cycles = args.phase, args.cycles
    if args.quick:
        # The demo at its default 90 s phases and three cycles: one 30 s phase with one
        # planning window in it measured only the reaction time (0.76 of the best static
        # where the full run gives 0.94), not the planner.
        clusters, names = ["two-rtxpro-servers"], ["demo"]
    jobs = []
    for c in clusters:
        n = CLUSTERS[c]["nodes"] * CLUSTERS[c]["gpus_per_node"] // CLUSTERS[c]["tp"]
        stride = args.stride or (1 if args.all_static or n <= 8 else 4)
        if args.quick:
            stride = 2
        for w in names:
            jobs.append((c, w, None, phase, cycles, args.interval, args.demo_scale,
                         not args.live_load, args.local_share, not args.no_prompt_spread,
                         demo_phases))
            jobs.extend((c, w, p, phase, cycles, args.interval, args.demo_scale, True, False,
                         True, demo_phases) for p in range(0, n, stride))
    started = time.perf_counter()
    runs = []
    with multiprocessing.Pool(args.jobs) as pool:
        for r in pool.imap_unordered(run_one, jobs):
            runs.append(r)
            who = "planner" if r["static"] is None else f"P={r['static']}"
            print(f"# {r['cluster']} {r['workload']} {who}: "
                  f"{r['whole']:.3f} req/s in targets, {r['role_changes']} changes "
                  f"[{r['wall_s']:.0f} s]", file=sys.stderr, flush=True)
    out = summarise(runs)
    out["summary"]["wall_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(out["summary"], indent=1))
    for key, row in out["workloads"].items():
        brief = {k: v for k, v in row.items() if k not in ("plans", "cycles")}
        print(f"{key}: {json.dumps(brief)}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
