"""One planning cycle over 1,000 nodes × 8 GPUs and 50 served models (pure core).

    .venv/bin/python bench/planner_scale.py [--nodes 1000] [--models 50] [--repeat 5]

Each model gets 20 nodes' worth of TP1 workers (160), NVLink groups of 4, 400 G RDMA;
loads vary per model so some stay aggregated and some split. Reports the median and worst
wall time of plan_cluster over all models (inputs are built once, as inputs.py would).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from controlplane.planner.costmodel import Link, ModelSpec, WorkerShape, gpu_profile_for
from controlplane.planner.placement import NicInput, NodeLinks, WorkerInput
from controlplane.planner.planner import LoadInput, ModelInput, plan_cluster
from controlplane.policies.effective import EffectivePolicy


def build(nodes: int, models: int) -> list[ModelInput]:
    gpu = gpu_profile_for("H200 NVL")
    model = ModelSpec("llama-3.3-70b-fp8", 80, 8, 128, 1, 70.6, 70.6e9)
    links = {
        f"node-{n:04d}": NodeLinks(Link.pcie(5, 16), Link.nvlink(450),
                                   (NicInput("ib", 400, True),))
        for n in range(nodes)
    }
    per_model = nodes // models
    inputs = []
    wid = 0
    for m in range(models):
        workers = []
        for n in range(m * per_model, (m + 1) * per_model):
            for g in range(8):
                workers.append(WorkerInput(wid, f"node-{n:04d}/e{g}", f"node-{n:04d}", g // 4))
                wid += 1
        rate = 10.0 + 10.0 * m  # 10 … 500 req/s
        load = LoadInput(rate, rate, 2000 + 100 * m, None, 300, 0.3,
                         int(rate * 6), int(rate * 8))
        inputs.append(ModelInput(m, model, WorkerShape(gpu, 1), tuple(workers), load,
                                 EffectivePolicy(ttft_p95_ms=2500, itl_p95_ms=50), links))
    return inputs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--models", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    inputs = build(args.nodes, args.models)
    times, cpu = [], []
    for _ in range(args.repeat):
        t, c = time.perf_counter(), time.process_time()
        out = plan_cluster(inputs, now=1e9, nodes_total=args.nodes, nodes_stale=0)
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    changes = sum(1 for d in out.models if d.action == "change")
    workers = sum(len(i.workers) for i in inputs)
    print(f"{args.nodes} nodes, {workers} workers, {args.models} models: "
          f"median {statistics.median(times) * 1000:.0f} ms, worst {max(times) * 1000:.0f} ms "
          f"per cycle, CPU median {statistics.median(cpu) * 1000:.0f} ms "
          f"({changes} models would change)")


if __name__ == "__main__":
    main()
