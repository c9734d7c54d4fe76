"""The gateway learns answer lengths from finished answers (usage.completion_tokens, of a
non-streaming body or a stream's usage chunk) and books the learned stall weight."""

from __future__ import annotations

import asyncio

import pytest

from gateway import request_driver
from gateway.router import LoadReservation, stall_weight

from .gateway_stub import MODEL, StubEngine, start_gateway, table_for

RATIO = 20.0  # TTFT target / ITL target in the table
MAX_TOKENS = 1000  # generous bound; the stub answers 2 tokens


@pytest.fixture
def booked(monkeypatch):
    weights = []

    class Recording(LoadReservation):
        __slots__ = ()

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            weights.append(self.weight)

    monkeypatch.setattr(request_driver, "LoadReservation", Recording)
    return weights


@pytest.mark.parametrize("stream", [False, True])
def test_gateway_learns_answer_lengths_and_books_their_weight(booked, stream):
    asyncio.run(_scenario(booked, stream))


async def _scenario(booked, stream):
    engine = await StubEngine("a").start()
    gateway, client = await start_gateway(table_for([(engine, "both")], ttft_itl_ratio=RATIO))
    body = {"model": MODEL, "prompt": "tell me a short story", "max_tokens": MAX_TOKENS,
            "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    try:
        samples = gateway.answer_lengths.min_samples
        for _ in range(samples + 2):
            r = await client.post("/v1/completions", json=body)
            assert r.status == 200
            await r.read()
        # Before any answer: max_tokens' weight (the gateway's behaviour before learning).
        assert booked[0] == pytest.approx(stall_weight(MAX_TOKENS, RATIO))
        # Learned 2-token answers: every stall counts in full, whatever max_tokens says.
        assert booked[-1] == pytest.approx(1.0)
        assert booked[-1] > 10 * booked[0]
        # Each answer is learned with its time since the request came in (the weight of a
        # request found in flight, gateway/answer_lengths.py).
        learned = gateway.answer_lengths._hists[(MODEL, -1)]
        assert learned.timed == learned.total > 0
        # Without the usage chunk a stream teaches nothing (content chunks are not tokens).
        if stream:
            learned = gateway.answer_lengths._hists[(MODEL, -1)].total
            del body["stream_options"]
            r = await client.post("/v1/completions", json=body)
            await r.read()
            assert gateway.answer_lengths._hists[(MODEL, -1)].total == learned
    finally:
        await client.close()
        await engine.close()
