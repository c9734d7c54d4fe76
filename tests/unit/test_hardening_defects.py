"""Regression tests for the pure parts of issue 20's defects (1, 3, 5, 7).

Each test names its defect; each failed before its fix.
"""

from __future__ import annotations

import ipaddress

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.alerts.ssrf import is_public
from controlplane.policies.effective import PolicyError, merge_policy
from controlplane.routing.builder import build_table
from controlplane.routing.schema import validate_table
from workers_agent import protocol as proto

# --------------------------------------------------------------------------- defect 1


@pytest.mark.parametrize("layer,field", [
    ({"routing_block_size": -5}, "routing_block_size"),
    ({"routing_block_size": -1}, "routing_block_size"),
    ({"local_prefill_max_tokens": -1}, "local_prefill_max_tokens"),
    ({"min_prefill_workers": -1}, "min_prefill_workers"),
    ({"min_decode_workers": -2, "max_decode_workers": -1}, "max_decode_workers"),
    ({"ttft_p95_ms": float("nan")}, "ttft_p95_ms"),
    ({"kv_overlap_weight": float("inf")}, "kv_overlap_weight"),
    ({"load_weight": -1.0}, "load_weight"),
])
def test_defect1_policy_values_that_would_break_the_table_are_refused(layer, field):
    with pytest.raises(PolicyError) as exc:
        merge_policy(layer)
    assert field in exc.value.errors


def _snapshot(policy: dict) -> dict:
    return {"cluster": "c1", "fabrics": {}, "nodes": {"n1": {"nics": []}}, "models": [{
        "name": "m", "kv_block_size": 16, "kv_bytes_per_token": 1024, "weight_bytes": 10**9,
        "max_model_len": 4096, "policy": policy,
        "workers": [{"name": "e0", "node": "n1", "url": "http://10.0.0.1:8000",
                     "metrics_url": "", "engine": "vllm", "tp_size": 1,
                     "desired_role": "both", "observed_role": "both", "state": "active",
                     "kv_events_endpoint": "", "kv_replay_endpoint": "",
                     "gpus": [{"index": 0, "memory_bytes": 80 * 2**30, "nvlink_group": None,
                               "nvlink_bandwidth_gbs": 0, "pcie_gbs": 32}]}]}]}


@given(block=st.integers(min_value=0, max_value=4096),
       local=st.integers(min_value=0, max_value=10**6))
def test_defect1_every_policy_validate_policy_accepts_builds_a_valid_table(block, local):
    policy, _ = merge_policy({"routing_block_size": block, "local_prefill_max_tokens": local})
    table = build_table(_snapshot(policy.as_dict()))
    table["version"] = 1
    assert validate_table(table) == []


# --------------------------------------------------------------------------- defect 3

def test_defect3_protocol_string_limits_fit_the_database_columns():
    import django

    django.setup()
    from controlplane.topology.models import GPU, NIC, Node, Worker

    def column(model, name):
        return model._meta.get_field(name).max_length

    assert column(GPU, "uuid") >= proto.MAX_ID_LEN  # hello: inventory.gpus[].uuid
    assert column(GPU, "product_name") >= proto.MAX_ID_LEN  # inventory.gpus[].name
    assert column(Worker, "name") >= proto.MAX_ID_LEN  # inventory.engines[].id
    assert column(NIC, "name") >= proto.MAX_NIC_NAME_LEN
    assert column(Node, "hostname") >= proto.MAX_HOSTNAME_LEN
    for key in ("api_url", "metrics_url", "kv_events_endpoint", "kv_replay_endpoint"):
        assert column(Worker, key) >= proto.MAX_URL_LEN


# --------------------------------------------------------------------------- defect 5

def _valid_report() -> dict:
    return {"type": "report", "seq": 1, "ts": 1.0,
            "gpus": [{"index": 0, "utilization": 0.5}],
            "nics": [{"name": "eth0", "tx_gbps": 1.0}],
            "engines": [{"id": "e0", "running": 1}],
            "agent": {"buffered": 0}}


def test_defect5_frame_limit_counts_utf8_bytes_not_characters():
    # 100,000 three-byte characters: 100 k characters, 300 KB on the wire.
    text = orjson.dumps(_valid_report() | {"pad": "€" * 100_000}).decode()
    assert len(text) < proto.MAX_FRAME_BYTES < len(text.encode())
    assert proto.frame_too_large(text)
    assert proto.frame_too_large(text.encode())
    small = orjson.dumps(_valid_report()).decode()
    assert not proto.frame_too_large(small) and not proto.frame_too_large(small.encode())
    edge = "a" * proto.MAX_FRAME_BYTES
    assert not proto.frame_too_large(edge) and proto.frame_too_large(edge + "a")


def test_defect5_unknown_fields_in_gpus_nics_agent_are_dropped_before_storing():
    from controlplane.telemetry.ingest import NodeContext, build_states

    msg = _valid_report()
    msg["gpus"][0]["evil"] = "x" * 1000
    msg["nics"][0]["__proto__"] = {"a": 1}
    msg["agent"]["secret"] = "y"
    assert proto.validate_report(msg, proto.Inventory(frozenset({0}), frozenset({"e0"}),
                                                      frozenset({"eth0"}))) == []
    node, _workers = build_states(NodeContext(1, 1, "n", 1, 2.0, {"e0": 7}), msg, 5.0)
    assert node["gpus"] == [{"index": 0, "utilization": 0.5}]
    assert node["nics"] == [{"name": "eth0", "tx_gbps": 1.0}]
    assert node["agent"] == {"buffered": 0}


# --------------------------------------------------------------------------- defect 7

@pytest.mark.parametrize("text", [
    "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
    "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254 (cloud metadata)
    "64:ff9b::c0a8:101",  # NAT64 of 192.168.1.1
    "64:ff9b:1::a00:1",  # local-use NAT64 prefix
    "2002:7f00:1::",  # 6to4 of 127.0.0.1
    "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
    "2002:a00:1::",  # 6to4 of 10.0.0.1
    "::ffff:127.0.0.1",  # IPv4-mapped
    "::ffff:169.254.169.254",
    "::127.0.0.1",  # IPv4-compatible (deprecated form)
    "::10.0.0.1",
    "2001:0:4136:e378:8000:63bf:f5ff:fffe",  # Teredo, client 10.0.0.1 (obfuscated)
    "::", "::1", "fe80::1", "fc00::1", "ff02::1",
])
def test_defect7_embedded_private_ipv4_forms_are_refused(text):
    assert not is_public(ipaddress.ip_address(text))


@pytest.mark.parametrize("text", ["8.8.8.8", "2606:4700:4700::1111", "64:ff9b::808:808",
                                  "::ffff:8.8.8.8"])
def test_defect7_public_addresses_and_their_translations_pass(text):
    assert is_public(ipaddress.ip_address(text))
