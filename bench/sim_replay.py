"""Replay a trace on a simulated fleet in virtual time; print latency, goodput and speed.

    .venv/bin/python bench/sim_replay.py                       # Mooncake, 8 × H200, Llama 3.1 8B
    .venv/bin/python bench/sim_replay.py --model llama-3.3-70b-fp8 --layout 2p6d --router rr

Results go in docs/benchmarks.md ("Simulator: virtual-time replay").
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.routing_baselines import (  # noqa: E402
    DynamoCostRouter,
    LeastLoadedRouter,
    RoundRobinRouter,
)
from workers_agent.sim import links  # noqa: E402
from workers_agent.sim.gateway_routing import GatewayRouter  # noqa: E402
from workers_agent.sim.virtual import (  # noqa: E402
    LinkModel,
    VirtualFleet,
    uniform_fleet,
)
from workers_agent.sim.workload import load_trace, scenario_workload  # noqa: E402

# pdplane: the gateway's router (the fleet's default); the rest are named baselines.
ROUTERS = {"pdplane": GatewayRouter, "dynamo": DynamoCostRouter, "rr": RoundRobinRouter,
           "ll": LeastLoadedRouter}


def roles_for(layout: str, engines: int) -> list[str]:
    """'both' → all aggregated; '2p6d' → 2 prefill then 6 decode engines."""
    if layout == "both":
        return ["both"] * engines
    match = re.fullmatch(r"(\d+)p(\d+)d", layout)
    if not match or int(match[1]) + int(match[2]) != engines:
        raise SystemExit(f"layout {layout!r}: use 'both' or NpMd with N+M = {engines}")
    return ["prefill"] * int(match[1]) + ["decode"] * int(match[2])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default=str(ROOT.parent / "shared/data/traces/"
                                                "mooncake_synthetic.jsonl"))
    parser.add_argument("--scenario", help="a scenarios.json workload instead of a trace")
    parser.add_argument("--num-requests", type=int, default=2000, help="for --scenario")
    parser.add_argument("--rate", type=float, help="for --scenario (req/s)")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--speedup", type=float, default=1.0)
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--gpu", default="H200")
    parser.add_argument("--engines", type=int, default=8)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--layout", default="both", help="'both' or e.g. 2p6d")
    parser.add_argument("--router", choices=sorted(ROUTERS), default="pdplane")
    parser.add_argument("--nic-gbps", type=float, default=400)
    parser.add_argument("--tcp", action="store_true", help="NICs without RDMA")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--nvlink-group", type=int, default=8, help="0: no NVLink")
    parser.add_argument("--slo-ttft-ms", type=float, default=2000)
    parser.add_argument("--slo-itl-ms", type=float, default=50)
    parser.add_argument("--no-bursts", action="store_true", help="one event per engine step")
    parser.add_argument("--json", help="write the summary here")
    args = parser.parse_args()

    loaded = time.perf_counter()
    cpu = time.process_time()
    if args.scenario:
        workload = scenario_workload(
            ROOT.parent / "shared/data/scenarios.json", args.scenario, args.num_requests,
            args.rate, speedup=args.speedup,
        )
    else:
        workload = load_trace(args.trace, args.speedup, args.limit)
    engines = uniform_fleet(
        args.engines, args.model, args.gpu, tp=args.tp, gpus_per_node=args.gpus_per_node,
        nvlink_group_size=args.nvlink_group or None, roles=roles_for(args.layout, args.engines),
    )
    fleet = VirtualFleet(
        engines,
        LinkModel(nic=links.nic(args.nic_gbps, rdma=not args.tcp)),
        router=ROUTERS[args.router](),
        decode_bursts=not args.no_bursts,
    )
    result = fleet.run(workload)
    wall = time.perf_counter() - loaded
    cpu = time.process_time() - cpu
    summary = result.summary(args.slo_ttft_ms, args.slo_itl_ms)
    spec = engines[0].spec
    print(
        f"{workload.name}: {len(workload)} requests, {args.engines} × {spec.hardware.name} "
        f"TP{args.tp} {spec.model.name}, layout {args.layout}, router {args.router}, "
        f"{spec.derived_num_gpu_blocks() if spec.num_gpu_blocks is None else spec.num_gpu_blocks}"
        f" KV blocks/engine"
    )
    print(
        f"wall {wall:.1f} s, CPU {cpu:.1f} s (fleet {result.wall_seconds:.1f} s) for "
        f"{result.sim_seconds:.1f} s of virtual time; {result.num_events} events"
    )
    print("\n".join(summary.lines()))
    for engine_id, stats in result.engine_stats.items():
        print(
            f"  {engine_id}: busy {stats.busy_seconds / max(result.sim_seconds, 1e-9):.0%} "
            f"finished {stats.requests_finished} preemptions {stats.num_preemptions} "
            f"hits {stats.prefix_cache_hits / max(stats.prefix_cache_queries, 1):.0%}"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"wall_s": wall, "cpu_s": cpu, "sim_s": result.sim_seconds,
                 "summary": summary.to_dict()},
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
