"""Hostile routing-table pushes against a real gateway process.

Every push that is not a valid, newer table for the gateway's cluster is refused with a
4xx (never a 5xx), the gateway keeps the table it had, and it still takes a good one
afterwards. Generated mutations also compare the gateway's verdict with the control
plane's schema check (controlplane/routing/schema.py): the gateway takes exactly what the
control plane would publish.
"""

from __future__ import annotations

import copy
import json
import time
import urllib.request

import pytest
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from controlplane.routing.builder import build_table
from controlplane.routing.schema import validate_table
from tests.conftest import WAIT_S
from tests.integration.gateway.conftest import GatewayProcess, write_json
from tests.unit.test_hardening_defects import _snapshot

pytestmark = [pytest.mark.integration]


def good_table(version: int, cluster: str = "c1") -> dict:
    snapshot = _snapshot({"routing_block_size": 0})
    snapshot["cluster"] = cluster
    table = build_table(snapshot)
    table["version"] = version
    assert validate_table(table) == []
    return table


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gw")
    gw = GatewayProcess(tmp, "--table", write_json(tmp / "t.json", good_table(1)))
    gw.start()
    yield gw
    gw.stop()


def raw_put(gw, body: bytes, secret: str | None = None) -> int:
    from gateway.signing import signed_headers

    headers = {"Content-Type": "application/json",
               **signed_headers(secret or gw.secret, "PUT", "/admin/routing-table", body,
                                now=time.time())}
    req = urllib.request.Request(gw.url + "/admin/routing-table", data=body, headers=headers,
                                 method="PUT")
    try:
        with urllib.request.urlopen(req, timeout=WAIT_S) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def with_(table: dict, path: str, value):
    out = copy.deepcopy(table)
    node = out
    keys = path.split("/")
    for key in keys[:-1]:
        node = node[int(key)] if isinstance(node, list) else node[key]
    last = keys[-1]
    node[int(last) if isinstance(node, list) else last] = value
    return out


def hostile_tables() -> list[tuple[str, dict]]:
    t = good_table(50)
    worker = "models/0/workers/0"
    dup = copy.deepcopy(t)
    dup["models"][0]["workers"].append(copy.deepcopy(dup["models"][0]["workers"][0]))
    return [
        ("version as a string", with_(t, "version", "50")),
        ("negative version", with_(t, "version", -1)),
        ("models not a list", with_(t, "models", {"m": 1})),
        ("block size negative", with_(t, "models/0/routing/block_size", -5)),
        ("block size a string", with_(t, "models/0/routing/block_size", "16")),
        ("local prefill negative", with_(t, "models/0/disaggregation/local_prefill_max_tokens",
                                         -1)),
        ("weight negative", with_(t, "models/0/routing/load_weight", -1.0)),
        ("unknown mode", with_(t, "models/0/mode", "chaos")),
        ("url not http", with_(t, f"{worker}/url", "file:///etc/passwd")),
        ("role unknown", with_(t, f"{worker}/role", "boss")),
        ("state unknown", with_(t, f"{worker}/state", "gone")),
        ("capacity a list", with_(t, f"{worker}/capacity", [1, 2])),
        ("duplicate worker ids", dup),
        ("schema version 2", with_(t, "schema_version", 2)),
        ("wrong cluster", good_table(51, cluster="other-cluster")),
        ("stale version", good_table(1) | {"models": []}),
        ("empty object", {}),
        ("a list", [t]),
    ]


@pytest.mark.parametrize("case", range(len(hostile_tables())),
                         ids=[name for name, _ in hostile_tables()])
def test_hostile_table_is_refused_and_the_old_one_kept(gateway, case):
    _name, table = hostile_tables()[case]
    status, body = gateway.put_table(table)
    assert 400 <= status < 500, (status, body)
    assert gateway.wait_health()["table_version"] in (1, 2)  # untouched (2: the good push)


@pytest.mark.parametrize("body", [b"{not json", b"[" * 100_000 + b"]" * 100_000,
                                  json.dumps({"a": "x" * (12 * 2**20)}).encode()],
                         ids=["not json", "deep nesting", "huge body"])
def test_garbage_bodies_are_refused(gateway, body):
    assert 400 <= raw_put(gateway, body) < 500


def test_unsigned_or_badly_signed_push_is_401(gateway):
    body = json.dumps(good_table(60)).encode()
    assert raw_put(gateway, body, secret="not-the-secret") == 401
    req = urllib.request.Request(gateway.url + "/admin/routing-table", data=body, method="PUT",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=WAIT_S)
    assert exc.value.code == 401


def test_a_good_table_still_applies_after_the_hostile_ones(gateway):
    status, body = gateway.put_table(good_table(2))
    assert (status, body["status"]) == (200, "ack")
    assert gateway.wait_health(version=2)["table_version"] == 2


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False,
                                                                           allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=8)
PATHS = ["models/0/name", "models/0/mode", "models/0/kv_block_size", "models/0/routing",
         "models/0/routing/block_size", "models/0/routing/temperature",
         "models/0/routing/kv_overlap_weight", "models/0/disaggregation",
         "models/0/disaggregation/local_prefill_max_tokens", "models/0/workers",
         "models/0/workers/0/url", "models/0/workers/0/role", "models/0/workers/0/state",
         "models/0/workers/0/capacity", "models/0/workers/0/capacity/tp_size",
         "models/0/workers/0/kv_paths", "models/0/workers/0/kv_events", "cluster"]


# (Found the gateway taking capacity.tp_size of any type; fixed in 76a41d4.)
@hsettings(max_examples=40, deadline=None, derandomize=True, phases=[Phase.generate],
           suppress_health_check=list(HealthCheck))
@given(path=st.sampled_from(PATHS), value=json_values)
def test_gateway_takes_exactly_what_the_schema_allows(gateway, path, value):
    current = gateway.wait_health()["table_version"]
    table = with_(good_table(current + 1), path, value)
    status, body = gateway.put_table(table)
    assert status < 500, (status, body)
    # What the control plane would publish to this gateway: schema-valid, for its cluster.
    publishable = validate_table(table) == [] and table["cluster"] == "c1"
    assert (status == 200) == publishable, (path, value, status, body, validate_table(table))
