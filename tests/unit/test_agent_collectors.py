"""Agent collectors: Prometheus parsing, windowed quantiles, KV-event decoding, backoff."""

import math

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers_agent.collectors.counters import RateTracker
from workers_agent.collectors.engine_metrics import (
    EngineMetricsCollector,
    histogram_quantile,
    parse_prometheus_text,
)
from workers_agent.collectors.kv_events import KVBlockState, decode_events
from workers_agent.collectors.links import SysfsLinkCollector
from workers_agent.transport import ReportBuffer, backoff_delay

BUCKETS = (0.01, 0.1, 1.0, 10.0)


def metrics_text(*, running=2, waiting=1, usage=0.25, blocks=1000, queries=0, hits=0,
                 prompt=0, gen=0, ttft=(), itl=(), old_names=False):
    kv = "vllm:gpu_cache_usage_perc" if old_names else "vllm:kv_cache_usage_perc"
    pq = "vllm:gpu_prefix_cache_queries" if old_names else "vllm:prefix_cache_queries"
    ph = "vllm:gpu_prefix_cache_hits" if old_names else "vllm:prefix_cache_hits"
    itl_name = ("vllm:time_per_output_token_seconds" if old_names
                else "vllm:inter_token_latency_seconds")
    lines = [
        "# HELP vllm:num_requests_running Number of requests.",
        "# TYPE vllm:num_requests_running gauge",
        f'vllm:num_requests_running{{engine="0",model_name="m"}} {running}',
        f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}',
        f'{kv}{{engine="0",model_name="m"}} {usage}',
        f'vllm:cache_config_info{{block_size="16",engine="0",num_gpu_blocks="{blocks}",'
        f'prefix_caching_hash_algo="sha256"}} 1.0',
        f'{pq}_total{{engine="0",model_name="m"}} {queries}',
        f'{ph}_total{{engine="0",model_name="m"}} {hits}',
        f'vllm:prompt_tokens_total{{engine="0",model_name="m"}} {prompt}',
        f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {gen}',
    ]
    for name, values in (("vllm:time_to_first_token_seconds", ttft), (itl_name, itl)):
        for le in (*BUCKETS, math.inf):
            count = sum(1 for v in values if v <= le)
            le_text = "+Inf" if math.isinf(le) else repr(le)
            lines.append(f'{name}_bucket{{engine="0",le="{le_text}",model_name="m"}} {count}')
        lines.append(f'{name}_count{{engine="0",model_name="m"}} {len(values)}')
        lines.append(f'{name}_sum{{engine="0",model_name="m"}} {sum(values)}')
    return "\n".join(lines) + "\n"


def test_parser_reads_labels_with_escapes_and_skips_junk():
    parsed = parse_prometheus_text('a{x="q\\"uote",y="b"} 1.5\nnot a metric line\n# c\nb 2\n')
    assert parsed["a"] == [({"x": 'q"uote', "y": "b"}, 1.5)]
    assert parsed["b"] == [({}, 2.0)]


@pytest.mark.parametrize("old", [False, True])
def test_gauges_and_kv_blocks_current_and_old_names(old):
    s = EngineMetricsCollector("http://x/metrics").parse(metrics_text(old_names=old), now=0)
    assert (s.running, s.waiting, s.kv_usage) == (2, 1, 0.25)
    assert (s.kv_blocks_total, s.kv_blocks_used, s.block_size) == (1000, 250, 16)


def test_sglang_names():
    text = ('sglang:num_running_reqs{model_name="m"} 4\nsglang:num_queue_reqs 2\n'
            'sglang:token_usage 0.5\nsglang:cache_config_info{page_size="1",num_pages="800"} 1\n')
    s = EngineMetricsCollector("http://x/metrics").parse(text, now=0)
    assert (s.running, s.waiting, s.kv_blocks_total, s.kv_blocks_used) == (4, 2, 800, 400)


@pytest.mark.parametrize("old", [False, True])
def test_windowed_rates_hit_rate_and_quantiles_from_deltas(old):
    c = EngineMetricsCollector("http://x/metrics", window_s=10, rate_window_s=10)
    # Before the window: 100 slow requests that must not count.
    first = c.parse(metrics_text(queries=1000, hits=0, prompt=1000, gen=500,
                                 ttft=[5.0] * 100, itl=[5.0] * 100, old_names=old), now=0)
    assert first.ttft_p95_s is None and first.prompt_tokens_per_s is None
    fast = [0.05] * 90 + [0.5] * 10
    second = c.parse(metrics_text(queries=2000, hits=600, prompt=3000, gen=1500,
                                  ttft=[5.0] * 100 + fast, itl=[5.0] * 100 + fast,
                                  old_names=old), now=10)
    assert second.prompt_tokens_per_s == pytest.approx(200)
    assert second.generation_tokens_per_s == pytest.approx(100)
    assert second.prefix_hit_rate == pytest.approx(0.6)
    # p50: rank 50 of 90 in (0.01, 0.1] → 0.01 + 0.09 × 50/90
    assert second.ttft_p50_s == pytest.approx(0.01 + 0.09 * 50 / 90)
    # p95: rank 95, 90 below 0.1, 10 in (0.1, 1] → 0.1 + 0.9 × 5/10
    assert second.ttft_p95_s == pytest.approx(0.55)
    assert second.itl_p95_s == pytest.approx(0.55)


def test_counter_reset_restarts_the_window():
    c = EngineMetricsCollector("http://x/metrics", window_s=10, rate_window_s=10)
    c.parse(metrics_text(prompt=5000, ttft=[0.05] * 50), now=0)
    s = c.parse(metrics_text(prompt=10, ttft=[0.05]), now=10)
    assert s.prompt_tokens_per_s is None and s.ttft_p95_s is None
    s = c.parse(metrics_text(prompt=110, ttft=[0.05] * 3), now=20)
    assert s.prompt_tokens_per_s == pytest.approx(10)


def test_unreachable_engine_is_down_not_an_exception():
    s = EngineMetricsCollector("http://127.0.0.1:9/metrics", timeout_s=0.5).scrape()
    assert s.up is False and s.error


def test_histogram_quantile_edge_cases():
    assert histogram_quantile(0.5, []) is None
    assert histogram_quantile(0.5, [(1.0, 0), (math.inf, 0)]) is None
    # Everything in +Inf: highest finite bound, as Prometheus does.
    assert histogram_quantile(0.99, [(1.0, 0), (math.inf, 10)]) == 1.0
    # First bucket interpolates from 0.
    assert histogram_quantile(0.5, [(2.0, 10), (math.inf, 10)]) == pytest.approx(1.0)


@given(st.lists(st.floats(min_value=0.001, max_value=50), min_size=1, max_size=200),
       st.floats(min_value=0.01, max_value=0.99))
def test_quantile_lies_within_the_bucket_holding_the_rank(values, q):
    bounds = (*BUCKETS, math.inf)
    buckets = [(le, sum(1 for v in values if v <= le)) for le in bounds]
    got = histogram_quantile(q, buckets)
    true = sorted(values)[max(0, math.ceil(q * len(values)) - 1)]
    upper = next(le for le in bounds if true <= le)
    lower = max([0.0] + [le for le in BUCKETS if le < upper])
    assert lower <= got <= (upper if not math.isinf(upper) else BUCKETS[-1])


# --------------------------------------------------------------------------- KV events

STORED_MAP = {"type": "BlockStored", "block_hashes": [1, 2, 3], "parent_block_hash": None,
              "token_ids": list(range(48)), "block_size": 16, "lora_id": None, "medium": "GPU",
              "lora_name": None, "extra_keys": None, "group_idx": 0}
STORED_ARRAY = ["BlockStored", [4, 5], 3, list(range(32)), 16, None, "GPU"]
REMOVED_MAP = {"type": "BlockRemoved", "block_hashes": [2], "medium": "GPU"}
REMOVED_ARRAY = ["BlockRemoved", [5], "GPU"]


@pytest.mark.parametrize("batch_form", ["array", "map"])
def test_decode_every_wire_variant(batch_form):
    events = [STORED_MAP, STORED_ARRAY, REMOVED_MAP, REMOVED_ARRAY,
              {"type": "SomethingNew", "x": 1}, ["FutureEvent", 1], 42]
    batch = ([1.0, events, 0] if batch_form == "array"
             else {"ts": 1.0, "events": events, "data_parallel_rank": 0})
    decoded = decode_events(msgpack.packb(batch))
    state = KVBlockState()
    for e in decoded:
        state.apply(e)
    assert state.blocks == {1, 3, 4}
    assert state.unknown_events == 3
    assert state.digest == 1 ^ 3 ^ 4


def test_all_blocks_cleared_and_other_media():
    state = KVBlockState()
    for e in (STORED_MAP, {**STORED_MAP, "medium": "CPU", "block_hashes": [9, 10]},
              ["AllBlocksCleared"]):
        state.apply(__import__("workers_agent.collectors.kv_events",
                               fromlist=["x"]).normalise_event(e))
    assert state.blocks == set() and state.digest == 0 and state.cleared == 1


def test_bytes_hashes_are_accepted():
    state = KVBlockState()
    state.apply({"type": "BlockStored", "block_hashes": [b"\x01" * 32, "abc"], "medium": None})
    assert len(state.blocks) == 2


@pytest.mark.parametrize("payload", [b"", b"\xc1", msgpack.packb(5), msgpack.packb([1.0])])
def test_undecodable_batches_raise_valueerror(payload):
    with pytest.raises(ValueError):
        decode_events(payload)


@given(st.binary(max_size=200))
def test_random_bytes_never_crash_the_decoder(data):
    try:
        events = decode_events(data)
    except ValueError:
        return
    state = KVBlockState()
    for e in events:
        state.apply(e)


# --------------------------------------------------------------------------- transport

@given(st.integers(min_value=0, max_value=100), st.floats(min_value=0, max_value=1))
def test_backoff_is_full_jitter_and_capped(attempt, r):
    d = backoff_delay(attempt, base=0.5, cap=60, rng=lambda: r)
    assert 0 <= d <= min(60, 0.5 * 2 ** attempt)
    assert d == pytest.approx(r * min(60, 0.5 * 2 ** min(attempt, 32)))


def test_backoff_spreads_reconnects():
    import random

    rng = random.Random(1)
    delays = [backoff_delay(5, 0.5, 60, rng.random) for _ in range(200)]
    assert max(delays) <= 16 and min(delays) < 2 and len({round(d, 3) for d in delays}) > 150


def test_report_buffer_keeps_newest_and_counts_drops():
    buf = ReportBuffer(3)
    for i in range(5):
        buf.push({"seq": i})
    assert [r["seq"] for r in buf.items] == [2, 3, 4] and buf.dropped == 2
    assert buf.pop()["seq"] == 2


def test_rate_tracker_handles_first_sample_and_reset():
    r = RateTracker()
    assert r.gbps("a", 1000, 0.0) is None
    assert r.gbps("a", 1000 + 125_000_000, 1.0) == pytest.approx(1.0)
    assert r.gbps("a", 10, 2.0) is None


def test_sysfs_links_from_a_fake_tree(tmp_path):
    eth = tmp_path / "class/net/eth0"
    (eth / "statistics").mkdir(parents=True)
    (eth / "speed").write_text("100000\n")
    for name, value in (("tx_bytes", 0), ("rx_bytes", 0), ("rx_errors", 3), ("tx_errors", 0),
                        ("rx_dropped", 1), ("tx_dropped", 0)):
        (eth / "statistics" / name).write_text(f"{value}\n")
    (tmp_path / "class/net/lo").mkdir(parents=True)
    port = tmp_path / "class/infiniband/mlx5_0/ports/1"
    (port / "counters").mkdir(parents=True)
    (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
    (port / "link_layer").write_text("InfiniBand\n")
    (port / "counters/port_xmit_data").write_text("0\n")
    (port / "counters/port_rcv_data").write_text("0\n")
    c = SysfsLinkCollector(str(tmp_path))
    inv = {n["name"]: n for n in c.inventory()}
    assert inv["eth0"]["line_rate_gbps"] == 100 and "lo" not in inv
    assert inv["mlx5_0/1"] == {"name": "mlx5_0/1", "line_rate_gbps": 400.0,
                               "transport": "infiniband", "rdma": True}
    sample = {n["name"]: n for n in c.sample()}
    assert sample["eth0"]["rx_errors"] == 3 and sample["eth0"]["rx_drops"] == 1
