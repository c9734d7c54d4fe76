"""One planned request's trip to its workers: the load it reserves, the remote prefill
(P/D handshake) when the plan has a prefill worker, the answering worker up to its first
token (under the first-token deadline), and the relay of the stream to the client.

A mixin of :class:`gateway.app.Gateway`, which plans the request and retries it when this
raises :class:`~gateway.proxy.UpstreamFailure` (nothing has reached the client yet).
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
import orjson

from . import explain
from .answer_lengths import DEFAULT_OUTPUT_TOKENS
from .engines import handshake_for
from .exchange import JSON, Reply
from .proxy import PairFailure, UpstreamFailure, open_upstream
from .router import LoadReservation
from .table import ModelRoute
from .upstream_http import Target

log = logging.getLogger("gateway")


def has_token(data: bytes) -> bool:
    """Does a streamed chunk carry generated text (not only chat's opening role chunk)?"""
    return not (b'"role"' in data and b'"content":""' in data and data.count(b"data:") <= 1)


class Reservation:
    """The router's load arithmetic for one request (``router.LoadReservation``: queued
    prefill where it prefills, added KV where it decodes), plus what a gateway process adds
    to it: the in-flight gauge and the sibling processes' view of the same load."""

    __slots__ = ("gw", "load")

    def __init__(self, gateway: RequestDriver, plan, prompt_tokens: int, output_tokens: int,
                 block_size: int, weight: float | None = None):
        self.gw = gateway
        # On the clock plan_request's ``now`` is on (the queue drains: gateway/load.py).
        self.load = LoadReservation(gateway.loads, plan, prompt_tokens, output_tokens,
                                    block_size, weight, time.monotonic())
        # (The in-flight gauge reads gateway.loads when scraped: GatewayMetrics.watch_loads.)
        if gateway.peers is not None:  # sibling gateway processes see it too
            (prefill_worker, prefill_blocks), (decode_worker, decode_blocks) = (
                self.load.prefill, self.load.decode)
            gateway.peers.load(prefill_worker, prefill_blocks, 0.0, 0)
            gateway.peers.load(decode_worker, 0.0, decode_blocks, 1)

    def prefill_done(self) -> None:
        held = self.load.prefill
        if held is None:  # done already (or released)
            return
        self.load.prefill_done(time.monotonic())
        if self.gw.peers is not None:
            self.gw.peers.load(held[0], -held[1], 0.0, 0)

    def release(self) -> None:
        load = self.load
        if load.prefill is not None:
            self.prefill_done()
        held = load.decode
        load.release()
        if held is not None and self.gw.peers is not None:
            self.gw.peers.load(held[0], 0.0, -held[1], -1)


class StreamWeight:
    """A streamed answer's stall weight, re-booked from its progress (issue 18):
    ``E[weight | length > tokens so far]`` (:meth:`AnswerLengths.weight_after`) when the
    relay's count of tokens crosses a power of two (the learned buckets' edges) and when
    the learned lengths move (``AnswerLengths.epoch``: ``observe`` calls :meth:`rebook`),
    as the simulator's ``answers="learn-stream"`` does (workers_agent/sim/gateway_routing.py;
    measured there: docs/benchmarks.md, router_quality fifth pass)."""

    __slots__ = ("lengths", "load", "max_tokens", "model", "produced", "prompt_tokens", "ratio")

    def __init__(self, lengths, load: LoadReservation, model: str, prompt_tokens: int,
                 max_tokens: int | None, ratio: float):
        self.lengths, self.load, self.model = lengths, load, model
        self.prompt_tokens, self.max_tokens, self.ratio = prompt_tokens, max_tokens, ratio
        self.produced = 0  # the count last re-booked at

    def rebook(self, produced: int | None = None) -> int:
        """Re-book at ``produced`` tokens (None: at the count last re-booked at, the learned
        lengths having moved); returns the count to re-book at next (the next power of two
        above it)."""
        if produced is None:
            produced = self.produced
        else:
            self.produced = produced
        weight = self.lengths.weight_after(self.model, self.prompt_tokens, self.max_tokens,
                                           self.ratio, produced)
        if weight is not None:  # None: not enough answers learned, keep the weight booked
            self.load.reweight(weight)
        return 1 << produced.bit_length()


class RequestDriver:
    """Needs: config, metrics, loads, peers, pairs, pool, upstream_timeout, prefill_timeout,
    _urls, answer_lengths (set by Gateway); _reject (Gateway); _remember_prefix,
    _learn_tokens, _learn_from_answer, _learn_from_stream_tail
    (:class:`gateway.prefix_knowledge.PrefixKnowledge`)."""

    async def _execute(self, request, model: ModelRoute, plan, body, raw, endpoint, chat,
                       request_id, prompt, started, why: str = "", counted=None):
        """``counted``: the model's metrics (:meth:`GatewayMetrics.model`), if at hand."""
        if counted is None:
            counted = self.metrics.model(model.name)
        bs = model.block_size
        max_out = body.get("max_tokens") or body.get("max_completion_tokens")
        if not (isinstance(max_out, int) and max_out > 0):
            max_out = None
        # KV is booked for the longest answer allowed (else DEFAULT_OUTPUT_TOKENS); the
        # stall weight for the answer length learned from finished answers (docs/gateway.md):
        # of a request found in flight, or for a stream, per request and re-booked as it
        # streams (StreamWeight: conditioning on its progress is the in-flight correction).
        stream = bool(body.get("stream"))
        weight = self.answer_lengths.dispatch_weight(model.name, prompt["tokens"], max_out,
                                                     plan.ttft_itl_ratio, stream)
        reservation = Reservation(self, plan, prompt["tokens"], max_out or DEFAULT_OUTPUT_TOKENS,
                                  bs, weight)
        headers = {"Content-Type": JSON, "X-Request-Id": request_id}
        authorization = request.headers.get("Authorization")
        if authorization is not None:
            headers["Authorization"] = authorization
        # Remember the prefix at dispatch, not at the first token: requests sharing it that
        # arrive while this one is still prefilling should follow it (as SGLang's tree does).
        self._remember_prefix(model, plan, prompt, counted)
        try:
            until_first_token = self._until_first_token(
                model, plan, body, raw, endpoint, chat, headers, prompt, stream, reservation
            )
            # Streaming only: a non-streaming answer's first byte is its last.
            deadline_s = model.first_token_deadline_ms / 1000.0 if stream else 0.0
            if deadline_s > 0:
                remaining = deadline_s - (time.perf_counter() - started)
                try:
                    upstream = await asyncio.wait_for(until_first_token, max(remaining, 0.0))
                except TimeoutError:
                    # Shed: the TTFT target is lost already; cancelling the upstream request
                    # (the connection closes, the engine aborts it) frees the engine for
                    # the requests queued behind it. No retry: the fleet is overloaded.
                    counted.errors["first_token_deadline"].inc()
                    return self._reject(
                        503, f"no first token within {model.first_token_deadline_ms:.0f} ms "
                        "(the gateway sheds requests that have missed their latency target)",
                        model.name, endpoint, kind="service_unavailable")
            else:
                upstream = await until_first_token
            if isinstance(upstream, Reply):
                return upstream
            try:
                reservation.prefill_done()
                response_headers = upstream.client_headers()  # a new dict, then ours
                response_headers["X-Request-Id"] = request_id
                response_headers["X-Pdplane-Worker"] = plan.decode
                response_headers[explain.ROUTE_HEADER] = why
                if plan.prefill:
                    response_headers["X-Pdplane-Prefill-Worker"] = plan.prefill
                if not stream or upstream.status != 200:
                    # A short answer is usually all in by now: taken without a coroutine.
                    rest = upstream.response.read_now()
                    if rest is None:
                        rest = await self._read_rest(upstream)
                    payload = upstream.first_chunk + rest if rest else upstream.first_chunk
                    self._learn_from_answer(model, prompt, payload)
                    return Reply(upstream.status, payload, response_headers)
                ttft = time.perf_counter() - started
                counted.ttft.observe(ttft)
                progress = None  # ratio 0: every weight is 1, nothing to re-book
                if plan.ttft_itl_ratio > 0:
                    progress = StreamWeight(self.answer_lengths, reservation.load, model.name,
                                            prompt["tokens"], max_out, plan.ttft_itl_ratio)
                return await self._relay(request, upstream, response_headers, model, prompt,
                                         progress)
            finally:
                upstream.close()
        finally:
            reservation.release()

    async def _until_first_token(self, model, plan, body, raw, endpoint, chat, headers, prompt,
                                 stream, reservation):
        """Remote prefill (P/D), then the answering worker's response up to its first token:
        the open upstream, or a Reply to pass on (the prefill worker refused the request)."""
        data = raw
        worker = model.worker(plan.decode)
        handshake = None
        if plan.prefill:
            handshake = handshake_for(worker.engine)
            early = await self._prefill(model, plan, body, endpoint, chat, headers, prompt,
                                        handshake)
            if isinstance(early, Reply):
                return early
            reservation.prefill_done()
            data = orjson.dumps(handshake.decode_request(body, early))
        self.metrics.worker_requests_of[worker.id]["decode" if plan.prefill else "full"].inc()
        upstream = await open_upstream(
            self.pool, worker.id, self._url(worker.url, endpoint), data, headers,
            timeout=self.upstream_timeout,
        )
        if plan.prefill and 400 <= upstream.status < 500:
            try:
                payload = upstream.first_chunk + await self._read_rest(upstream)
            finally:
                upstream.close()
            if handshake.is_transfer_refusal(upstream.status, payload):
                raise PairFailure(plan.prefill, plan.decode, "transfer_refused",
                                  f"decode refused the KV transfer: HTTP {upstream.status}",
                                  upstream.status)
            return Reply(upstream.status, payload, content_type=JSON)
        if plan.prefill:
            self.pairs.succeeded(plan.prefill, plan.decode)
        try:
            if stream and upstream.status == 200 and not has_token(upstream.first_chunk):
                # Hold chat's opening role chunk back until a token comes, so a worker
                # that dies in between can still be replaced.
                upstream.first_chunk += await self._read_more(upstream)
        except BaseException:  # incl. cancellation by the first-token deadline
            upstream.close()
            raise
        return upstream

    async def _prefill(self, model, plan, body, endpoint, chat, headers, prompt, handshake):
        worker = model.worker(plan.prefill)
        self.metrics.worker_requests_of[worker.id]["prefill"].inc()
        try:
            upstream = await open_upstream(
                self.pool, worker.id, self._url(worker.url, endpoint),
                orjson.dumps(handshake.prefill_request(body, chat=chat)), headers,
                timeout=self.prefill_timeout,
            )
            try:
                payload = upstream.first_chunk + await self._read_rest(upstream)
            finally:
                upstream.close()
        except UpstreamFailure as exc:
            raise PairFailure(plan.prefill, plan.decode, "prefill_failed", exc.reason,
                              exc.status) from exc
        if upstream.status != 200:
            # The request itself is at fault (4xx): answer the client with it.
            return Reply(upstream.status, payload, content_type=JSON)
        try:
            answer = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise PairFailure(plan.prefill, plan.decode, "prefill_failed",
                              "prefill answer is not JSON") from exc
        self._learn_tokens(model, prompt, payload, answer)
        params = handshake.transfer_params(answer)
        if params is None:
            self.metrics.model(model.name).decisions["pd_no_kv_params"].inc()
            return None
        return params

    async def _read_more(self, upstream) -> bytes:
        try:
            extra = b""
            while not has_token(upstream.first_chunk + extra):
                chunk = await upstream.response.content.readany()
                if not chunk:
                    break
                extra += chunk
            return extra
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise UpstreamFailure(upstream.worker_id, f"died before a token: {exc!r}") from exc

    async def _read_rest(self, upstream) -> bytes:
        try:
            return await upstream.response.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise UpstreamFailure(upstream.worker_id, f"answer cut short: {exc!r}") from exc

    async def _relay(self, request, upstream, headers, model, prompt,
                     progress: StreamWeight | None = None) -> None:
        """The stream, relayed to the client as it comes (``request`` is the server's
        exchange). A chunk that ends the answer goes out with the stream's end, in one
        write. ``progress``: the request's stall weight, re-booked as tokens stream."""
        counted = self.metrics.model(model.name)
        itl = counted.itl
        tail = previous = upstream.first_chunk
        content = upstream.response.content
        # Tokens so far, counted as SSE data events: vLLM and SGLang send one event per
        # decode step, one token each, so the count is the answer's length give or take the
        # role, usage and [DONE] events (a few tokens: the edges that matter are the large
        # powers of two). It undercounts where one event carries several tokens
        # (speculative decoding, an engine's stream_interval > 1): the count is then steps,
        # and the weight is read for a shorter answer than it is, i.e. higher (the
        # conservative side, as before this re-booking); text containing "data:" literally
        # adds one. One C scan per read (a read holds several events when the relay lags:
        # counting reads would undercount under load, when it matters) and one comparison.
        produced = tail.count(b"data:")
        edge = 1 << 62  # the count to re-book at next
        try:
            if progress is not None:
                self.answer_lengths.following.add(progress)
                edge = progress.rebook(produced)
            await request.start_stream(200, headers, tail)
            last = time.perf_counter()
            ending = b""
            while not content.at_eof():
                chunk = await content.readany()
                if not chunk:
                    break
                now = time.perf_counter()
                itl.observe(now - last)
                last = now
                produced += chunk.count(b"data:")
                if produced >= edge:  # booked before the client sees the token
                    edge = progress.rebook(produced)
                previous, tail = tail, chunk
                if content.at_eof():
                    ending = chunk
                    break
                await request.write(chunk)
            await request.write_eof(ending)
            # stream_options.include_usage: learn from the usage chunk, the last before
            # [DONE] (which may come in a read of its own).
            if b'"prompt_tokens"' in tail:
                self._learn_from_stream_tail(model, prompt, tail)
            elif b'"prompt_tokens"' in previous:
                self._learn_from_stream_tail(model, prompt, previous)
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            counted.errors["client_disconnect"].inc()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            # After the first byte there is no retry: end the stream, count it.
            counted.errors["upstream_mid_stream"].inc()
            log.warning("upstream %s failed mid-stream: %r", upstream.worker_id, exc)
        finally:
            # (_execute releases the reservation; a re-book after it would book nothing.)
            self.answer_lengths.following.discard(progress)

    def _url(self, base: str, endpoint: str) -> Target:
        """The worker's endpoint, parsed once (URL parsing is a visible share of a
        request's CPU)."""
        key = (base, endpoint)
        url = self._urls.get(key)
        if url is None:
            if len(self._urls) > 100_000:
                self._urls.clear()
            url = self._urls[key] = Target.parse(f"{base}/v1/{endpoint}")
        return url
