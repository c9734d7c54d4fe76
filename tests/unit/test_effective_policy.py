import pytest

from controlplane.policies.effective import DEFAULT_POLICY, PolicyError, merge_policy


def test_defaults_when_nothing_is_set():
    policy, sources = merge_policy(None, None)
    assert policy == DEFAULT_POLICY
    assert set(sources.values()) == {"default"}


def test_model_override_beats_cluster_which_beats_default():
    cluster = {"_source": "cluster", "ttft_p95_ms": 2500, "itl_p95_ms": 40}
    model = {"_source": "model", "ttft_p95_ms": 800}
    policy, sources = merge_policy(cluster, model)
    assert policy.ttft_p95_ms == 800 and sources["ttft_p95_ms"] == "model"
    assert policy.itl_p95_ms == 40 and sources["itl_p95_ms"] == "cluster"
    assert policy.attainment == DEFAULT_POLICY.attainment and sources["attainment"] == "default"


def test_none_in_a_layer_means_inherit():
    policy, _ = merge_policy({"ttft_p95_ms": 2000}, {"ttft_p95_ms": None})
    assert policy.ttft_p95_ms == 2000


def test_unknown_field_is_an_error():
    with pytest.raises(PolicyError) as exc:
        merge_policy({"ttft_p59_ms": 1})
    assert exc.value.errors == {"ttft_p59_ms": "unknown policy field"}


def test_cross_layer_contradiction_is_caught_after_merging():
    # Each layer is fine alone; together min > max.
    with pytest.raises(PolicyError) as exc:
        merge_policy({"max_decode_workers": 2}, {"min_decode_workers": 3})
    assert "min_decode_workers" in exc.value.errors


@pytest.mark.parametrize(
    "layer,field",
    [
        ({"attainment": 1.5}, "attainment"),
        ({"ttft_p95_ms": 0}, "ttft_p95_ms"),
        ({"rebalancing_mode": "yolo"}, "rebalancing_mode"),
        ({"hysteresis": 1.0}, "hysteresis"),
        ({"max_changes_per_cycle": 0}, "max_changes_per_cycle"),
        ({"rebalance_interval_s": 1}, "rebalance_interval_s"),
    ],
)
def test_out_of_range_values(layer, field):
    with pytest.raises(PolicyError) as exc:
        merge_policy(layer)
    assert field in exc.value.errors


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_overload_change_share_is_a_share(share):
    with pytest.raises(PolicyError) as exc:
        merge_policy({"overload_change_share": share})
    assert "overload_change_share" in exc.value.errors


def test_overload_change_share_defaults_to_half():
    policy, sources = merge_policy()
    assert policy.overload_change_share == 0.5 and sources["overload_change_share"] == "default"


@pytest.mark.parametrize("factor", [-1.0, 0.5])
def test_shedding_factor_is_off_or_at_least_one(factor):
    with pytest.raises(PolicyError) as exc:
        merge_policy({"shed_after_ttft_factor": factor})
    assert "shed_after_ttft_factor" in exc.value.errors
    policy, _ = merge_policy({"shed_after_ttft_factor": 2})
    assert policy.shed_after_ttft_factor == 2


def test_affinity_weights_are_validated():
    _, _ = merge_policy(None, {"_source": "model", "affinity_load_factor": 0.0,
                               "affinity_kv_limit": 1.0})
    for field, value in (("affinity_load_factor", -1.0), ("affinity_kv_limit", 1.5),
                         ("prefix_min_match", -0.1), ("cache_balance_band", -0.5)):
        with pytest.raises(PolicyError) as info:
            merge_policy(None, {"_source": "model", field: value})
        assert field in info.value.errors
