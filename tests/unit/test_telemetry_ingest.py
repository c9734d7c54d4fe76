"""Pure parts of ingest: hot-state shapes, Redis commands, liveness classification."""

import orjson

from controlplane.telemetry.hotstate import HISTORY_POINTS, Keys
from controlplane.telemetry.ingest import (
    WRITE_REPORT_LUA,
    NodeContext,
    build_states,
    index_commands,
    node_history_point,
    report_commands,
)
from controlplane.telemetry.liveness import classify

CTX = NodeContext(node_id=7, cluster_id=2, hostname="n7", gen=3, interval_s=2.0,
                  workers={"e0": 11, "e1": None})
REPORT = {
    "type": "report", "seq": 5, "ts": 100.0,
    "gpus": [{"index": 0, "utilization": 0.5, "memory_used_bytes": 10, "power_w": 100},
             {"index": 1, "utilization": 1.0, "memory_used_bytes": 30, "power_w": None}],
    "nics": [{"name": "a", "tx_gbps": 1.0, "rx_gbps": None},
             {"name": "b", "tx_gbps": 2.0, "rx_gbps": 4.0}],
    "engines": [{"id": "e0", "running": 3, "kv_usage": 0.25, "role": "decode"},
                {"id": "e1", "running": 1}],
}


def test_states_split_matched_and_unmatched_engines():
    node, workers = build_states(CTX, REPORT, now=200.0)
    assert set(workers) == {11}
    w = workers[11]
    assert (w["running"], w["kv_usage"], w["role"], w["node_id"]) == (3, 0.25, "decode", 7)
    assert w["received_at"] == w["last_report_at"] == 200.0 and w["ts"] == 100.0
    assert node["engines"] == [{"id": "e0", "worker_id": 11}, {"id": "e1", "worker_id": None}]
    assert node["unmatched_engines"][0]["id"] == "e1"
    assert node["gen"] == 3 and node["interval_s"] == 2.0


def test_node_history_point_aggregates_ignoring_nulls():
    p = node_history_point(REPORT, 1.0)
    assert p == {"t": 1.0, "gpu_utilization": 0.75, "gpu_memory_used_bytes": 40,
                 "power_w": 100, "nic_tx_gbps": 3.0, "nic_rx_gbps": 4.0}


def _script_call(cmd):
    """(keys, argv) of the generation-checked write script (ingest.WRITE_REPORT_LUA)."""
    assert cmd[0] == "EVAL" and cmd[1] == WRITE_REPORT_LUA
    n = cmd[2]
    return list(cmd[3:3 + n]), list(cmd[3 + n:])


def test_report_commands_one_hset_and_history_only_when_due():
    keys = Keys("p:")
    cmds = report_commands(CTX, REPORT, 200.0, keys, lambda key, now: False)
    script_keys, argv = _script_call(cmds[0])
    # Checked against the node's generation counter, then one HSET into the cluster hash
    # and one ZADD for liveness.
    assert script_keys == ["p:gen:7", "p:c:2", "p:seen"]
    gen, now, node, nfields, points = argv[:5]
    assert (gen, now, node, nfields, points) == (3, 200.0, 7, 4, HISTORY_POINTS)
    fields = argv[5:5 + nfields]
    assert fields[0] == "n:7" and fields[2] == "w:11"
    assert orjson.loads(fields[3])["running"] == 3
    assert len(argv) == 5 + nfields  # no history point when not due
    due = report_commands(CTX, REPORT, 200.0, keys, lambda key, now: True)
    script_keys, argv = _script_call(due[0])
    assert script_keys[3:] == ["p:h:n:7", "p:h:w:11"]
    history = argv[5 + argv[3]:]
    assert len(history) == 2 and orjson.loads(history[1])["running"] == 3


def test_index_commands_map_node_and_matched_workers_to_cluster():
    assert index_commands(CTX, Keys("p:")) == [("HSET", "p:idx", "n:7", 2, "w:11", 2)]


def test_liveness_classification():
    assert classify(None, 100, 2, 20) == "unknown"
    assert classify(95, 100, 2, 20) == "online"  # 5 s ≤ 3 × 2 s
    assert classify(93, 100, 2, 20) == "stale"
    assert classify(74, 100, 2, 20) == "stale"  # 26 s = 6 + 20
    assert classify(73, 100, 2, 20) == "offline"


def test_nvlink_groups_from_peers():
    from controlplane.telemetry.reconcile import nvlink_groups

    gpus = [{"index": 0, "nvlink_peers": [1]}, {"index": 1, "nvlink_peers": [0]},
            {"index": 2, "nvlink_peers": [3]}, {"index": 3, "nvlink_peers": [2, 9]},
            {"index": 4, "nvlink_peers": []}, {"index": 5}]
    assert nvlink_groups(gpus) == {0: 0, 1: 0, 2: 2, 3: 2}
