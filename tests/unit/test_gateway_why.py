"""Every answer says why it went where it did (X-Pdplane-Route), a sampled decision log at
/admin/decisions, and the avoidable-prefill counter."""

from __future__ import annotations

import asyncio
import time

from gateway import explain, signing
from gateway.router import RoutePlan, Scored
from gateway.statictable import static_table
from gateway.table import parse

from .gateway_stub import MODEL, StubEngine, start_gateway, table_for

SECRET = "k"
LONG = "the cache of the model is long and the prefill is slow " * 40


def header_fields(value: str) -> dict[str, str]:
    return dict(part.strip().split("=", 1) for part in value.split(";"))


def test_rules_from_plans():
    s = [Scored("a", 10, 5, 5, 0), Scored("b", 10.5, 5, 5.5, 0)]
    assert explain.rule_of(RoutePlan("a", None, "kv_aware", 0, s)) == "cost"
    assert explain.rule_of(RoutePlan("b", None, "kv_aware", 0, s)) == "balance"
    assert explain.rule_of(RoutePlan("b", None, "kv_aware", 0, s), temperature=0.5) == "cost"
    assert explain.rule_of(RoutePlan("a", None, "kv_prefix", 64, s)) == "affinity"
    assert explain.rule_of(RoutePlan("a", None, "pd_local_prefill")) == "local_prefill"
    assert explain.rule_of(RoutePlan("a", "p", "pd_remote_prefill")) == "cost"
    assert explain.rule_of(RoutePlan("a", None, "pd_no_prefill_worker")) == "fallback"
    assert explain.rule_of(RoutePlan("a", None, "kv_aware", 0, s), retried=True) == "fallback"


def test_avoidable_prefill_counts_only_eligible_longer_holders():
    model = parse(static_table(MODEL, [
        {"url": "http://a:1", "id": "a"}, {"url": "http://b:1", "id": "b"},
        {"url": "http://c:1", "id": "c", "state": "draining"},
        {"url": "http://p:1", "id": "p", "role": "prefill"}])).models[MODEL]
    plan = RoutePlan("b", None, "kv_aware", 100)
    assert explain.avoidable_prefill(plan, model, {"a": 600, "b": 100, "c": 900}, 1000) == \
        (500, "a")  # c is draining: not a choice
    assert explain.avoidable_prefill(plan, model, {"p": 900, "b": 100}, 1000) == (0, None)
    remote = RoutePlan("b", "p", "pd_remote_prefill", 0)
    assert explain.avoidable_prefill(remote, model, {"p": 0, "a": 300}, 1000) == (300, "a")
    assert explain.avoidable_prefill(remote, model, {"p": 400, "a": 300}, 1000) == (0, None)


def test_header_log_and_avoidable_counter_over_http():
    asyncio.run(_scenario())


async def _scenario():
    a, b = await StubEngine("a").start(), await StubEngine("b").start()
    gateway, client = await start_gateway(table_for([(a, "both"), (b, "both")]),
                                          admin_secrets=[SECRET], decision_log_sample=1.0)
    try:
        r = await client.post("/v1/completions", json={"model": MODEL, "prompt": LONG + "one",
                                                       "max_tokens": 2})
        first = header_fields(r.headers[explain.ROUTE_HEADER])
        assert r.status == 200 and first["rule"] in ("cost", "balance")
        holder = first["worker"]
        assert r.headers["X-Pdplane-Worker"] == holder and first["cached"] == "0"

        r = await client.post("/v1/completions", json={"model": MODEL, "prompt": LONG + "two",
                                                       "max_tokens": 2, "stream": True})
        again = header_fields(r.headers[explain.ROUTE_HEADER])
        await r.read()
        assert again["rule"] == "affinity" and again["worker"] == holder
        assert int(again["cached"]) > 0

        # The holder is busy (many requests in flight there): the next one goes elsewhere
        # and its prefill there is avoidable — the holder had the prefix.
        load = gateway.loads[holder]
        load.in_flight, load.decode_blocks = 200, 100_000.0
        r = await client.post("/v1/completions", json={"model": MODEL, "prompt": LONG + "six",
                                                       "max_tokens": 2})
        moved = header_fields(r.headers[explain.ROUTE_HEADER])
        assert moved["worker"] != holder and moved["rule"] == "cost"
        metrics = await (await client.get("/metrics")).text()
        line = next(x for x in metrics.splitlines()
                    if x.startswith("pdplane_gateway_avoidable_prefill_tokens_total"))
        assert float(line.rsplit(" ", 1)[1]) > 0
        assert 'pdplane_gateway_route_rules_total{model="m",rule="affinity"} 1.0' in metrics

        path = "/admin/decisions"
        r = await client.get(path, headers=signing.signed_headers(SECRET, "GET", path, b"",
                                                                 now=time.time()))
        log = await r.json()
        assert r.status == 200 and log["requests_seen"] == 3 and len(log["decisions"]) == 3
        newest = log["decisions"][0]
        assert newest["avoidable_prefill_tokens"] > 0 and newest["longer_prefix_on"] == holder
        assert newest["candidates"] and newest["rule"] == "cost"
        assert newest["prefix_holders"] == 0  # by cost: no holder followed
        followed = log["decisions"][1]
        assert followed["rule"] == "affinity" and followed["prefix_holders"] == 1
        assert (await client.get(path)).status == 401
    finally:
        await client.close()
        await a.close()
        await b.close()
