"""The table builder is pure and deterministic; roles, states and topology shape the table."""

import copy
import json

from controlplane.routing.builder import build_table, canonical_json, content_sha
from controlplane.routing.diff import diff_tables, summarize
from controlplane.routing.schema import validate_table

GB = 1000**3


def gpu(index, group=None, nvlink=0.0, pcie=64.0):
    return {"index": index, "memory_bytes": 141 * GB, "nvlink_group": group,
            "nvlink_bandwidth_gbs": nvlink, "pcie_gbs": pcie}


def worker(name, node, role="both", state="active", gpus=None, observed=""):
    return {"name": name, "node": node, "url": f"http://{node}:8000/{name}/",
            "metrics_url": "", "engine": "vllm", "tp_size": 1, "desired_role": role,
            "observed_role": observed, "state": state, "kv_events_endpoint": "",
            "kv_replay_endpoint": "", "gpus": gpus or [gpu(0)]}


def snapshot(workers, mode="auto", fabrics=None, nodes=None):
    return {
        "cluster": "c1",
        "fabrics": fabrics or {},
        "nodes": nodes or {},
        "models": [{
            "name": "m", "kv_block_size": 16, "kv_bytes_per_token": 163840,
            "weight_bytes": 71 * GB, "max_model_len": 8192,
            "policy": {"disaggregation_mode": mode, "kv_overlap_weight": 1.0, "load_weight": 1.0,
                       "routing_temperature": 0.0, "routing_block_size": 0,
                       "local_prefill_max_tokens": 512},
            "workers": workers,
        }],
    }


def test_same_snapshot_gives_identical_bytes_and_hash():
    snap = snapshot([worker("e1", "h2"), worker("e0", "h1")])
    shuffled = copy.deepcopy(snap)
    shuffled["models"][0]["workers"].reverse()
    a, b = build_table(snap), build_table(shuffled)
    assert canonical_json(a) == canonical_json(b)
    assert content_sha(a) == content_sha(b)
    assert [w["id"] for w in a["models"][0]["workers"]] == ["h1/e0", "h2/e1"]


def test_hash_ignores_version_but_not_content():
    table = build_table(snapshot([worker("e0", "h1")]))
    numbered = dict(table, version=7)
    assert content_sha(table) == content_sha(numbered)
    changed = build_table(snapshot([worker("e0", "h1", state="draining")]))
    assert content_sha(changed) != content_sha(table)


def test_built_tables_validate_against_the_schema():
    nodes = {"h1": {"nics": [{"name": "ib0", "line_rate_gbps": 400, "rdma": True,
                              "fabric": "ib"}]},
             "h2": {"nics": [{"name": "ib0", "line_rate_gbps": 200, "rdma": True,
                              "fabric": "ib"}]}}
    fabrics = {"ib": {"transport": "infiniband", "rdma": True, "line_rate_gbps": 400}}
    table = build_table(snapshot(
        [worker("p0", "h1", "prefill"), worker("d0", "h2", "decode"), worker("b0", "h1")],
        fabrics=fabrics, nodes=nodes,
    ))
    assert validate_table(table) == []
    json.dumps(table)  # plain JSON


def test_drained_missing_and_failed_workers_are_left_out():
    table = build_table(snapshot([
        worker("a", "h1"), worker("b", "h1", state="draining"), worker("c", "h1", state="drained"),
        worker("d", "h1", state="missing"), worker("e", "h1", state="failed"),
    ]))
    states = {w["id"]: w["state"] for w in table["models"][0]["workers"]}
    assert states == {"h1/a": "active", "h1/b": "draining"}


def test_mode_follows_policy_and_available_roles():
    agg_only = [worker("a", "h1"), worker("b", "h2")]
    pd = [worker("p", "h1", "prefill"), worker("d", "h2", "decode")]
    assert build_table(snapshot(agg_only))["models"][0]["mode"] == "aggregated"
    assert build_table(snapshot(pd))["models"][0]["mode"] == "conditional"
    assert build_table(snapshot(pd, mode="disaggregated"))["models"][0]["mode"] == "disaggregated"
    assert build_table(snapshot(pd, mode="aggregated"))["models"][0]["mode"] == "aggregated"
    # Disaggregation asked for, but the only prefill worker is draining: aggregated.
    drained = [worker("p", "h1", "prefill", state="draining"), worker("d", "h2", "decode")]
    model = build_table(snapshot(drained, mode="disaggregated"))["models"][0]
    assert model["mode"] == "aggregated"
    assert "no active prefill" in model["mode_reason"]


def test_draining_role_change_records_previous_role():
    table = build_table(snapshot([worker("a", "h1", "decode", "draining", observed="prefill"),
                                  worker("b", "h1", "both", observed="both")]))
    by_id = {w["id"]: w for w in table["models"][0]["workers"]}
    assert by_id["h1/a"]["role"] == "decode"
    assert by_id["h1/a"]["previous_role"] == "prefill"
    assert by_id["h1/b"]["previous_role"] is None


def test_kv_paths_from_topology():
    nodes = {
        "h1": {"nics": [{"name": "ib0", "line_rate_gbps": 400, "rdma": True, "fabric": "ib"},
                        {"name": "eth0", "line_rate_gbps": 100, "rdma": False, "fabric": "eth"}]},
        "h2": {"nics": [{"name": "ib0", "line_rate_gbps": 200, "rdma": True, "fabric": "ib"}]},
        "h3": {"nics": [{"name": "eth0", "line_rate_gbps": 25, "rdma": False, "fabric": "eth"}]},
    }
    fabrics = {"ib": {"transport": "infiniband", "rdma": True, "line_rate_gbps": 400},
               "eth": {"transport": "ethernet", "rdma": False, "line_rate_gbps": 100}}
    workers = [
        worker("p", "h1", "prefill", gpus=[gpu(0, group=0, nvlink=900)]),
        worker("d_nvl", "h1", "decode", gpus=[gpu(1, group=0, nvlink=900)]),
        worker("d_pcie", "h1", "decode", gpus=[gpu(4, group=1, nvlink=900, pcie=32)]),
        worker("d_ib", "h2", "decode"),
        worker("d_eth", "h3", "decode"),
        worker("d_none", "h4", "decode"),
    ]
    table = build_table(snapshot(workers, fabrics=fabrics, nodes=nodes))
    model = table["models"][0]
    prefill = next(w for w in model["workers"] if w["id"] == "h1/p")
    paths = {p["to"]: p for p in prefill["kv_paths"]}
    assert paths["h1/d_nvl"]["link"] == "nvlink" and paths["h1/d_nvl"]["bandwidth_gbps"] == 7200
    assert paths["h1/d_pcie"]["link"] == "pcie" and paths["h1/d_pcie"]["bandwidth_gbps"] == 256
    assert paths["h2/d_ib"] == {"to": "h2/d_ib", "link": "rdma", "bandwidth_gbps": 200.0,
                                "rdma": True, "fabric": "ib"}
    assert paths["h3/d_eth"]["link"] == "tcp" and paths["h3/d_eth"]["bandwidth_gbps"] == 25
    assert "h4/d_none" not in paths  # no shared fabric: no known path
    decode = next(w for w in model["workers"] if w["id"] == "h2/d_ib")
    assert decode["kv_paths"] == []


def test_capacity_estimates_kv_tokens():
    table = build_table(snapshot([worker("a", "h1")]))
    cap = table["models"][0]["workers"][0]["capacity"]
    expected = int((141 * GB * 0.9 - 71 * GB) // 163840)
    assert cap == {"gpus": 1, "tp_size": 1, "gpu_memory_bytes": 141 * GB, "kv_tokens": expected}


def test_routing_block_size_defaults_to_kv_block_size_and_can_be_overridden():
    snap = snapshot([worker("a", "h1")])
    assert build_table(snap)["models"][0]["routing"]["block_size"] == 16
    snap["models"][0]["policy"]["routing_block_size"] = 64
    assert build_table(snap)["models"][0]["routing"]["block_size"] == 64


def test_diff_names_the_changes():
    old = build_table(snapshot([worker("a", "h1"), worker("b", "h1")]))
    new = build_table(snapshot([worker("a", "h1", state="draining"), worker("c", "h2")]))
    changes = diff_tables(old, new)
    kinds = [(c["kind"], c.get("worker"), c.get("field")) for c in changes]
    assert ("worker_removed", "h1/b", None) in kinds
    assert ("worker_added", "h2/c", None) in kinds
    assert ("worker_changed", "h1/a", "state") in kinds
    assert "h1/a state active→draining" in summarize(changes)
    assert diff_tables(old, old) == []
    assert summarize([]) == "no changes"
    assert [c["kind"] for c in diff_tables(None, old)] == ["model_added"]


def test_first_token_deadline_follows_the_shedding_policy():
    snap = snapshot([worker("a", "h1")])
    assert "first_token_deadline_ms" not in build_table(snap)["models"][0]["routing"]
    snap["models"][0]["policy"].update(shed_after_ttft_factor=2.0, ttft_p95_ms=1500.0)
    table = build_table(snap)
    assert table["models"][0]["routing"]["first_token_deadline_ms"] == 3000.0
    assert validate_table(table) == []


def test_affinity_and_balance_weights_come_from_policy():
    from controlplane.policies.effective import DEFAULT_POLICY
    from gateway.table import parse

    snap = snapshot([worker("a", "h1"), worker("b", "h1")])
    # An old snapshot without the fields: none emitted, the gateway's defaults apply.
    assert "affinity_load_factor" not in build_table(snap)["models"][0]["routing"]
    snap["models"][0]["policy"] = {**DEFAULT_POLICY.as_dict(), "affinity_load_factor": 2.0,
                                   "affinity_kv_limit": 0.8, "prefix_min_match": 0.5,
                                   "cache_balance_band": 0.0}
    table = build_table(snap)
    routing = table["models"][0]["routing"]
    assert (routing["affinity_load_factor"], routing["affinity_kv_limit"],
            routing["prefix_min_match"], routing["cache_balance_band"]) == (2.0, 0.8, 0.5, 0.0)
    assert validate_table(table) == []
    model = parse(table).models["m"]
    assert (model.affinity_load_factor, model.affinity_kv_limit, model.prefix_min_match,
            model.cache_balance_band) == (2.0, 0.8, 0.5, 0.0)
    bad = copy.deepcopy(table)
    bad["models"][0]["routing"]["affinity_load_factor"] = -1
    assert validate_table(bad)
