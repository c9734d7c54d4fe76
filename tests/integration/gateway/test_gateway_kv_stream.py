"""The gateway's KV-event stream against simulated engines over real ZMQ: an engine that
restarts (sequence back to 0) has its blocks dropped from the gateway's index, which then
refills from the new engine's events; a stalled stream is reported."""

from __future__ import annotations

import time

import pytest

from gateway.statictable import table_from_sim_endpoints
from tests.conftest import WAIT_S, wait_until

from .conftest import MODEL, post, write_json

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

def tokens_completion(gw, ids, max_tokens=2):
    return post(gw.url + "/v1/completions",
                {"model": MODEL, "prompt": ids, "max_tokens": max_tokens})


def test_engine_restart_empties_and_refills_the_workers_index(
    sim_fleet, gateway_process, tmp_path
):
    fleet = sim_fleet([("a", "both")])
    table = table_from_sim_endpoints(fleet.endpoints)
    gw = gateway_process("--table", write_json(tmp_path / "t.json", table))
    time.sleep(0.5)  # ZMQ slow joiner
    old = list(range(1000, 1000 + 16 * 8))
    assert tokens_completion(gw, old)[0] == 200
    before = wait_until(lambda: (s := gw.admin_table()["kv_streams"].get("a")) and s["blocks"] >= 8
                  and s, what="blocks of the first prompt")
    assert before["restarts"] == 0

    fleet.restart_engine("a")
    new = list(range(5000, 5000 + 16 * 4))
    # The new engine's first batch (seq 0) tells the gateway it restarted. (Retry while the
    # gateway's ZMQ subscription reconnects: requests before that leave no trace.)
    def restarted():
        assert tokens_completion(gw, new)[0] == 200
        s = gw.admin_table()["kv_streams"]["a"]
        return s["restarts"] >= 1 and s

    after = wait_until(restarted, what="restart detected")
    # Only the new engine's blocks: the old prompt's 8 are gone, the new one's 4 are in.
    assert after["blocks"] == 4, after
    _, headers, _ = tokens_completion(gw, old)
    assert "; cached=0;" in headers["X-Pdplane-Route"], headers  # nothing credited any more


def test_stalled_stream_is_reported_and_routed_on_the_approximate_index(
    sim_fleet, gateway_process, tmp_path
):
    fleet = sim_fleet([("a", "both")])
    table = table_from_sim_endpoints(fleet.endpoints)
    # A worker whose kv_events endpoint points at a silent socket: events never come.
    from tests.conftest import free_port

    dead = f"tcp://127.0.0.1:{free_port()}"
    for w in table["models"][0]["workers"]:
        w["kv_events"] = {"endpoint": dead, "replay_endpoint": None}
    gw = gateway_process("--table", write_json(tmp_path / "t.json", table), "--kv-stall", "1")
    assert tokens_completion(gw, list(range(64)))[0] == 200
    wait_until(lambda: gw.admin_table()["kv_streams"]["a"]["stalled"], what="stall")
    import urllib.request

    text = urllib.request.urlopen(gw.url + "/metrics", timeout=WAIT_S).read().decode()
    assert 'pdplane_gateway_kv_stream_stalled{reason="no KV events 1s after work was sent",' \
           'worker="a"} 1.0' in text
    assert tokens_completion(gw, list(range(64)))[0] == 200  # still served
