"""bench/gateway_bench.py's latency goal: judged on the medians and round by round."""

from bench.gateway_bench import latency_goal


def rounds(*pairs):
    """(p50, p99) seconds per round; the CPU figure is not judged."""
    return [(p50, p99, 0.0) for p50, p99 in pairs]


def samples(ours, peer, direct, c=8, mode="nonstream"):
    return {("direct", mode, c): rounds(*direct), ("pdplane", mode, c): rounds(*ours),
            ("sglang-router", mode, c): rounds(*peer)}


def test_each_round_is_judged_against_the_same_rounds_direct_latency():
    # Round 2's box was slow for everyone: measured from its own direct figure, pdplane is
    # still ahead there; the medians decide the verdict, the count says how often it held.
    direct = [(1.0e-3, 2.0e-3), (3.0e-3, 6.0e-3), (1.0e-3, 2.0e-3)]
    ours = [(1.8e-3, 3.0e-3), (3.7e-3, 7.0e-3), (2.2e-3, 3.1e-3)]
    peer = [(1.9e-3, 3.0e-3), (3.9e-3, 7.0e-3), (2.0e-3, 3.0e-3)]
    g = latency_goal(samples(ours, peer, direct))["nonstream_c8"]
    assert g["p50_rounds_met"] == 2 and g["rounds"] == 3
    assert g["p50_met"]  # medians of the added p50: 0.8 vs 0.9 ms
    assert g["p99_rounds_met"] == 3 and g["p99_met"]
    assert abs(g["p50_limit_ms"] - 0.9) < 1e-9 and abs(g["p99_limit_ms"] - 1.5) < 1e-9


def test_c1_is_held_to_a_fixed_addition_and_c64_to_the_peer():
    direct = [(0.2e-3, 0.4e-3)] * 3
    ours = [(0.54e-3, 0.9e-3)] * 3  # +0.34 ms p50: within 0.35
    peer = [(0.4e-3, 0.6e-3)] * 3  # +0.2 ms p50, +0.2 ms p99
    g = latency_goal(samples(ours, peer, direct, c=1))["nonstream_c1"]
    assert g["p50_met"] and g["p50_rounds_met"] == 3 and g["p50_limit_ms"] == 0.35
    assert not g["p99_met"] and g["p99_rounds_met"] == 0  # +0.5 ms > 1.5 × 0.2 ms
    g = latency_goal(samples(ours, peer, direct, c=64))["nonstream_c64"]
    assert not g["p50_met"] and g["p50_rounds_met"] == 0


def test_no_verdict_without_the_peer():
    s = samples([(1e-3, 2e-3)], [(1e-3, 2e-3)], [(1e-3, 2e-3)])
    del s[("sglang-router", "nonstream", 8)]
    assert latency_goal(s) == {}
