"""P/D pair health: a decode engine that refuses KV transfers and a prefill engine that dies
cost the client nothing before the first byte; the pairs are marked unhealthy, skipped,
re-probed, and healthy again once the engines recover. Plus the breaker itself."""

from __future__ import annotations

import asyncio
import time

from gateway.engines import HANDSHAKES, handshake_for
from gateway.engines.vllm_nixl import NixlHandshake
from gateway.pairs import PairHealth
from tests.conftest import WAIT_S

from .gateway_stub import MODEL, StubEngine, start_gateway, table_for


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


def test_breaker_opens_cools_down_probes_and_closes():
    clock = Clock()
    h = PairHealth(threshold=1, cooldown_s=5, clock=clock)
    assert h.allows("p", "d")
    h.failed("p", "d", "transfer_refused")
    assert h.state("p", "d") == "unhealthy" and not h.allows("p", "d")
    clock.t = 5.0
    assert h.allows("p", "d") and h.state("p", "d") == "probing"
    assert not h.allows("p", "d")  # one probe at a time
    h.failed("p", "d", "prefill_failed")  # relapse: cooldown doubles
    assert h.pairs["p", "d"].cooldown_s == 10 and not h.allows("p", "d")
    clock.t = 15.0
    assert h.allows("p", "d")
    h.succeeded("p", "d")
    assert h.state("p", "d") == "healthy" and h.allows("p", "d") and h.allows("p", "d")
    assert h.view()[0]["failures"] == 2


def test_the_handshake_is_one_adapter_per_engine():
    assert isinstance(handshake_for("vllm"), NixlHandshake)
    assert handshake_for("unknown-engine") is HANDSHAKES["vllm"]
    hs = handshake_for(None)
    pre = hs.prefill_request({"model": "m", "prompt": "x", "stream": True}, chat=False)
    assert pre["max_tokens"] == 1 and pre["kv_transfer_params"]["do_remote_decode"]
    assert hs.transfer_params({"kv_transfer_params": {"a": 1}}) == {"a": 1}
    assert hs.transfer_params({"kv_transfer_params": "junk"}) is None
    assert hs.is_transfer_refusal(400, b'{"code":"kv_transfer_params_unknown"}')
    assert not hs.is_transfer_refusal(400, b'{"message":"max_tokens too large"}')


def test_refusing_decode_and_dying_prefill_cost_the_client_nothing():
    asyncio.run(_scenario())


async def _scenario():
    p1, p2 = await StubEngine("p1").start(), await StubEngine("p2").start()
    d1, d2 = await StubEngine("d1").start(), await StubEngine("d2").start()
    engines = [(p1, "prefill"), (p2, "prefill"), (d1, "decode"), (d2, "decode")]
    gateway, client = await start_gateway(table_for(engines, mode="disaggregated"),
                                          pd_pair_cooldown_s=0.3)
    d1.refuse_transfers = True  # d1 cannot fetch KV from anyone
    p1.dead = True  # p1 closes every connection

    async def send(i):
        r = await client.post("/v1/completions", json={
            "model": MODEL, "prompt": f"request {i} " * 50, "max_tokens": 2,
            "stream": i % 2 == 0})
        return r.status, await r.read()

    try:
        answers = [await send(i) for i in range(24)]
        assert [s for s, _ in answers] == [200] * 24, [b[:200] for s, b in answers if s != 200]
        pairs = {(p["prefill"], p["decode"]): p for p in gateway.pairs.view()}
        assert pairs["p2", "d1"]["state"] != "healthy"
        assert pairs["p2", "d1"]["last_failure"] == "transfer_refused"
        assert any(k[0] == "p1" and v["last_failure"] == "prefill_failed"
                   for k, v in pairs.items())
        metrics = await (await client.get("/metrics")).text()
        assert 'pdplane_gateway_pd_pair_state{decode="d1",prefill="p2",state=' in metrics
        assert "pdplane_gateway_pd_pair_failures_total" in metrics

        # Recovery: after the cooldown a request probes each failed pair; success heals it.
        d1.refuse_transfers = False
        p1.dead = False
        deadline = time.monotonic() + WAIT_S
        i = 100
        while time.monotonic() < deadline:
            status, body = await send(i)
            assert status == 200, body[:200]
            i += 1
            if all(p["state"] == "healthy" for p in gateway.pairs.view()):
                break
            await asyncio.sleep(0.05)
        assert all(p["state"] == "healthy" for p in gateway.pairs.view()), gateway.pairs.view()
    finally:
        await client.close()
        for e in (p1, p2, d1, d2):
            await e.close()
