"""Protocol v1 validation (workers_agent/protocol.py): typed errors, never exceptions."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from workers_agent import protocol as proto

INV = proto.Inventory(gpu_indexes=frozenset({0, 1}), engine_ids=frozenset({"e0"}),
                      nic_names=frozenset({"eth0"}))


def hello(**over):
    msg = {
        "type": "hello", "protocol": [1], "agent_version": "0.1.0", "hostname": "n1",
        "inventory": {
            "gpus": [{"index": 0, "uuid": "GPU-a", "name": "H200", "memory_total_bytes": 10},
                     {"index": 1, "uuid": "GPU-b", "name": "H200", "memory_total_bytes": 10}],
            "nics": [{"name": "eth0", "line_rate_gbps": 100, "transport": "ethernet",
                      "rdma": False}],
            "engines": [{"id": "e0", "model": "m", "kind": "vllm", "gpus": [0, 1], "tp": 2,
                         "role": "both", "block_size": 16}],
        },
    }
    msg.update(over)
    return msg


def report(**over):
    msg = {
        "type": "report", "seq": 1, "ts": 1_700_000_000.0,
        "gpus": [{"index": 0, "memory_used_bytes": 5, "memory_total_bytes": 10,
                  "utilization": 0.5, "temperature_c": 60, "power_w": 300}],
        "engines": [{"id": "e0", "up": True, "running": 3, "waiting": 0, "kv_blocks_used": 5,
                     "kv_blocks_total": 10, "kv_usage": 0.5, "prefix_hit_rate": 0.2,
                     "ttft_p95_s": None}],
        "nics": [{"name": "eth0", "tx_gbps": 1.0, "rx_gbps": 2.0, "rx_errors": 0}],
    }
    msg.update(over)
    return msg


def codes(errors):
    return {e.code for e in errors}


def test_valid_hello_and_report_pass():
    assert proto.validate_hello(hello()) == []
    assert proto.validate_report(report(), INV) == []


def test_inventory_from_hello_lists_keys():
    inv = proto.Inventory.from_hello(hello()["inventory"])
    assert inv.gpu_indexes == {0, 1} and inv.engine_ids == {"e0"} and inv.nic_names == {"eth0"}


def test_engine_on_unknown_gpu_in_hello_is_rejected():
    msg = hello()
    msg["inventory"]["engines"][0]["gpus"] = [0, 7]
    assert codes(proto.validate_hello(msg)) == {proto.ErrorCode.UNKNOWN_GPU}


def test_duplicate_gpu_index_in_hello():
    msg = hello()
    msg["inventory"]["gpus"][1]["index"] = 0
    assert proto.ErrorCode.BAD_SCHEMA in codes(proto.validate_hello(msg))


def test_nan_negative_and_fraction_over_one_are_out_of_range():
    for field, value in (("utilization", math.nan), ("utilization", 1.5),
                         ("power_w", -1), ("temperature_c", math.inf)):
        msg = report()
        msg["gpus"][0][field] = value
        errors = proto.validate_report(msg, INV)
        assert codes(errors) == {proto.ErrorCode.OUT_OF_RANGE}, (field, value)
        assert errors[0].path == f"report.gpus[0].{field}"


def test_kv_fraction_over_one_and_used_over_total():
    msg = report()
    msg["engines"][0]["kv_usage"] = 1.01
    assert codes(proto.validate_report(msg, INV)) == {proto.ErrorCode.OUT_OF_RANGE}
    msg = report()
    msg["engines"][0]["kv_blocks_used"] = 11
    assert codes(proto.validate_report(msg, INV)) == {proto.ErrorCode.OUT_OF_RANGE}


def test_unknown_gpu_engine_and_nic_against_inventory():
    msg = report()
    msg["gpus"][0]["index"] = 5
    msg["engines"][0]["id"] = "other"
    msg["nics"][0]["name"] = "eth9"
    assert codes(proto.validate_report(msg, INV)) == {
        proto.ErrorCode.UNKNOWN_GPU, proto.ErrorCode.UNKNOWN_ENGINE, proto.ErrorCode.UNKNOWN_NIC}


def test_booleans_are_not_numbers_and_strings_are_not_numbers():
    msg = report()
    msg["engines"][0]["running"] = True
    msg["gpus"][0]["power_w"] = "300"
    assert codes(proto.validate_report(msg, INV)) == {proto.ErrorCode.BAD_SCHEMA}


def test_missing_seq_and_wrong_shapes():
    msg = report()
    del msg["seq"]
    msg["gpus"] = "nope"
    errs = proto.validate_report(msg, INV)
    assert {e.path for e in errs} == {"report.seq", "report.gpus"}


def test_too_many_items_is_out_of_range():
    msg = report(gpus=[{"index": 0}] * (proto.MAX_GPUS + 1))
    assert codes(proto.validate_report(msg, INV)) == {proto.ErrorCode.OUT_OF_RANGE}


def test_version_negotiation():
    assert proto.negotiate_version([1, 2]) == 1
    assert proto.negotiate_version([2, 3]) is None


def test_error_frame_shape():
    err = proto.ProtocolError("out_of_range", "must be ≤ 1", "report.gpus[0].utilization")
    assert err.frame(7) == {"type": "error", "code": "out_of_range", "reason": "must be ≤ 1",
                            "path": "report.gpus[0].utilization", "ref": 7}


def test_token_bucket_limits_rate_and_refills():
    bucket = proto.TokenBucket(rate=5, burst=10, now=0.0)
    assert sum(bucket.take(0.0) for _ in range(20)) == 10
    assert bucket.take(0.1) is False  # 0.5 token
    assert bucket.take(0.2) is True  # 1 token after 0.2 s
    assert sum(bucket.take(100.0) for _ in range(20)) == 10  # capped at the burst


def test_command_validation_refuses_unknown_commands():
    ok = {"type": "command", "id": "x", "command": "set_role", "args": {"engine": "e0"}}
    assert proto.validate_command(ok) == []
    bad = dict(ok, command="format_disk")
    assert codes(proto.validate_command(bad)) == {proto.ErrorCode.UNKNOWN_COMMAND}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner,
                                                                 max_size=5),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_json_value_gives_errors_not_exceptions(value):
    for check in (proto.validate_hello, proto.validate_command_result, proto.validate_command,
                  proto.validate_welcome, proto.validate_inventory_message):
        assert isinstance(check(value), list)
    assert isinstance(proto.validate_report(value, INV), list)


gpu_field = st.sampled_from(["utilization", "memory_used_bytes", "power_w", "temperature_c",
                             "nvlink_tx_gbps"])
engine_field = st.sampled_from(["running", "waiting", "kv_usage", "prefix_hit_rate",
                                "ttft_p95_s", "kv_blocks_total", "prompt_tokens_per_s"])
any_scalar = (st.floats(allow_nan=True, allow_infinity=True) | st.integers()
              | st.text(max_size=5) | st.booleans() | st.lists(st.integers(), max_size=2))


@settings(max_examples=300, deadline=None)
@given(gpu_field, engine_field, any_scalar, any_scalar)
def test_mutated_reports_are_valid_only_when_in_range(gfield, efield, gval, eval_):
    msg = report()
    msg["gpus"][0][gfield] = gval
    msg["engines"][0][efield] = eval_
    errors = proto.validate_report(msg, INV)
    for err in errors:
        assert err.code in {proto.ErrorCode.OUT_OF_RANGE, proto.ErrorCode.BAD_SCHEMA}
        assert err.path.startswith("report.")
    if not errors:  # whatever passed must be finite numbers in range
        for v in (msg["gpus"][0][gfield], msg["engines"][0][efield]):
            assert isinstance(v, int | float) and not isinstance(v, bool)
            assert math.isfinite(v) and v >= -50
        if gfield == "utilization":
            assert 0 <= msg["gpus"][0][gfield] <= 1
        if efield in ("kv_usage", "prefix_hit_rate"):
            assert 0 <= msg["engines"][0][efield] <= 1
