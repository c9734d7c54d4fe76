from controlplane.observability.promread import (
    ITL_BUCKETS,
    TTFT_BUCKETS,
    FleetLatencyReader,
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


def test_unreachable_prometheus_means_fall_back_not_raise():
    reader = FleetLatencyReader("http://127.0.0.1:9", timeout_s=0.5)
    assert reader.model_figures("llama") is None
    # Cached for the cycle: the second call does not wait for another timeout.
    assert reader.model_figures("llama") is None


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
