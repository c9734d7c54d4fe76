"""Finished requests are counted under the roles workers serve, not only the roles they
are moving to (issue 17): a worker leaving decode still finishes its answers, and the
window's counters hold them after its drain too."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.planner.derive import counting_roles, derive_load, with_arrivals
from controlplane.planner.placement import WorkerInput
from controlplane.planner.planner import LoadInput

NOW = 1_000_000.0


def test_a_worker_changing_role_counts_as_both_until_the_window_has_passed_its_change():
    workers = [WorkerInput(1, "a", "n", role="decode"),
               WorkerInput(2, "b", "n", role="prefill", state="draining", changed_at=NOW - 90),
               WorkerInput(3, "c", "n", role="prefill", changed_at=NOW - 10),
               WorkerInput(4, "d", "n", role="prefill", changed_at=NOW - 40)]
    assert counting_roles(workers, NOW, 30.0) == {1: "decode", 2: "both", 3: "both",
                                                  4: "prefill"}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["prefill", "decode", "both"]),
                          st.sampled_from(["active", "draining"]),
                          st.one_of(st.none(), st.floats(0, 600))), max_size=12),
       st.floats(1, 300))
def test_counting_roles_only_ever_widen_a_role_to_both(spec, window):
    workers = [WorkerInput(i, f"w{i}", "n", role=role, state=state,
                           changed_at=None if ago is None else NOW - ago)
               for i, (role, state, ago) in enumerate(spec)]
    roles = counting_roles(workers, NOW, window)
    assert set(roles) == {w.id for w in workers}
    for w in workers:
        assert roles[w.id] in (w.role, "both")
        if w.state == "draining":
            assert roles[w.id] == "both"


def test_mid_move_the_answers_a_worker_leaving_decode_finishes_are_counted():
    """The demo's window 180–200 s at a 20 s cycle: workers that had just gone from decode
    to prefill finished their answers there. Counted under 'prefill' those were lost (3.95
    req/s for 7.6 finished); counted as 'both', with their prefill halves taken out, the
    rate is every whole request that finished once."""
    reports = [
        {"worker_id": 1, "requests_per_s": 2.0, "prefill_only_requests_per_s": 0.0},
        # Left decode for prefill: 3 answers/s finished, 1/s of its finishes were prefill
        # halves of requests decoded elsewhere.
        {"worker_id": 2, "requests_per_s": 3.0, "prefill_only_requests_per_s": 1.0},
        # A prefill worker all along: every finish is a half.
        {"worker_id": 3, "requests_per_s": 4.0, "prefill_only_requests_per_s": 4.0},
    ]
    workers = [WorkerInput(1, "a", "n", role="decode"),
               WorkerInput(2, "b", "n", role="prefill", state="draining", changed_at=NOW - 5),
               WorkerInput(3, "c", "n", role="prefill")]
    desired = {w.id: w.role for w in workers}
    assert derive_load(reports, desired, 256).rate_rps == 2.0  # the answers went missing
    counted = derive_load(reports, counting_roles(workers, NOW, 20.0), 256)
    assert counted.rate_rps == 4.0


def test_arrivals_add_the_change_held_to_the_windows_own_finished_rate():
    """A loop that smooths its rate (bench/planner_shift.py) gives the window's finished
    rate alongside: conservation holds within one window, so a smoothed rate beside a raw
    change in what is held read 0 arriving where 1.8/s arrived."""
    smoothed = LoadInput(5.25, 5.25, 3600, None, 300, 0.0)
    out, note = with_arrivals(smoothed, 16, 139, 20.0, 6.0, finished_rps=7.65)
    assert abs(out.rate_rps - (7.65 + (16 - 139) / 20.0)) < 1e-9  # 1.5/s
    assert "7.65/s that finished" in note
    # Without the window's own rate the smoothed one stands in, as before.
    out, _ = with_arrivals(smoothed, 16, 139, 20.0, 6.0)
    assert out.rate_rps == 0.0
