"""The gateway learns answer lengths from finished answers (usage.completion_tokens, of a
non-streaming body or a stream's usage chunk) and books the learned stall weight."""

from __future__ import annotations

import asyncio
import re
from itertools import pairwise

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway import request_driver
from gateway.answer_lengths import BUCKETS, IPW_CAP, MIN_DURATION_S, AnswerLengths, _Histogram
from gateway.prefix_knowledge import _usage_count
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


class PacedEngine:
    """Streams ``tokens`` one SSE event each, the next only when the test says so."""

    def __init__(self, tokens: int):
        self.tokens = tokens
        self.go = asyncio.Queue()
        self.server = None

    async def start(self):
        from aiohttp import web
        from aiohttp.test_utils import TestServer

        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        self.server = TestServer(app)
        await self.server.start_server()
        self.url, self.id = str(self.server.make_url("")).rstrip("/"), "paced"
        return self

    async def completions(self, request):
        import orjson
        from aiohttp import web

        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(self.tokens):
            await self.go.get()
            chunk = {"id": "c", "choices": [{"index": 0, "text": f"t{i}"}]}
            await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


async def _next_event(content) -> bytes:
    event = b""
    while not event.endswith(b"\n\n"):
        line = await asyncio.wait_for(content.readline(), 5)
        assert line, "stream ended early"
        event += line
    return event


@pytest.mark.parametrize("disconnect", [False, True])
def test_a_streams_weight_falls_as_it_streams_and_its_release_balances(disconnect):
    """Through the real relay: a streamed request books E[weight] per request, re-books
    E[weight | length > tokens so far] as its tokens cross powers of two, and gives back
    exactly what it holds at the end (or when the client goes mid-stream)."""
    asyncio.run(_paced_scenario(disconnect))


async def _paced_scenario(disconnect):
    engine = await PacedEngine(40).start()
    gateway, client = await start_gateway(table_for([(engine, "both")], ttft_itl_ratio=RATIO))
    lengths = gateway.answer_lengths
    for _ in range(10):  # half the answers 10 tokens (weight 1), half 1000 (weight 0.02)
        lengths.observe(MODEL, 5, 10)
        lengths.observe(MODEL, 5, 1000)

    def booked():
        return sum(load.stall_weight_sum for load in gateway.loads.values())

    body = {"model": MODEL, "prompt": "hi", "stream": True}
    try:
        engine.go.put_nowait(None)  # the first token: the gateway answers once it has one
        r = await client.post("/v1/completions", json=body)
        assert r.status == 200
        await _next_event(r.content)
        # Dispatched at E[weight] = ~0.51 (per request); one token in it is re-booked
        # to the same buckets (no answer shorter than 2 tokens was seen).
        assert booked() == pytest.approx(0.51, abs=0.02)
        assert len(lengths.following) == 1
        weights = [booked()]
        for _ in range(19):
            engine.go.put_nowait(None)
            await _next_event(r.content)
            weights.append(booked())
        # Past 15 tokens only the long answers remain possible.
        assert weights[-1] == pytest.approx(0.02, rel=0.05)
        assert all(b <= a + 1e-9 for a, b in pairwise(weights))
        # Re-booked when the count crosses a power of two only (1, 2, 4, 8, 16).
        assert len(set(weights)) <= 3
        # Learned lengths moving (AnswerLengths.epoch) re-book the stream in flight: now
        # every answer learned is 20 tokens long, i.e. 20 tokens in, it is at most that.
        for _ in range(200):
            lengths.observe(MODEL, 5, 20)
        assert booked() > 0.5
        if disconnect:
            r.close()
        else:
            for _ in range(20):
                engine.go.put_nowait(None)
            await r.read()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while loop.time() < deadline:  # released once its handler ends or is cancelled
            if all(load.in_flight == 0 for load in gateway.loads.values()):
                break
            await asyncio.sleep(0.02)
        for load in gateway.loads.values():
            assert load.in_flight == 0 and load.own_requests == 0
            assert load.stall_weight_sum == 0 and load.decode_blocks == 0
        assert not lengths.following
    finally:
        for _ in range(40):
            engine.go.put_nowait(None)
        await client.close()
        await engine.server.close()


def _weight_after_uncached(lengths, max_tokens, ratio, produced):
    """weight_after as first written (5b2cdc5): every bucket visited, nothing cached."""
    hist = lengths._hists[(MODEL, -1)]
    floor = 1.0 / max_tokens if max_tokens else 0.0
    weighted = seen = 0.0
    for b, (count, inverse) in enumerate(zip(hist.count, hist.inverse, strict=True)):
        if count <= 0 or (2 << b) <= produced + 1:
            continue
        weighted += count * min(1.0, ratio * max(inverse / count, floor))
        seen += count
    if seen > 0:
        return weighted / seen
    return min(1.0, ratio * max(1.0 / max(produced, 1), floor))


@settings(max_examples=150, deadline=None)
@given(answers=st.lists(st.integers(1, 3000), min_size=1, max_size=120),
       produced=st.lists(st.integers(0, 4000), min_size=1, max_size=12),
       max_tokens=st.one_of(st.none(), st.integers(1, 4000)), ratio=st.floats(0.5, 100))
def test_weight_after_cached_by_length_class_is_the_uncached_arithmetic(answers, produced,
                                                                        max_tokens, ratio):
    lengths = AnswerLengths(min_samples=1)
    for n in answers:
        lengths.observe(MODEL, 0, n)
        for p in produced:  # asked between answers too: a cached value must stay right
            got = lengths.weight_after(MODEL, 0, max_tokens, ratio, p)
            fresh = _weight_after_uncached(lengths, max_tokens, ratio, p)
            # Cached until the next answer: exact.
            assert got == pytest.approx(fresh, rel=1e-12)


class _OldLengths(AnswerLengths):
    """observe as it was at 5b2cdc5 (a separate _add per histogram, the epoch's rule tested
    per answer): the arithmetic the restructured observe must reproduce bit for bit."""

    def observe(self, model, prompt_tokens, completion_tokens, duration_s=None, now=None):
        if completion_tokens <= 0:
            return
        count = 1.0
        if duration_s is not None and now is not None and duration_s >= 0:
            start = now - duration_s
            if self._start is None:
                self._start = start
            else:
                self._start = min(self._start, start)
                span = now - self._start
                count = min(IPW_CAP, span / (span - duration_s)) if span > duration_s \
                    else IPW_CAP
            if 0.0 < duration_s < MIN_DURATION_S:  # the floor (answer_lengths.MIN_DURATION_S)
                duration_s = MIN_DURATION_S
        else:
            duration_s = None
        for key in ((model, -1), (model, max(int(prompt_tokens), 0).bit_length())):
            hist = self._hists.get(key)
            if hist is None:
                hist = self._hists[key] = _Histogram()
            self._old_add(hist, completion_tokens, count, duration_s)
        self._answers += 1
        if (self._answers - self._old_epoch_at) * 64 >= min(self._answers, self.memory):
            self.epoch += 1
            self._old_epoch_at = self._answers

    _old_epoch_at = 0

    def _old_add(self, hist, completion_tokens, count, duration_s):
        scale = hist.scale = hist.scale / self.decay
        if scale > 1e100:
            for sums in (hist.count, hist.inverse, hist.dur, hist.dur_inverse):
                sums[:] = [v / scale for v in sums]
            scale = hist.scale = 1.0
        b = min(int(completion_tokens).bit_length() - 1, BUCKETS - 1)
        scale *= count
        hist.count[b] += scale
        hist.inverse[b] += scale / completion_tokens
        hist.total += 1
        if duration_s is not None:
            hist.dur[b] += scale * duration_s
            hist.dur_inverse[b] += scale * duration_s / completion_tokens
            hist.timed += 1


@settings(max_examples=150, deadline=None)
@given(answers=st.lists(st.tuples(st.integers(-3, 1 << 22), st.integers(-2, 1 << 22),
                                  st.one_of(st.none(), st.floats(-1, 300)),
                                  st.floats(0, 50)), min_size=1, max_size=300),
       memory=st.integers(2, 700))  # memory 1: decay 0 (divides by zero, before and after)
@example(answers=[(5, 7, 1.0, 0.5), (900, 3000, None, 0.0)] * 200, memory=2)  # folds
def test_observe_restructured_is_the_old_arithmetic(answers, memory):
    new, old = AnswerLengths(memory=memory), _OldLengths(memory=memory)
    clock = 1000.0
    for prompt, completion, duration, step in answers:
        clock += step
        for lengths in (new, old):
            lengths.observe(MODEL, prompt, completion, duration, clock)
        assert new.epoch == old.epoch and new._start == old._start
    assert new._hists.keys() == old._hists.keys()
    for key, hist in new._hists.items():
        ref = old._hists[key]
        for field in ("count", "inverse", "dur", "dur_inverse", "scale", "timed", "total"):
            assert getattr(hist, field) == getattr(ref, field), field


def _old_usage_count(payload, key):
    at = payload.rfind(key)
    if at < 0:
        return None
    start = at + len(key)
    found = re.compile(rb"[ \t\r\n]*:[ \t\r\n]*([0-9]+)").match(payload, start, start + 32)
    if found is None:
        return None
    digits = found.group(1)
    return int(digits) if len(digits) <= 12 else None


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.one_of(st.sampled_from([b'"prompt_tokens"', b'"completion_tokens"',
                                                 b":", b" ", b"\n", b",", b"}", b"0"]),
                                st.integers(0, 10**15).map(lambda n: str(n).encode()),
                                st.binary(max_size=8)), max_size=24))
def test_usage_count_is_what_it_was(parts):
    payload = b"".join(parts)
    for key in (b'"prompt_tokens"', b'"completion_tokens"'):
        assert _usage_count(payload, key) == _old_usage_count(payload, key)
