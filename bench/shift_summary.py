"""The summary of bench/planner_shift.py: per workload, the planner's run against every
static layout's on the same arrivals (whole run, per phase, the stitched per-phase ceiling),
its flaps and role changes, and the minima/maxima over workloads."""

from __future__ import annotations

NEW_TARGET = ("better-layout", "roll-back", "policy-bound", "surge-headroom")


def flaps(log: list[dict]) -> int:
    """A → B → A inside one phase: a new target equal to where the previous move started,
    decided in the same phase as that move."""
    n, last = 0, None
    for e in log:
        if e["action"] != "change" or e["reason"] not in NEW_TARGET:
            continue
        if last and e["phase"] == last["phase"] and e["target_p"] == last["from_p"]:
            n += 1
        last = e
    return n


def summarise(runs: list[dict]) -> dict:
    groups: dict = {}
    for r in runs:
        groups.setdefault((r["cluster"], r["workload"]), []).append(r)
    rows = {}
    for (c, w), rs in sorted(groups.items()):
        planner = next(r for r in rs if r["static"] is None)
        statics = [r for r in rs if r["static"] is not None]
        best = max(statics, key=lambda r: r["whole"])
        phase_ratios, stitched = {}, 0.0
        for ph, g in planner["phases"].items():
            top = max(s["phases"][ph] for s in statics)
            phase_ratios[ph] = g / top if top > 0 else None
            stitched += top * planner["phase_seconds"][ph]
        # The ceiling: each phase's best static layout, stitched (as if a planner knew every
        # phase in advance and moved for free), ÷ the best single static layout. Near 1, no
        # planner can beat the best static by more than that, and any move costs its drain.
        span = sum(planner["phase_seconds"].values())
        oracle = (stitched / span) / best["whole"] if best["whole"] and span else None
        log = planner.get("log", [])
        factors = [x for e in log for x in e["factors"][:2]]
        rows[f"{c}/{w}"] = {
            "goodput_vs_best_static": planner["whole"] / best["whole"] if best["whole"] else None,
            "best_static": best["static"],
            "phase_oracle_vs_best_static": oracle,
            "planner_goodput_rps": planner["whole"], "best_static_goodput_rps": best["whole"],
            "worst_phase_vs_best_static_phase": min(
                (v for v in phase_ratios.values() if v is not None), default=None),
            "phase_vs_best_static_phase": phase_ratios,
            "flaps": flaps(log),
            "role_changes": planner["role_changes"],
            "moves_toward_predicted_worse": sum(1 for e in log if e["worse"]),
            "all_miss_holds": sum(1 for e in log if e["alert"]),
            "calibration_factor_range": [min(factors), max(factors)] if factors else None,
            "plans": [f"{e['t']:.0f}s {e['phase']}: {e['reason']} {e['label']} → {e['target']}"
                      for e in log if e["action"] == "change"],
            # Every cycle with its inputs (the planner's load: smoothed, at the arriving rate
            # in a backlog, the starting requests' after a change of mix; as derived, the
            # window's arrivals, finishes and first-token prompt length, measured p95s), not
            # only the changes.
            "cycles": [f"{e['t']:.0f}s {e['phase']}: {e['action']} {e['reason']} "
                       f"{e['label']} → {e['target']}; load {e['load']} derived "
                       f"{e.get('derived')} arrived {e.get('arrived')} finished "
                       f"{e.get('finished')} first-token prompt {e.get('first_token_isl')} "
                       f"measured {e['measured_ms']}"
                       + (" backlog" if e.get("backlog") else "")
                       + (" new-mix" if e.get("mix") else "") for e in log],
        }

    def agg(key, fn):
        vals = [r[key] for r in rows.values() if r[key] is not None]
        return fn(vals) if vals else None

    summary = {
        "workloads": len(rows),
        "goodput_vs_best_static_min": agg("goodput_vs_best_static", min),
        "goodput_vs_best_static_max": agg("goodput_vs_best_static", max),
        "worst_phase_vs_best_static_phase_min": agg("worst_phase_vs_best_static_phase", min),
        "flaps_max": agg("flaps", max),
        "role_changes_max": agg("role_changes", max),
        "role_changes_min": agg("role_changes", min),
        "moves_toward_predicted_worse_max": agg("moves_toward_predicted_worse", max),
    }
    return {"summary": summary, "workloads": rows}
