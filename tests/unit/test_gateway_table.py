"""The gateway's table store: apply newer valid tables, refuse stale, keep last good on NACK."""

import json

import pytest

from gateway.config import GatewayConfigError, build_config
from gateway.proxy import REMOTE_DECODE_PARAMS, decode_body, prefill_body
from gateway.statictable import parse_worker_flag, static_table, table_from_sim_endpoints
from gateway.table import TableStore


def table(version, url="http://a:1"):
    return static_table("m", [{"url": url, "id": "a"}], version=version)


def test_newer_applies_older_is_stale_same_is_idempotent(tmp_path):
    store = TableStore(tmp_path / "state.json")
    assert store.apply(table(3)).outcome == "ack"
    assert store.version == 3
    again = store.apply(table(3))
    assert (again.outcome, again.http_status) == ("ack", 200)
    stale = store.apply(table(2))
    assert (stale.outcome, stale.http_status, stale.applied_version) == ("stale", 409, 3)
    conflict = store.apply(table(3, url="http://b:1"))  # same number, other content
    assert conflict.outcome == "stale"
    assert store.apply(table(4)).outcome == "ack"
    assert json.loads((tmp_path / "state.json").read_text())["version"] == 4


def test_invalid_table_is_nacked_and_last_good_kept():
    store = TableStore()
    store.apply(table(1))
    bad = table(2)
    bad["models"][0]["workers"][0]["role"] = "wizard"
    result = store.apply(bad)
    assert (result.outcome, result.http_status, result.applied_version) == ("nack", 422, 1)
    assert "role" in result.error
    assert store.current.version == 1 and "role" in store.last_error
    assert result.as_dict() == {"status": "nack", "applied_version": 1, "error": result.error,
                                "reason": "invalid_table", "problems": result.problems}


def test_listeners_see_applied_tables_only():
    store = TableStore()
    seen = []
    store.on_change(lambda t: seen.append(t.version))
    store.apply(table(1))
    store.apply(table(1))
    store.apply({"nonsense": True})
    store.apply(table(2))
    assert seen == [1, 2]


def test_load_file_reports_unreadable(tmp_path):
    store = TableStore()
    assert store.load_file(tmp_path / "missing.json").outcome == "nack"
    (tmp_path / "t.json").write_text(json.dumps(table(5)))
    assert store.load_file(tmp_path / "t.json").outcome == "ack"


def test_prefill_and_decode_bodies_follow_vllm_protocol():
    body = {"model": "m", "messages": [], "stream": True, "stream_options": {"x": 1},
            "min_tokens": 3, "max_tokens": 50}
    pre = prefill_body(body, chat=True)
    assert pre["max_tokens"] == 1 and pre["max_completion_tokens"] == 1
    assert "stream" not in pre and "stream_options" not in pre and "min_tokens" not in pre
    assert pre["kv_transfer_params"] == REMOTE_DECODE_PARAMS
    assert body["stream"] is True and "kv_transfer_params" not in body  # original untouched
    completion = prefill_body({"model": "m", "prompt": "p"}, chat=False)
    assert "max_completion_tokens" not in completion
    params = {"do_remote_prefill": True, "remote_block_ids": [1]}
    dec = decode_body(body, params)
    assert dec["kv_transfer_params"] == params and dec["stream"] is True
    assert "kv_transfer_params" not in decode_body(dec, None)


def test_static_tables_and_worker_flags():
    assert parse_worker_flag("http://a:1=prefill") == {"url": "http://a:1", "role": "prefill"}
    assert parse_worker_flag("http://a:1/")["role"] == "both"
    with pytest.raises(ValueError):
        parse_worker_flag("http://a:1=chef")
    with pytest.raises(ValueError):
        parse_worker_flag("a:1")
    t = static_table("m", [{"url": "http://a:1", "role": "prefill"},
                           {"url": "http://b:1", "role": "decode"}])
    assert t["models"][0]["mode"] == "conditional"
    endpoints = {"engines": [
        {"id": "e0", "node": "n1", "model": "m", "api_url": "http://127.0.0.1:1",
         "kv_events_endpoint": "tcp://127.0.0.1:2", "kv_replay_endpoint": "tcp://127.0.0.1:3"},
        {"id": "e1", "node": "n2", "model": "m", "api_url": "http://127.0.0.1:4",
         "kv_events_endpoint": "", "kv_replay_endpoint": ""},
    ]}
    sim = table_from_sim_endpoints(endpoints, roles={"e0": "prefill"})
    workers = sim["models"][0]["workers"]
    assert workers[0]["kv_events"]["endpoint"] == "tcp://127.0.0.1:2"
    assert workers[1]["kv_events"] is None and workers[0]["role"] == "prefill"


def test_config_layers_and_checks(tmp_path):
    cfg = build_config({"port": 9000, "admin_secret": "a"}, {"port": 9001}, env={})
    assert cfg.port == 9001 and cfg.admin_secrets == ["a"]
    secret_file = tmp_path / "s"
    secret_file.write_text("from-file\n")
    cfg = build_config({"admin_secret_file": str(secret_file)}, {},
                       env={"PDPLANE_GATEWAY_SECRET": "from-env"})
    assert cfg.admin_secrets == ["from-env", "from-file"]
    with pytest.raises(GatewayConfigError, match="unknown"):
        build_config({"prot": 1}, env={})
    with pytest.raises(GatewayConfigError, match="cluster"):
        build_config({"control_plane_url": "http://cp"}, env={})
    with pytest.raises(GatewayConfigError, match="secret"):
        build_config({"control_plane_url": "http://cp", "cluster": "c",
                      "gateway_name": "g"}, env={})
    with pytest.raises(GatewayConfigError, match="approx_ttl_s"):
        build_config({"approx_ttl_s": 0}, env={})


def test_cli_refuses_model_without_workers(capsys):
    from gateway.cli import main

    assert main(["--model", "m"]) == 2
    assert "--worker" in capsys.readouterr().err
    assert main(["--worker", "ftp://x", "--model", "m"]) == 2
