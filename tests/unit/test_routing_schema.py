"""The JSON Schema and the gateway's own validator accept and refuse the same tables."""

import copy

import pytest

from controlplane.routing.schema import validate_table
from gateway import table as gwtable
from gateway.statictable import static_table


def valid():
    t = static_table("m", [{"url": "http://a:1", "role": "prefill", "id": "a"},
                           {"url": "http://b:1", "role": "decode", "id": "b",
                            "kv_events_endpoint": "tcp://b:5557"}])
    t["models"][0]["workers"][0]["kv_paths"] = [
        {"to": "b", "link": "rdma", "bandwidth_gbps": 400.0, "rdma": True, "fabric": "ib"}
    ]
    return t


def broken(mutate):
    t = valid()
    mutate(t)
    return t


INVALID = {
    "schema_version": lambda t: t.update(schema_version=2),
    "version": lambda t: t.update(version=-1),
    "mode": lambda t: t["models"][0].update(mode="magic"),
    "role": lambda t: t["models"][0]["workers"][0].update(role="both-ish"),
    "state": lambda t: t["models"][0]["workers"][0].update(state="drained"),
    "url": lambda t: t["models"][0]["workers"][0].update(url="ftp://x"),
    "weights": lambda t: t["models"][0]["routing"].update(temperature=-1),
    "threshold": lambda t: t["models"][0]["disaggregation"].update(local_prefill_max_tokens=-5),
    "path_target": lambda t: t["models"][0]["workers"][0]["kv_paths"][0].update(to="ghost"),
    "path_link": lambda t: t["models"][0]["workers"][0]["kv_paths"][0].update(link="smoke"),
    "duplicate_worker": lambda t: t["models"][0]["workers"].append(
        copy.deepcopy(t["models"][0]["workers"][0])),
    "duplicate_model": lambda t: t["models"].append(copy.deepcopy(t["models"][0])),
    "events": lambda t: t["models"][0]["workers"][1].update(kv_events={"endpoint": "http://x"}),
    "models_type": lambda t: t.update(models={}),
}


def test_valid_table_passes_both():
    assert validate_table(valid()) == []
    assert gwtable.validate(valid()) == []


@pytest.mark.parametrize("name", sorted(INVALID))
def test_invalid_tables_fail_both(name):
    table = broken(INVALID[name])
    assert validate_table(table), f"schema accepted {name}"
    assert gwtable.validate(table), f"gateway accepted {name}"


def test_non_object_refused():
    assert validate_table([]) and gwtable.validate([])
