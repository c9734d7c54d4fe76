"""Decision quality: the planner in the loop vs every static layout, in the virtual-time sim.

    .venv/bin/python bench/planner_quality.py [--requests 1200] [--only rag-4k] [--quick]

For each cluster of the brief (two-rtxpro-servers, four-h200nvl-servers) and each workload
(the scenarios.json workloads plus the shared traces, bounded to --requests requests), run
the fleet aggregated, at every P:D split (placement from the planner's own placement module,
so every static split gets the best placement), and with the planner as the controller,
starting aggregated. Reports goodput per GPU (requests meeting both TTFT and per-request
mean ITL targets, per second, per GPU), the planner's share of the best static layout, and
the role changes it made (count and per hour of simulated time).

Every run — static layouts and the planner alike — sheds requests still queued without a
first token ``--deadline-factor`` × the TTFT target after arrival (the modelled gateway's
deadline shedding, ``VirtualFleet(queue_deadline_s=...)``; 0 turns it off). A shed request
had already missed its TTFT target, so shedding never drops one that would have counted.

Steady goodput counts requests arriving after the warm-up, over the arrival window after
it (``duration - warmup``): every layout is offered the same requests over the same
window, so the comparison is between counts of requests served within targets. (The
``*_drain`` figures divide by the time from the warm-up to the last finish instead.)

Routing: every run routes with the product's router — ``VirtualFleet``'s default,
``workers_agent.sim.gateway_routing.GatewayRouter`` (``gateway.router.plan_request`` over
the table the control plane builds from the fleet, rebuilt as the planner changes roles,
with the gateway's load accounting and approximate prefix index; the policy behind the
table carries the run's SLO targets, as the planner's does) — so a change to
``gateway/router.py`` shows here.

Model: Llama 3.3 70B FP8. RTX PRO 6000 workers are TP2 (a TP1 card decodes a 70B FP8 step in
~52 ms, so no layout could meet a 50 ms ITL target); H200 NVL workers are TP1.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SHARED = ROOT.parent / "shared"

from controlplane.planner.costmodel import (  # noqa: E402
    Link,
    ModelSpec,
    WorkerShape,
    gpu_profile_for,
)
from controlplane.planner.placement import (  # noqa: E402
    NicInput,
    NodeLinks,
    Topology,
    WorkerInput,
    place,
)
from controlplane.planner.planner import (  # noqa: E402
    LoadInput,
    ModelInput,
    plan_model,
    predict,
    workload_for,
)
from controlplane.policies.effective import EffectivePolicy  # noqa: E402
from workers_agent.sim import links as simlinks  # noqa: E402
from workers_agent.sim.gateway_routing import GatewayRouter  # noqa: E402
from workers_agent.sim.report import percentile, summarize  # noqa: E402
from workers_agent.sim.virtual import (  # noqa: E402
    LinkModel,
    RoleChange,
    VirtualFleet,
    uniform_fleet,
)
from workers_agent.sim.workload import load_trace, synthetic  # noqa: E402

MODEL = ModelSpec("llama-3.3-70b-fp8", 80, 8, 128, 1, 70.6, 70.6e9)
SIM_MODEL = "llama-3.3-70b-fp8"

CLUSTERS = {
    "two-rtxpro-servers": {
        "hardware": "RTX PRO 6000", "nodes": 2, "gpus_per_node": 8, "tp": 2, "nvlink": None,
        "nic_gbps": 100, "rdma": False,
    },
    "four-h200nvl-servers": {
        "hardware": "H200 NVL", "nodes": 4, "gpus_per_node": 8, "tp": 1, "nvlink": 4,
        "nic_gbps": 400, "rdma": True,
    },
}

TRACES = {
    "azure-conv": ("traces/azure2023_conv.csv", {"ttft_ms": 1000, "itl_ms": 50}),
    "azure-code": ("traces/azure2023_code.csv", {"ttft_ms": 1000, "itl_ms": 50}),
    "mooncake": ("traces/mooncake_synthetic.jsonl", {"ttft_ms": 5000, "itl_ms": 50}),
}

CONTROL_INTERVAL_S = 15.0
DEADLINE_FACTOR = 2.0  # shed requests still queued this many TTFT targets after arrival


def shape(cluster: dict) -> WorkerShape:
    return WorkerShape(gpu_profile_for(cluster["hardware"]), cluster["tp"])


def sim_engines(cluster: dict, roles: list[str] | None = None):
    n = cluster["nodes"] * cluster["gpus_per_node"] // cluster["tp"]
    return uniform_fleet(
        n, SIM_MODEL, cluster["hardware"], tp=cluster["tp"],
        gpus_per_node=cluster["gpus_per_node"], nvlink_group_size=cluster["nvlink"],
        roles=roles,
    )


def sim_links(cluster: dict) -> LinkModel:
    nvl = simlinks.nvlink(450) if cluster["nvlink"] else None
    return LinkModel(nvlink=nvl, pcie=simlinks.pcie(5, 16),
                     nic=simlinks.nic(cluster["nic_gbps"], rdma=cluster["rdma"]))


def planner_topology(cluster: dict, engines) -> tuple[list[WorkerInput], dict]:
    workers = []
    links = {}
    for i, e in enumerate(engines):
        group = None
        if e.nvlink_group is not None:
            group = int(e.nvlink_group.rsplit("-", 1)[1])
        workers.append(WorkerInput(i, e.engine_id, e.node, group, role=e.role))
        links[e.node] = NodeLinks(
            Link.pcie(5, 16), Link.nvlink(450) if cluster["nvlink"] else None,
            (NicInput("fabric", cluster["nic_gbps"], cluster["rdma"]),),
        )
    return workers, links


def static_roles(cluster: dict, n_prefill: int) -> list[str]:
    engines = sim_engines(cluster)
    workers, links = planner_topology(cluster, engines)
    if n_prefill == 0:
        return ["both"] * len(workers)
    placed = place(workers, n_prefill, links).roles
    return ["prefill" if placed[w.id] == "prefill" else "decode" for w in workers]


def interval_p95(snap, itl_seen: dict[str, int]):
    """((TTFT p95 ms, ITL p95 ms), new itl_seen) of what was observed since the previous
    cycle: a TTFT when the first token comes, an ITL sample per token gap as it happens,
    in-flight requests included; ``itl_seen`` counts the ITL samples already taken per
    in-flight request. None where nothing was observed."""
    ttfts, itls, seen = [], [], {}
    for r in [*snap.recent_results, *snap.inflight_results]:
        if r.error is not None or r.ttft is None:
            continue
        before = itl_seen.get(r.request_id)
        if before is None:
            ttfts.append(r.ttft)
            before = 0
        itls.extend(r.itls[before:])
        if r.finish_time is None:
            seen[r.request_id] = len(r.itls)

    def p95(xs):
        return percentile(xs, 95) * 1000 if xs else None

    return (p95(ttfts), p95(itls)), seen


def interval_itl_mean_ms(snap, itl_seen: dict[str, int]) -> float | None:
    """Mean token gap (ms) since the previous cycle — what the engines' ITL histogram's
    sum ÷ count gives over the window; ``itl_seen`` as :func:`interval_p95` takes it
    (before that call updates it)."""
    total, n = 0.0, 0
    for r in [*snap.recent_results, *snap.inflight_results]:
        if r.error is not None or r.ttft is None:
            continue
        gaps = r.itls[itl_seen.get(r.request_id, 0):]
        total += sum(gaps)
        n += len(gaps)
    return total / n * 1000 if n else None


class PlannerController:
    """The planner as the fleet's controller: builds the pure inputs from the sim's
    snapshot (as inputs.py builds them from hot state) and returns its role changes."""

    def __init__(self, cluster: dict, engines, slo: dict):
        self.cluster = cluster
        self.workers, self.links = planner_topology(cluster, engines)
        self.index = {w.name: w.id for w in self.workers}
        self.changed_at: dict[str, float] = {}
        self.policy = EffectivePolicy(
            ttft_p95_ms=slo["ttft_ms"], itl_p95_ms=slo["itl_ms"], cooldown_s=120,
            max_changes_per_cycle=max(4, len(self.workers) // 4), hysteresis=0.10,
            rebalancing_mode="auto",
        )
        self.peak = 0.0
        self.isl = self.osl = 0.0
        self.hit = 0.0
        # Per engine: generated tokens, cache hits, cache queries so far.
        self.counters: dict[str, tuple[int, int, int]] = {}
        self.decisions = 0
        self.memory = None
        self.itl_seen: dict[str, int] = {}  # in-flight request → ITL samples counted
        self.trace: list[tuple] = []  # per cycle: (now, measured TTFT/ITL p95 ms, overload)

    def measured(self, snap) -> tuple[float | None, float | None]:
        """p95 TTFT and ITL (ms) of what was observed since the previous cycle, as the
        engines' latency histograms (Prometheus, the agents' windows) report them: a TTFT
        when the first token comes, an ITL sample per token gap as it happens — in-flight
        requests included (an ITL-bound layout finishes few requests within a cycle).
        None when nothing was observed."""
        result, self.itl_seen = interval_p95(snap, self.itl_seen)
        return result

    def __call__(self, now: float, snap) -> list[RoleChange]:
        rate = snap.arrivals_since_last / max(snap.interval_s, 1e-9)
        self.peak = max(rate, self.peak * 0.9)
        # Answer length from the finished requests' own lengths, or while none finished
        # from the engines' token counters (generated tokens/s ÷ request rate, short while
        # answers are still growing); prefix hits from the prefill-capable workers' cache
        # counters. Prompt length per request, once, when its first token comes (a
        # per-request prompt-length histogram, as the product reads from the engines): the
        # engines' prompt-token counters count a P/D prompt on both sides whenever the
        # decode side is a 'both' worker (the gateway's router picks them mid-move) and
        # again after a preemption (RTX prefill-heavy-3k-50 read 4,800-token prompts for
        # 3,000 and held 4P:1D + 3 both as "every layout misses"). Lengths of finished
        # requests alone would leave the first cycles blind when answers take longer than a
        # cycle.
        delta = [0, 0, 0]
        for e in snap.engines:
            now_counts = (e.stats.generation_tokens,
                          e.stats.prefix_cache_hits, e.stats.prefix_cache_queries)
            before = self.counters.get(e.engine_id, (0, 0, 0))
            self.counters[e.engine_id] = now_counts
            d = [a - b for a, b in zip(now_counts, before, strict=True)]
            delta[0] += d[0]
            if e.role != "decode" and (e.pending_role or e.role) != "decode":
                delta[1] += d[1]
                delta[2] += d[2]
        started = [r for r in [*snap.recent_results, *snap.inflight_results]
                   if r.error is None and r.ttft is not None
                   and r.request_id not in self.itl_seen]
        if rate > 0 and started:
            interval = max(snap.interval_s, 1e-9)
            isl = sum(r.prompt_tokens for r in started) / len(started)
            osl = max(delta[0] / interval / rate, 1.0)
            done = [r for r in snap.recent_results if r.error is None and r.output_tokens]
            if done:  # finished answers' own lengths (the engines' per-request histogram)
                osl = sum(r.output_tokens for r in done) / len(done)
            hit = delta[1] / delta[2] if delta[2] > 0 else 0.0
            # Smooth over cycles: one window can be a handful of requests.
            a = 0.5 if self.isl else 1.0
            self.isl = (1 - a) * self.isl + a * isl
            self.osl = (1 - a) * self.osl + a * osl
            self.hit = (1 - a) * self.hit + a * hit
        workers = []
        inflight = 0
        for e in snap.engines:
            base = self.workers[self.index[e.engine_id]]
            running = e.inflight_decode + e.inflight_prefill
            # Sequences running on decode-capable engines (what hot state's "running"
            # reports), not the ones queued there: in overload the queue would make every
            # smaller decode pool look too small to hold them.
            if (e.pending_role or e.role) != "prefill":
                inflight += e.stats.num_running
            workers.append(WorkerInput(
                base.id, base.name, base.node, base.nvlink_group,
                role=e.pending_role or e.role,
                state="draining" if e.state == "draining" else "active",
                changed_at=self.changed_at.get(e.engine_id), running=running,
                waiting=e.stats.num_waiting, kv_usage=e.stats.kv_usage,
            ))
        ttft_p95, itl_p95 = self.measured(snap)
        load = LoadInput(
            rate, self.peak, self.isl, None, self.osl, self.hit, inflight, inflight,
            measured_ttft_p95_ms=ttft_p95, measured_itl_p95_ms=itl_p95,
        )
        # The move memory carries over between cycles, as the product keeps it in the
        # planner state (service.py): a move under way is one move, and the dwell rule sees it.
        inp = ModelInput(1, MODEL, shape(self.cluster), tuple(workers), load, self.policy,
                         self.links, memory=self.memory)
        d = plan_model(inp, now)
        self.memory = d.memory or self.memory
        self.decisions += 1
        self.trace.append((now, ttft_p95, itl_p95, d.overload is not None, len(d.changes)))
        out = []
        for c in d.changes:
            self.changed_at[c.worker] = now
            out.append(RoleChange(c.worker, c.to_role, d.reason))
        return out


# "pdplane" (default): gateway.router via GatewayRouter; "dynamo": the simulator's former
# built-in router (bench/routing_baselines.DynamoCostRouter), for comparison with old rows.
ROUTER = ["pdplane"]


def run_fleet(cluster, workload, slo, roles=None, controller=False, warmup_s=0.0,
              duration_s=None, deadline_factor=DEADLINE_FACTOR):
    engines = sim_engines(cluster, roles)
    ctl = PlannerController(cluster, engines, slo) if controller else None
    deadline = deadline_factor * slo["ttft_ms"] / 1000.0 if deadline_factor > 0 else None
    # The gateway's router over the table built from a policy with this run's SLO targets
    # (the table carries their ratio: how the router weighs a stall against a wait).
    router = GatewayRouter(policy={"ttft_p95_ms": slo["ttft_ms"], "itl_p95_ms": slo["itl_ms"]})
    if ROUTER[0] == "dynamo":
        from bench.routing_baselines import DynamoCostRouter

        router = DynamoCostRouter()
    fleet = VirtualFleet(engines, sim_links(cluster), router=router, controller=ctl,
                         control_interval_s=CONTROL_INTERVAL_S, queue_deadline_s=deadline)
    result = fleet.run(workload)
    s = result.summary(slo["ttft_ms"], slo["itl_ms"])
    # Steady state: only requests that arrive after the warm-up, over the arrival window
    # after it (the same for every layout); "drain": over warm-up → last finish.
    late = [r for r in result.results if r.arrival >= warmup_s]
    ends = [r.finish_time for r in late if r.finish_time is not None]
    drain = summarize(late, slo["ttft_ms"], slo["itl_ms"], 0.9, result.num_gpus,
                      duration=(max(ends) - warmup_s) if ends else None)
    if duration_s is None:
        duration_s = max((r.arrival for r in result.results), default=warmup_s)
    steady = summarize(late, slo["ttft_ms"], slo["itl_ms"], 0.9, result.num_gpus,
                       duration=max(duration_s - warmup_s, 1e-9))
    changes = len(result.role_changes)
    hours = max(result.sim_seconds, 1e-9) / 3600
    return {
        "goodput_per_gpu": s.goodput_rps_per_gpu,
        "steady_goodput_per_gpu": steady.goodput_rps_per_gpu if late else 0.0,
        "steady_drain_goodput_per_gpu": drain.goodput_rps_per_gpu,
        "shed": fleet.num_shed,
        "requests": len(result.results),
        "steady_attainment": steady.slo_attainment if late else None,
        "attainment": s.slo_attainment,
        "ttft_p95_ms": s.ttft_ms.get("p95"),
        "itl_p95_ms": s.itl_ms.get("p95"),
        "role_changes": changes,
        "changes_per_hour": changes / hours,
        "sim_s": result.sim_seconds,
        "wall_s": result.wall_seconds,
        "final_roles": _layout([m.role for m in fleet.order]) if controller else None,
    }


def _layout(roles):
    p = roles.count("prefill")
    d = roles.count("decode")
    b = roles.count("both")
    return "aggregated" if p == 0 and d == 0 else f"{p}P:{d}D" + (f"+{b}both" if b else "")


def fleet_rate(cluster: dict, scenario: dict, share: float) -> float:
    """The operating point: ``share`` of the highest rate at which the cost model expects
    some layout (aggregated or any split) to keep ≥ 90 % of requests within both targets.
    (A fixed share of prefill capacity left decode-heavy workloads with no working layout
    at all, which tells nothing.)"""
    engines = sim_engines(cluster)
    workers, links = planner_topology(cluster, engines)
    topo = Topology(workers, links)
    pol = EffectivePolicy(ttft_p95_ms=scenario["slo"]["ttft_ms"],
                          itl_p95_ms=scenario["slo"]["itl_ms"])
    hit = scenario.get("shared_prefix_fraction", 0.0)

    def works(rate: float) -> bool:
        load = LoadInput(rate, rate, scenario["isl"], None, scenario["osl"], hit)
        inp = ModelInput(1, MODEL, shape(cluster), tuple(workers), load, pol, links)
        w = workload_for(load, pol, rate)
        return any(predict(inp, p, w, topo).attainment >= 0.9 for p in range(len(workers)))

    lo, hi = 0.0, 1.0
    while works(hi) and hi < 1e4:
        lo, hi = hi, hi * 2
    for _ in range(20):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if works(mid) else (lo, mid)
    # No layout works at any rate (e.g. 32k prompts of a 70B model on one card): 0.2 req/s.
    return lo * share if lo > 0.05 else 0.2


def make_workload(cluster: dict, name: str, duration_s: float):
    """(workload, SLO, note): scenario workloads as Poisson arrivals at a rate that keeps
    half the fleet's prefill compute busy (chat-low-concurrency at its own 0.5 req/s);
    traces with their real arrival times, cut to the first ``duration_s`` seconds."""
    data = json.loads((SHARED / "data" / "scenarios.json").read_text())
    if name in data["workloads"]:
        sc = data["workloads"][name]
        rate = sc.get("rate_rps") or fleet_rate(cluster, sc, 0.8)
        n = max(int(rate * duration_s), 20)
        wl = synthetic(sc, n, rate_rps=rate, seed=7, name=name, num_prefixes=8)
        return wl, sc["slo"], f"{rate:.2f} req/s Poisson, {n} req"
    path, slo = TRACES[name]
    speed = 1.0
    if name == "mooncake" and cluster["hardware"] == "RTX PRO 6000":
        # 15k-token prompts at the trace's ~3.9 req/s exceed what 8 TP2 RTX workers
        # prefill; replay it 4× slower so that layouts still differ.
        speed = 0.25
    wl = load_trace(SHARED / "data" / path, speedup=speed, limit=20000)
    wl.requests = [r for r in wl.requests if r.arrival <= duration_s]
    note = f"first {duration_s:.0f} s ({len(wl.requests)} req)"
    return wl, slo, note + (", 4× slower" if speed != 1.0 else "")


WORKLOADS = ["chat-low-concurrency", "rag-4k", "prefill-heavy-3k-50", "reasoning-4k-800",
             "long-context-32k", "azure-conv", "azure-code", "mooncake"]


def _job(args):
    cname, wname, p, duration_s, warmup_s, k = args
    cluster = CLUSTERS[cname]
    wl, slo, note = make_workload(cluster, wname, duration_s)
    kw = {"warmup_s": warmup_s, "duration_s": duration_s, "deadline_factor": k}
    if p is None:
        return args, note, run_fleet(cluster, wl, slo, controller=True, **kw)
    return args, note, run_fleet(cluster, wl, slo, static_roles(cluster, p), **kw)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=300.0, help="simulated seconds")
    ap.add_argument("--warmup", type=float, default=60.0, help="excluded from steady goodput")
    ap.add_argument("--only", default="", help="comma-separated workload names")
    ap.add_argument("--clusters", default=",".join(CLUSTERS))
    ap.add_argument("--splits", default="", help="P values to run (default: every one)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--deadline-factor", type=float, default=DEADLINE_FACTOR,
                    help="shed requests still queued this many TTFT targets after arrival "
                         "(0: no shedding)")
    ap.add_argument("--json", default="", help="write the results here")
    ap.add_argument("--router", choices=("pdplane", "dynamo"), default="pdplane",
                    help="pdplane: the gateway's router; dynamo: the former sim router")
    args = ap.parse_args()
    ROUTER[0] = args.router
    names = [x for x in args.only.split(",") if x] or WORKLOADS
    jobs = []
    for cname in args.clusters.split(","):
        cluster = CLUSTERS[cname]
        n = cluster["nodes"] * cluster["gpus_per_node"] // cluster["tp"]
        ps = [int(x) for x in args.splits.split(",") if x] or list(range(n))
        for wname in names:
            k = args.deadline_factor
            jobs.append((cname, wname, None, args.duration, args.warmup, k))
            jobs.extend((cname, wname, p, args.duration, args.warmup, k) for p in ps if p < n)
    results: dict = {}
    with multiprocessing.Pool(args.jobs) as pool:
        for (cname, wname, p, _d, _w, _k), note, res in pool.imap_unordered(_job, jobs):
            print(f"# {cname} {wname} {'planner' if p is None else f'P={p}'}: steady "
                  f"{res['steady_goodput_per_gpu']:.4f}/GPU (drain "
                  f"{res['steady_drain_goodput_per_gpu']:.4f}), whole "
                  f"{res['goodput_per_gpu']:.4f}, shed {res['shed']}/{res['requests']}, "
                  f"{res['role_changes']} changes, final {res['final_roles']} "
                  f"[{res['wall_s']:.0f} s]", file=sys.stderr, flush=True)
            results.setdefault((cname, wname), {"note": note, "static": {}, "planner": None})
            slot = results[(cname, wname)]
            if p is None:
                slot["planner"] = res
            else:
                n = CLUSTERS[cname]["nodes"] * CLUSTERS[cname]["gpus_per_node"] // CLUSTERS[
                    cname]["tp"]
                slot["static"]["aggregated" if p == 0 else f"{p}P:{n - p}D"] = res
    rows = []
    for (cname, wname), slot in sorted(results.items(), key=lambda kv: (
            kv[0][0], names.index(kv[0][1]))):
        static, planner = slot["static"], slot["planner"]
        row = {"cluster": cname, "workload": wname, "load": slot["note"]}
        for key in ("goodput_per_gpu", "steady_goodput_per_gpu", "steady_drain_goodput_per_gpu"):
            best_name = max(static, key=lambda k, key=key: static[k][key])
            best = static[best_name][key]
            row[key] = {
                "best_static": best_name, "best": best,
                "aggregated": static.get("aggregated", {}).get(key),
                "planner": planner[key],
                "share": planner[key] / best if best > 0 else None,
            }
        row["planner_role_changes"] = planner["role_changes"]
        row["planner_changes_per_hour"] = planner["changes_per_hour"]
        row["planner_final_layout"] = planner["final_roles"]
        row["planner_shed"] = planner["shed"]
        row["best_static_shed"] = static[row["steady_goodput_per_gpu"]["best_static"]]["shed"]
        row["requests"] = planner["requests"]
        row["static"] = {k: (v["goodput_per_gpu"], v["steady_goodput_per_gpu"],
                             v["steady_drain_goodput_per_gpu"], v["shed"])
                         for k, v in static.items()}
        rows.append(row)
    print("| cluster | workload | load | best static (steady) | aggregated | planner | "
          "planner ÷ best (steady / drain / whole run) | shed (best static / planner) | "
          "planner final layout | role changes |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        st, whole = r["steady_goodput_per_gpu"], r["goodput_per_gpu"]
        dr = r["steady_drain_goodput_per_gpu"]

        def pct(x):
            return "n/a (no layout had goodput)" if x is None else f"{x:.0%}"

        agg = "—" if st["aggregated"] is None else f"{st['aggregated']:.4f}"
        print(f"| {r['cluster']} | {r['workload']} | {r['load']} | {st['best_static']} "
              f"{st['best']:.4f} | {agg} | {st['planner']:.4f} | "
              f"{pct(st['share'])} / {pct(dr['share'])} / {pct(whole['share'])} | "
              f"{r['best_static_shed']} / {r['planner_shed']} | {r['planner_final_layout']} | "
              f"{r['planner_role_changes']} ({r['planner_changes_per_hour']:.0f}/h) |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
    ok = [r for r in rows if r["steady_goodput_per_gpu"]["share"] is not None]
    good = sum(1 for r in ok if r["steady_goodput_per_gpu"]["share"] >= 0.95)
    print(f"\nplanner ≥ 95% of the best static layout (steady state) in {good} of {len(ok)} "
          "cases where some layout had goodput")


if __name__ == "__main__":
    main()
