"""Re-predict the cells of a saved ``prediction_accuracy.py --json`` run with the cost model
as it is now, and score them: the simulated side does not depend on the model, so a model
change is measured on the very same runs (the "same cells" rows of docs/benchmarks.md).

    .venv/bin/python bench/accuracy_rescore.py RUN.json [--json OUT] [--worst N]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import prediction_accuracy
from prediction_accuracy import (
    CLUSTERS,
    TRACES,
    WARMUP_SHARE,
    EffectivePolicy,
    burst_span,
    make_workload,
    predict_cell,
    summarise,
    write,
)


def local_share(c: dict) -> float | None:
    """For a run saved before ``local_prefill_share`` was measured: the share of its
    measured trace prompts whose length × (1 − the run's hit rate) is at most the limit
    (the run measures each request's own uncached part; the traces' hit rates are ≤ 7 %)."""
    if c["workload"] not in TRACES:
        return None
    sim = c["sim"]
    wl, _slo = make_workload(CLUSTERS[c["cluster"]], c["workload"], c["load"],
                             sim.get("requests_asked") or c.get("requests_base", 200))
    arrivals = sorted(r.arrival for r in wl.requests)
    t0 = arrivals[int(len(arrivals) * WARMUP_SHARE)]
    late = [r for r in wl.requests if r.arrival >= t0]
    lim = EffectivePolicy().local_prefill_max_tokens
    hit = sim.get("prefix_hit", 0.0)
    return sum(1 for r in late if r.input_length * (1 - hit) <= lim) / max(len(late), 1)


def warmup(c: dict) -> float:
    """For a run saved before ``warmup_s`` was recorded: the time from its first arrival to
    its first measured one (the same workload, rebuilt)."""
    wl, _slo = make_workload(CLUSTERS[c["cluster"]], c["workload"], c["load"],
                             c["sim"].get("requests_asked") or c.get("requests_base", 200))
    arrivals = sorted(r.arrival for r in wl.requests)
    return arrivals[int(len(arrivals) * WARMUP_SHARE)] - arrivals[0] if arrivals else 0.0


def span(c: dict) -> float | None:
    """For a run saved before ``burst_span_s`` was recorded: the measured arrivals' burst
    span (the same workload, rebuilt)."""
    if c["workload"] not in TRACES:
        return None
    wl, slo = make_workload(CLUSTERS[c["cluster"]], c["workload"], c["load"],
                            c["sim"].get("requests_asked") or c.get("requests_base", 200))
    arrivals = sorted(r.arrival for r in wl.requests)
    late = arrivals[int(len(arrivals) * WARMUP_SHARE):]
    return burst_span(late, slo["ttft_ms"] / 1000)


def rescore(cells: list[dict]) -> list[dict]:
    out = []
    for c in cells:
        if "local_prefill_share" not in c["sim"]:
            c = {**c, "sim": {**c["sim"], "local_prefill_share": local_share(c)}}
        if "warmup_s" not in c["sim"]:
            c = {**c, "sim": {**c["sim"], "warmup_s": warmup(c)}}
        if "burst_span_s" not in c["sim"]:
            c = {**c, "sim": {**c["sim"], "burst_span_s": span(c)}}
        pred = predict_cell(CLUSTERS[c["cluster"]], c["slo"], c["sim"], c["n_prefill"])
        out.append({**c, "pred": pred, "layout": pred["layout"]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--json", default="")
    ap.add_argument("--worst", type=int, default=0, help="list the N largest share errors")
    ap.add_argument("--steady", action="store_true",
                    help="predict the steady state (no finite horizon), as before issue 16 H8")
    args = ap.parse_args()
    prediction_accuracy.FINITE_HORIZON = not args.steady
    cells = rescore(json.loads(Path(args.run).read_text())["cells"])
    summary = summarise(cells)
    print(json.dumps({k: v for k, v in summary.items() if k != "rank_corr"}, indent=1))
    low = {k: v for k, v in summary["rank_corr"].items() if v < 0.9}
    print("rank < 0.9:", json.dumps(low))
    scored = [c for c in cells if c["agreement"] != "both_overloaded" and not c["censored"]]
    for c in sorted(scored, key=lambda c: -c["share_err_points"])[:args.worst]:
        print(f"{c['share_err_points']:5.1f} {c['cluster'][:8]} {c['workload']} x{c['load']:g} "
              f"{c['layout']}: share sim {c['sim']['share']:.3f} pred {c['pred']['share']:.3f} "
              f"ttft p95 sim {c['sim']['ttft_p95_s']} pred {c['pred']['ttft_p95_s']} "
              f"[{c['agreement']}]")
    if args.json:
        write(args.json, cells, summary)


if __name__ == "__main__":
    main()
