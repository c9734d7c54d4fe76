"""The decision view: verdict, binding constraint and chart from the planner's record."""

from types import SimpleNamespace

from controlplane.dashboard.decision import decision_view
from controlplane.dashboard.svg import bar_chart, short_number


def _plan(**kw):
    base = dict(
        current_layout="aggregated", target_layout="2P:6D", status="proposed",
        explanation=("m on 8 worker(s) (RTX PRO 6000, TP1), aggregated: 4.0 req/s now. "
                     "Now aggregated: ITL p95 54 ms. Binding constraint of 2P:6D: decode. "
                     "→ move toward 2P:6D (predicted goodput 3.9 req/s vs 0.29 req/s now): "
                     "n1/e0 both→prefill."),
        predictions={"candidates": [
            {"layout": "aggregated", "goodput_rps": 0.29, "ttft_p95_s": 0.8,
             "itl_p95_s": 0.054},
            {"layout": "2P:6D", "goodput_rps": 3.9, "ttft_p95_s": 1.2, "itl_p95_s": 0.031},
            {"layout": "1P:7D", "goodput_rps": 0.0, "ttft_p95_s": None, "itl_p95_s": 0.03},
        ]},
        record={"action": "change", "observe": {"ttft_target_ms": 2500, "itl_target_ms": 50,
                                                "move": {"step": 1, "steps_total": 2,
                                                         "target_layout": "2P:6D"}},
                "choose": {"binding": "decode step time", "all_miss": False}},
        diff=[{"worker": "e0", "node": "n1", "from_role": "both", "to_role": "prefill",
               "done": True}, {"worker": "e1", "node": "n1", "from_role": "both",
                               "to_role": "prefill", "done": False}],
        inputs={},
    )
    base.update(kw)
    return SimpleNamespace(**base)


def test_verdict_binding_chart_and_progress_come_from_the_record():
    d = decision_view(_plan())
    assert d["verdict"].startswith("move toward 2P:6D (predicted goodput 3.9")
    assert d["binding"] == "decode step time"
    goodput, ttft, itl = d["charts"]
    assert [b.label for b in goodput["chart"].bars] == ["aggregated", "2P:6D", "1P:7D"]
    kinds = {b.label: b.kind for b in itl["chart"].bars}
    assert kinds == {"aggregated": "current over", "2P:6D": "chosen", "1P:7D": ""}
    assert itl["chart"].target_y is not None and ttft["target"] == 2.5
    # Unbounded (None) is drawn full height and labelled ∞, never as zero.
    unbounded = ttft["chart"].bars[2]
    assert unbounded.text == "∞" and "unbounded" in unbounded.kind and unbounded.h > 0
    assert d["progress"]["step"] == 1 and d["progress"]["done"] == 1
    assert len(d["bullets"]) == 4


def test_plans_before_the_record_fall_back_to_their_fields():
    d = decision_view(_plan(record={}, explanation="long prompts push ITL p95 over 50 ms",
                            predictions={}, diff=[]))
    assert d["verdict"] == "move aggregated → 2P:6D" and d["charts"] == []
    assert d["bullets"] == ["long prompts push ITL p95 over 50 ms"]


def test_bar_chart_scales_to_the_largest_value_or_the_target():
    chart = bar_chart(["a", "b"], [1.0, 2.0], target=4.0)
    assert chart.bars[1].h > chart.bars[0].h
    assert chart.target_y < chart.bars[1].y  # the target is above the tallest bar


def test_measured_values_of_the_running_layout_are_markers_once_applied():
    from controlplane.dashboard.decision import measured_from_record

    later = {"observe": {"layout_label": "2P:6D (1 draining)", "measured_ttft_p95_ms": 900.0,
                         "measured_itl_p95_ms": 62.0, "rate_rps": 3.5}}
    measured = measured_from_record(later, at=1.0)
    assert measured["layout"] == "2P:6D" and measured["itl_p95_s"] == 0.062
    d = decision_view(_plan(status="applied"), measured)
    goodput, ttft, itl = d["charts"]
    assert d["measured_on_chart"]
    (g,), (t,), (i,) = goodput["chart"].measured, ttft["chart"].measured, itl["chart"].measured
    assert (g.label, g.value, t.value, i.value) == ("2P:6D", 3.5, 900.0, 62.0)  # latencies in ms
    # On the chosen bar, and scaled with it: 62 ms is above the 50 ms target line.
    bar = next(b for b in itl["chart"].bars if b.label == "2P:6D")
    assert i.x == bar.cx and i.y < itl["chart"].target_y
    assert g.path.startswith(f"M{g.x},")


def test_measured_on_a_layout_that_is_no_candidate_is_text_only():
    from controlplane.dashboard.decision import measured_from_record

    measured = measured_from_record({"observe": {"layout_label": "1P + 2D + 5 both",
                                                 "measured_ttft_p95_ms": None,
                                                 "measured_itl_p95_ms": 40.0,
                                                 "rate_rps": 1.0}})
    d = decision_view(_plan(status="applied"), measured)
    assert not d["measured_on_chart"] and d["measured"]["itl_p95_s"] == 0.04
    assert all(c["chart"].measured == [] for c in d["charts"])


def test_no_measurement_without_an_observation():
    from controlplane.dashboard.decision import measured_from_record

    assert measured_from_record({}) is None
    assert measured_from_record({"observe": {"layout_label": "A"}}) is None
    assert decision_view(_plan())["measured"] is None


def test_bar_chart_scale_includes_a_measured_value_above_every_bar():
    chart = bar_chart(["a", "b"], [1.0, 2.0], measured={"b": 8.0, "zzz": 1.0})
    assert [m.label for m in chart.measured] == ["b"]
    assert chart.top >= 8.0 and chart.measured[0].y >= 12


def test_what_was_measured_when_deciding_is_a_hollow_marker_on_the_current_bar():
    record = {**_plan().record, "observe": {**_plan().record["observe"],
                                            "layout_label": "aggregated",
                                            "measured_ttft_p95_ms": 700.0,
                                            "measured_itl_p95_ms": 58.0, "rate_rps": 4.0}}
    d = decision_view(_plan(record=record))
    itl = d["charts"][2]["chart"]
    (m,) = itl.measured
    assert (m.kind, m.label, m.value) == ("then", "aggregated", 58.0)  # ms
    assert d["then_on_chart"] and not d["measured_on_chart"]


def test_many_candidates_are_focused_on_the_chosen_current_and_best():
    from controlplane.dashboard.decision import CHART_MAX_BARS

    cands = [{"layout": "aggregated", "goodput_rps": 1.0}] + [
        {"layout": f"{p}P:{32 - p}D", "goodput_rps": 40.0 if p == 30 else float(p)}
        for p in range(1, 32)]
    d = decision_view(_plan(current_layout="aggregated", target_layout="24P:8D",
                            predictions={"candidates": cands}, record={}))
    labels = [b.label for b in d["charts"][0]["chart"].bars]
    assert len(labels) == CHART_MAX_BARS and d["hidden_candidates"] == 32 - CHART_MAX_BARS
    assert {"aggregated", "24P:8D", "23P:9D", "25P:7D", "30P:2D"} <= set(labels)
    assert labels == [c["layout"] for c in cands if c["layout"] in labels]  # planner order
    assert d["charts"][0]["chart"].width >= 34 * CHART_MAX_BARS


def test_a_mixed_layout_mid_move_is_charted_from_the_hold_prediction():
    record = {"observe": {"layout_label": "2P + 1D + 29 both", "measured_ttft_p95_ms": 500.0,
                          "measured_itl_p95_ms": 400.0, "rate_rps": 40.0,
                          "ttft_target_ms": 2500, "itl_target_ms": 50},
              "predict": {"hold_now": {"layout": "2P + 1D + 29 both", "goodput_rps": 2.7,
                                       "ttft_p95_s": 0.43, "itl_p95_s": 0.42},
                          "candidates": [{"layout": "24P:8D", "goodput_rps": 48.0}]}}
    d = decision_view(_plan(current_layout="2P + 1D + 29 both", target_layout="24P:8D",
                            predictions={}, record=record))
    bars = d["charts"][2]["chart"].bars
    assert [b.label for b in bars] == ["2P + 1D + 29 both", "24P:8D"]
    assert bars[0].kind.startswith("current") and d["then_on_chart"]
    (m,) = d["charts"][2]["chart"].measured
    assert (m.label, m.value, m.kind) == ("2P + 1D + 29 both", 400.0, "then")  # ms


def test_a_long_list_of_moves_is_counted_in_the_verdict_not_listed():
    moves = ", ".join(f"n1/e{i} both→decode" for i in range(12))
    text = f"→ move toward 1P:11D (predicted goodput 1.66 req/s vs 0.21 req/s now): {moves}."
    d = decision_view(_plan(explanation=text))
    assert d["verdict"] == ("move toward 1P:11D (predicted goodput 1.66 req/s vs 0.21 req/s "
                            "now): 12 workers change role (each listed below)")
    few = "→ move toward 2P:6D (finish the move: step 2 of 3): n1/e0 both→prefill."
    assert decision_view(_plan(explanation=few))["verdict"] == few[2:-1]


def test_latency_charts_are_in_ms_and_worker_names_carry_the_node_once():
    d = decision_view(_plan(diff=[{"worker": "n1/e0", "node": "n1", "from_role": "both",
                                   "to_role": "prefill", "done": True},
                                  {"worker": "e1", "node": "n1", "from_role": "both",
                                   "to_role": "decode", "done": False}]))
    assert [c["label"] for c in d["progress"]["changes"]] == ["n1/e0", "n1/e1"]
    _goodput, ttft, itl = d["charts"]
    assert ttft["unit"] == itl["unit"] == "ms" and ttft["target"] == 2.5  # caption: seconds
    assert ttft["chart"].target_y is not None
    assert all(b.text == "∞" or "e" not in b.text for b in ttft["chart"].bars)
    assert short_number(2750.4) == "2,750" and short_number(4.923) == "4.92"
