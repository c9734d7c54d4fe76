"""Pure parts of the simulated engine server: fleet config, KV paths, request parsing."""

from __future__ import annotations

import pytest

from workers_agent.sim.fleetconfig import (
    FleetConfigError,
    endpoints_document,
    parse_fleet_config,
    resolve_ports,
)
from workers_agent.sim.metrics import NIXL_BYTES_BUCKETS, build_1_2_5_buckets
from workers_agent.sim.server.pd import EngineLocation, NicInfo, kv_path, nvlink_group_of
from workers_agent.sim.server.protocol import ApiError, parse_chat, parse_completion

BASE = {
    "nodes": [{"hostname": "a", "gpu": "H200", "gpu_count": 8, "nvlink_group_size": 4,
               "nics": [{"name": "ib0", "line_rate_gbps": 400, "transport": "infiniband"}]}],
    "engines": [{"id": "e0", "node": "a", "model": "llama-3.1-8b", "gpus": [0, 1]}],
}


def with_engine(**changes):
    engine = {**BASE["engines"][0], **changes}
    return {**BASE, "engines": [engine]}


def test_valid_config_defaults_and_ports():
    config = parse_fleet_config(BASE)
    engine = config.engines[0]
    assert engine.tp == 2 and engine.role == "both" and engine.model_name == "llama-3.1-8b"
    assert config.nodes[0].nics[0].rdma is True  # infiniband defaults to RDMA
    resolved = resolve_ports(config)
    ports = [resolved.nodes[0].telemetry_port, resolved.engines[0].http_port,
             resolved.engines[0].kv_events_port, resolved.engines[0].kv_replay_port]
    assert all(ports) and len(set(ports)) == 4
    doc = endpoints_document(resolved)
    assert doc["engines"][0]["kv_events_endpoint"] == f"tcp://127.0.0.1:{ports[2]}"
    assert parse_fleet_config(resolved.to_dict()) == resolved


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "JSON object"),
        ({"nodes": []}, "non-empty"),
        (with_engine(node="b"), "unknown node"),
        (with_engine(gpus=[0, 8]), "below 8"),
        (with_engine(gpus=[0, 0]), "distinct"),
        (with_engine(tp=4), "tp=4"),
        (with_engine(role="boss"), "role"),
        (with_engine(http_port=70000), "TCP port"),
        (with_engine(num_gpu_blocks=0), "positive"),
        (with_engine(gpus="0"), "list of GPU indices"),
        ({**BASE, "time_scale": 0}, "time_scale"),
        ({**BASE, "engines": BASE["engines"] * 2}, "unique"),
    ],
)
def test_invalid_configs_name_the_problem(data, message):
    with pytest.raises(FleetConfigError, match=message):
        parse_fleet_config(data)


def loc(node, engine, gpus, group, nics=()):
    return EngineLocation(node, engine, tuple(gpus), group, tuple(nics))


def test_kv_path_classification():
    ib = NicInfo("ib0", 400, "infiniband", True)
    tcp = NicInfo("eth0", 100, "ethernet", False)
    a0 = loc("a", "e0", [0], 0, [ib])
    assert kv_path(a0, a0).kind == "local"
    assert kv_path(a0, loc("a", "e1", [1], 0, [ib])).kind == "nvlink"
    assert kv_path(a0, loc("a", "e2", [4], 1, [ib])).kind == "pcie"
    assert kv_path(a0, loc("a", "e3", [5], None, [ib])).kind == "pcie"
    net = kv_path(a0, loc("b", "e0", [0], 0, [tcp]))
    assert (net.kind, net.gbps, net.rdma, net.src_nic, net.dst_nic) == (
        "network", 100, False, "ib0", "eth0")
    assert kv_path(a0, loc("b", "e0", [0], 0, [ib])).rdma is True
    assert nvlink_group_of((0, 1, 2, 3), 4) == 0
    assert nvlink_group_of((3, 4), 4) is None
    assert nvlink_group_of((0,), 0) is None
    assert EngineLocation.from_dict(a0.to_dict()) == a0
    with pytest.raises(ValueError, match="malformed"):
        EngineLocation.from_dict({"node": "a"})


def test_vllm_token_buckets():
    assert build_1_2_5_buckets(100) == [1, 2, 5, 10, 20, 50, 100]
    assert NIXL_BYTES_BUCKETS[0] == 2048 and NIXL_BYTES_BUCKETS[-1] == 2**33


def encode(text):
    return [len(word) for word in text.split()]


def test_request_parsing():
    req = parse_completion({"prompt": "a bb ccc"}, served_model="m", encode=encode)
    assert req.prompt_token_ids == [1, 2, 3] and req.max_tokens == 16 and not req.stream
    req = parse_completion({"model": "m", "prompt": [[5, 6]], "max_tokens": 3, "stream": True,
                            "stream_options": {"include_usage": True}},
                           served_model="m", encode=encode)
    assert req.prompt_token_ids == [5, 6] and req.include_usage
    chat = parse_chat({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}],
                       "max_completion_tokens": 7}, served_model="m",
                      encode_chat=lambda msgs: [1] * len(msgs))
    assert chat.max_tokens == 7 and chat.kind == "chat"
    for body, status in [
        ({"prompt": ""}, 400), ({"prompt": ["a", "b"]}, 400), ({"prompt": "a", "n": 2}, 400),
        ({"prompt": "a", "max_tokens": True}, 400), ({"prompt": "a", "model": "x"}, 404),
        ({"prompt": "a", "kv_transfer_params": {"do_remote_decode": True,
                                                "do_remote_prefill": True}}, 400),
    ]:
        with pytest.raises(ApiError) as err:
            parse_completion(body, served_model="m", encode=encode)
        assert err.value.status == status
        assert err.value.body()["error"]["message"]
