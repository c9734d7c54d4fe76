"""Virtual time vs real time: the same requests on the same fleet, routed by pdplane.

    .venv/bin/python bench/sim_agreement.py [--requests 300] [--json OUT]

Real time: simulated engine servers (one process per node, HTTP + ZMQ) behind the gateway
process, the Mooncake trace replayed by the workload player — exactly
``bench/gateway_bench.py``'s ``pdplane`` run (its fleet, table and prompt shrinking).
Virtual time: the same engines (same model, GPU, block size and KV blocks) in
``VirtualFleet`` with ``GatewayRouter`` (``gateway.router`` fed as the gateway feeds it), the
same workload. Agreement goal: prefix hit rate within 1 point, TTFT p50 within 15 % (of the
median of ``--repeat`` real-time runs), so that virtual-time results say something about
the real-time system.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import bench.gateway_bench as gb  # noqa: E402
from workers_agent.sim import links  # noqa: E402
from workers_agent.sim.gateway_routing import GatewayRouter  # noqa: E402
from workers_agent.sim.report import percentile  # noqa: E402
from workers_agent.sim.virtual import LinkModel, VirtualFleet, uniform_fleet  # noqa: E402


def virtual_run(args, workload) -> dict:
    engines = uniform_fleet(args.engines, gb.MODEL, "H200", gpus_per_node=1,
                            nvlink_group_size=None, block_size=16,
                            num_gpu_blocks=args.num_gpu_blocks or None)
    # The policy's SLO targets, whose ratio the real-time gateway's table carries too. Answer
    # lengths as the gateway knows them: the player sends max_tokens = the answer's length,
    # and the gateway books the weight learned from finished answers under that bound.
    router = GatewayRouter(policy={"ttft_p95_ms": args.slo_ttft_ms, "itl_p95_ms": args.slo_itl_ms},
                           kv_tokens=args.num_gpu_blocks * 16 if args.num_gpu_blocks else None,
                           answers="learn-scale:1")
    fleet = VirtualFleet(engines, LinkModel(nic=links.nic(400, rdma=True)), router=router)
    result = fleet.run(workload)
    ttfts = [r.ttft * 1000 for r in result.results if r.ttft is not None]
    queries = sum(s.prefix_cache_queries for s in result.engine_stats.values())
    hits = sum(s.prefix_cache_hits for s in result.engine_stats.values())
    return {"completed": sum(r.error is None for r in result.results),
            "failed": sum(r.error is not None for r in result.results),
            "prefix_hit_rate": hits / queries if queries else None,
            "ttft_p50_ms": percentile(ttfts, 50), "ttft_p95_ms": percentile(ttfts, 95),
            "wall_s": result.wall_seconds}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default=str(gb.TRACE))
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--speedup", type=float, default=6.0)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--prompt-scale", type=int, default=16)
    p.add_argument("--output-scale", type=int, default=4)
    p.add_argument("--num-gpu-blocks", type=int, default=5000)
    p.add_argument("--slo-ttft-ms", type=float, default=2000)
    p.add_argument("--slo-itl-ms", type=float, default=100)
    p.add_argument("--repeat", type=int, default=3, help="real-time runs (the median counts)")
    p.add_argument("--json", dest="json_out")
    args = p.parse_args()
    args.limit = args.requests
    gb.KV_TOKENS[0] = max(args.num_gpu_blocks, 0) * 16
    # Both routers weigh a stall by the same SLO (the control plane's builder emits this).
    gb.ROUTING_OVERRIDES["ttft_itl_ratio"] = args.slo_ttft_ms / args.slo_itl_ms
    workload = gb.scaled_workload(args)
    virtual = virtual_run(args, gb.scaled_workload(args))
    runs = []
    with tempfile.TemporaryDirectory(prefix="simagree-") as tmp:
        for _ in range(max(args.repeat, 1)):
            runs.append(gb._quality_once(args, workload, "pdplane", Path(tmp)))
    # Real time is noisy on a shared box: compare the median run (by TTFT p50).
    real = sorted(runs, key=lambda r: r["ttft_p50_ms"] or 0.0)[len(runs) // 2]
    hit_gap = None
    if real["prefix_hit_rate"] is not None and virtual["prefix_hit_rate"] is not None:
        hit_gap = abs(real["prefix_hit_rate"] - virtual["prefix_hit_rate"]) * 100
    ttft_gap = None
    if real["ttft_p50_ms"] and virtual["ttft_p50_ms"]:
        ttft_gap = abs(virtual["ttft_p50_ms"] / real["ttft_p50_ms"] - 1) * 100
    out = {"args": vars(args), "virtual": virtual, "real_time": real, "real_time_runs": runs,
           "hit_rate_gap_points": hit_gap, "ttft_p50_gap_pct": ttft_gap,
           "agree": hit_gap is not None and ttft_gap is not None and hit_gap <= 1.0
           and ttft_gap <= 15.0}
    print("| run | hit rate | TTFT p50 ms | TTFT p95 ms | failed |")
    print("|---|---|---|---|---|")
    rows = [("virtual time", virtual)] + [(f"real time, run {i + 1}", r)
                                           for i, r in enumerate(runs)]
    for name, r in rows:
        hit = "-" if r["prefix_hit_rate"] is None else f"{r['prefix_hit_rate']:.2%}"
        print(f"| {name} | {hit} | {r['ttft_p50_ms'] or 0:.0f} | {r['ttft_p95_ms'] or 0:.0f} | "
              f"{r['failed']} |")
    print(f"hit-rate gap {hit_gap} points, TTFT p50 gap {ttft_gap} % -> agree={out['agree']}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
