"""One move per load regime: a move decided on a young regime may stop short of the best
layout (a smaller move pays sooner); when the regime lasts and the rest pays, the planner
carries the same move on instead of starting a second one (issue 17: the demo's RAG phase
went aggregated → 8P:4D in four steps, then 8P:4D → 10P:2D as a second move).

Properties (hypothesis):
1. ``extends_move`` holds exactly when the layout is on the last move's way, the best lies
   past its target in the same direction, the load has not moved past the margin and no
   regime began after the decision.
2. Through ``plan_model``: an extension keeps the move's origin, decision time and load,
   heads the same way, pays, and is never toward a layout predicted worse than holding;
   with the load moved past the margin there is no extension.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.planner.dwell import extends_move
from controlplane.planner.planner import LoadInput, plan_model
from controlplane.planner.record import MoveMemory, Regime
from tests.unit.test_planner_invariants import fleet, hold_and_target_scores, make_input

NOW = 10_000.0


def memory(origin: int, target: int, decided_at: float, load: LoadInput) -> MoveMemory:
    def label(p: int) -> str:
        return "aggregated" if p == 0 else f"{p}P:{8 - p}D"

    return MoveMemory(origin, target, label(origin), label(target), decided_at, load.rate_rps,
                      load.isl_mean, load.osl_mean, 2, max((abs(target - origin) + 1) // 2, 1))


@settings(max_examples=200, deadline=None)
@given(origin=st.integers(0, 7), target=st.integers(0, 7), cur=st.integers(0, 7),
       best=st.integers(0, 7), moved=st.booleans(), started=st.floats(0, 200),
       decided=st.floats(0, 200))
def test_extends_move_exactly_when_on_the_way_past_the_target_in_the_same_regime(
        origin, target, cur, best, moved, started, decided):
    load = LoadInput(5.0, 5.0, 4000.0, None, 300.0, 0.1)
    mem = memory(origin, target, decided, load)
    regime = Regime(started, 300.0, (5.0, 4000.0, 300.0, 0.1, 0.0, 0.0), 3)
    got = extends_move(mem, cur, best, moved, regime)
    lo, hi = sorted((origin, target))
    direction = target - origin
    want = (direction != 0 and not moved and started <= decided and lo <= cur <= hi
            and (best - target) * direction > 0)
    assert got == want
    if got:  # always further from the origin, in the move's direction
        assert abs(best - origin) > abs(target - origin)
    assert not extends_move(None, cur, best, False, regime)
    assert not extends_move(mem, cur, best, False, None)


load_st = st.builds(
    lambda rate, isl, osl, hit: LoadInput(rate, rate, isl, None, osl, hit,
                                          inflight=int(rate * 4), inflight_peak=int(rate * 5)),
    # Long prompts at a rate 8 H200 workers serve split: where the best split moves on
    # (rate 1–3.5 req/s of 6k–12k-token prompts extends from most reached splits).
    rate=st.floats(0.5, 4), isl=st.floats(3000, 12000), osl=st.floats(50, 600),
    hit=st.floats(0, 0.5),
)


@settings(max_examples=80, deadline=None)
@given(load=load_st, reached=st.integers(1, 6), age=st.floats(60, 400),
       shift=st.sampled_from([1.0, 1.0, 1.0, 1.6, 0.5]))
def test_an_extension_carries_the_same_move_on_and_only_in_its_regime(load, reached, age,
                                                                       shift):
    """A move aggregated → ``reached`` P, done, decided in this regime; the load now is the
    one it was decided on times ``shift`` (1.6 and 0.5: past the 25 % margin)."""
    roles = ["prefill"] * reached + ["decode"] * (8 - reached)
    workers, links = fleet(2, 4, roles)
    decided = NOW - age
    decided_load = replace(load, rate_rps=load.rate_rps / shift, peak_rps=load.rate_rps / shift)
    mem = memory(0, reached, decided, decided_load)
    ref = (load.rate_rps, load.isl_mean, load.osl_mean, load.prefix_hit, 0.0, 0.0)
    regime = Regime(decided - 30.0, NOW - 30.0, ref, int(age // 30) + 1)
    inp = replace(make_input(workers, links, load, memory=mem), regime=regime)
    d = plan_model(inp, NOW)
    gv = d.record.gate
    if gv is None or gv.move_verdict != "extend":
        return
    assert shift == 1.0, d.explanation  # never once the load moved past the margin
    assert d.action == "change" and d.reason == "continue-move"
    assert d.target.n_prefill > reached  # the move's direction, past its target
    new = d.record.memory
    assert (new.origin_prefill, new.decided_at, new.rate_rps) == (0, decided, mem.rate_rps)
    assert new.target_prefill == d.target.n_prefill
    assert gv.price is not None and gv.price.pays
    hold, target = hold_and_target_scores(inp, d.target.n_prefill)
    assert target >= hold
    assert "extend the move" in d.explanation and "one move, not a second" in d.explanation


def test_the_rest_of_a_split_is_the_same_move_not_a_second():
    """RAG on 8 H200 workers: 2P:6D reached by a move from aggregated decided two minutes
    ago at this load; the best split has more prefill workers, so the decision carries the
    move on (origin aggregated), and the next cycle labels it as that move's step."""
    load = LoadInput(2.0, 2.0, 10000.0, None, 250.0, 0.1, inflight=8, inflight_peak=10)
    workers, links = fleet(2, 4, ["prefill"] * 2 + ["decode"] * 6)
    mem = memory(0, 2, NOW - 120.0, load)
    regime = Regime(NOW - 150.0, NOW - 30.0, (2.0, 10000.0, 250.0, 0.1, 0.0, 0.0), 5)
    inp = replace(make_input(workers, links, load, memory=mem), regime=regime)
    d = plan_model(inp, NOW)
    assert d.record.gate.move_verdict == "extend", d.explanation
    assert d.reason == "continue-move" and d.target.n_prefill > 2
    assert d.record.memory.origin_prefill == 0 and d.record.memory.decided_at == NOW - 120.0
    # Applied: the next cycle sees that move under way, from aggregated.
    after = {c.worker_id: c.to_role for c in d.changes}
    moved = tuple(replace(w, role=after.get(w.id, w.role)) for w in workers)
    nxt = replace(inp, workers=moved, memory=d.record.memory, regime=d.record.regime)
    d2 = plan_model(nxt, NOW + 30.0)
    obs = d2.record.observation
    assert obs.move is not None and obs.move.origin_layout == "aggregated", d2.explanation
    assert obs.move.target_prefill == d.target.n_prefill


@settings(max_examples=100, deadline=None)
@given(roles=st.lists(st.sampled_from(["both", "prefill", "decode"]), min_size=12,
                      max_size=12), target=st.integers(0, 11))
def test_a_move_is_priced_on_the_workers_its_placement_moves(roles, target):
    """The price counts the workers into and out of prefill that the target's placement
    needs: the net is the change of prefill count, and a swap (one out, two in to gain
    one, where the placement balances prefill over nodes differently) costs all three."""
    from controlplane.planner.dwell import prefill_moves
    from controlplane.planner.placement import Topology

    workers, links = fleet(3, 4, roles)
    topo = Topology(list(workers), links)
    into, out_of = prefill_moves(make_input(workers, links, LoadInput(1, 1, 1000, None, 100,
                                                                       0)), topo, target)
    cur = roles.count("prefill")
    assert into - out_of == target - cur
    assert into + out_of >= abs(target - cur)
    placed = topo.placement(target) if target else None
    again = [replace(w, role=("both" if placed is None else
                              "prefill" if placed.roles[w.id] == "prefill" else "decode"))
             for w in workers]
    assert prefill_moves(make_input(tuple(again), links, LoadInput(1, 1, 1000, None, 100, 0)),
                         Topology(again, links), target) == (0, 0)
