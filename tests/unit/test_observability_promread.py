from controlplane.observability.promread import (
    ITL_BUCKETS,
    TTFT_BUCKETS,
    FleetLatencyReader,
    affinity_query,
    affinity_share_from,
    quantile_query,
    rate_query,
)
from controlplane.observability.sd import engine_groups, gateway_groups


def test_quantile_query_asks_old_and_new_itl_names():
    q = quantile_query(0.95, ITL_BUCKETS, {"model_name": "m"}, "5m")
    assert q.startswith("histogram_quantile(0.95, ")
    assert 'vllm:inter_token_latency_seconds_bucket{model_name="m"}' in q
    assert 'vllm:time_per_output_token_seconds_bucket{model_name="m"}' in q
    assert " or " in q and "sum by (le) (rate(" in q


def test_label_values_are_escaped():
    q = quantile_query(0.5, TTFT_BUCKETS, {"model_name": 'a"b\\c'}, "1m")
    assert 'model_name="a\\"b\\\\c"' in q


def test_rate_query_sums():
    assert rate_query(("x_total",), {"w": "n/e"}, "2m") == '(sum(rate(x_total{w="n/e"}[2m])))'


def test_affinity_query_sums_routing_decisions_by_reason():
    q = affinity_query('m"1', "60000ms")
    assert q == ('sum by (reason) (increase(pdplane_gateway_routing_decisions_total'
                 '{model="m\\"1"}[60000ms]))')


def _vector(**counts):
    return [{"metric": {"reason": r}, "value": [1700000000.0, str(v)]} for r, v in counts.items()]


def test_affinity_share_counts_the_aggregated_path_only():
    # 30 followed (one a retry) of 30 + 50 + 20 aggregated-path decisions; P/D reasons and
    # unknown ones are not part of the aggregated pool's mix.
    answer = _vector(kv_prefix=29.0, retry_kv_prefix=1.0, kv_aware=45.0, retry_kv_aware=5.0,
                     only_candidate=20.0, pd_remote_prefill=400.0, something_new=7.0)
    assert affinity_share_from(answer) == 0.3
    assert affinity_share_from(_vector(kv_aware=100.0)) == 0.0


def test_bad_or_thin_answers_mean_unknown():
    assert affinity_share_from([]) is None
    assert affinity_share_from(None) is None
    assert affinity_share_from({"error": "x"}) is None
    assert affinity_share_from(_vector(kv_prefix=3.0, kv_aware=2.0)) is None  # too few
    assert affinity_share_from(_vector(pd_remote_prefill=500.0)) is None  # split: no mix
    junk = [{"metric": {}, "value": [0, "NaN"]}, {"value": [0]}, "x",
            {"metric": {"reason": "kv_prefix"}, "value": [0, "-5"]}]
    assert affinity_share_from(junk + _vector(kv_prefix=10.0, kv_aware=30.0)) == 0.25


def test_unreachable_prometheus_means_fall_back_not_raise():
    reader = FleetLatencyReader("http://127.0.0.1:9", timeout_s=0.5)
    assert reader.model_figures("llama") is None
    # Cached for the cycle: the second call does not wait for another timeout.
    assert reader.model_figures("llama") is None
    assert reader.affinity_share("llama", 60.0) is None


def test_engine_targets_carry_role_labels():
    groups = engine_groups([{
        "metrics_url": "http://10.0.0.5:8001/metrics", "api_url": "http://10.0.0.5:8001",
        "engine_kind": "vllm", "cluster": "c", "node": "n1", "name": "e1", "model": "m",
        "role": "decode", "state": "active",
    }])
    assert groups == [{
        "targets": ["10.0.0.5:8001"],
        "labels": {"__metrics_path__": "/metrics", "__scheme__": "http",
                   "job": "pdplane-engine-vllm", "cluster": "c", "node": "n1", "model": "m",
                   "worker": "n1/e1", "role": "decode", "state": "active"},
    }]


def test_metrics_url_defaults_from_api_url_and_gateways_listed():
    groups = engine_groups([{
        "metrics_url": "", "api_url": "https://e.example/", "engine_kind": "sim", "cluster": "c",
        "node": "n", "name": "e", "model": "m", "role": "both", "state": "active",
    }])
    assert groups[0]["targets"] == ["e.example:443"]
    assert groups[0]["labels"]["__scheme__"] == "https"
    gw = gateway_groups([{"url": "http://127.0.0.1:9000", "cluster": "c", "name": "g"}])
    assert gw[0]["targets"] == ["127.0.0.1:9000"] and gw[0]["labels"]["job"] == "pdplane-gateway"
