"""The reference gateway: OpenAI-compatible front, routing by the pushed table.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (streaming or not),
``GET /v1/models``, ``GET /health``, ``GET /metrics``, and the signed admin API
``PUT /admin/routing-table`` (receive a table: 200 ACK, 409 stale, 422 NACK, 401 bad
signature), ``GET /admin/routing-table`` (inspect), ``GET /admin/decisions`` (sampled
decision log) and ``GET /admin/health`` (P/D pairs, KV streams: what the control plane
polls), which live in :mod:`gateway.admin`. See docs/gateway.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import time
import uuid
from collections import defaultdict
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from . import explain
from .admin import AdminAPI
from .config import GatewayConfig
from .engines import handshake_for
from .kv_subscriber import KvEventSubscriber
from .metrics import GatewayMetrics
from .pairs import PairHealth
from .peers import PeerBus
from .prefix_index import (
    CHARS_PER_TOKEN,
    AllBlocksCleared,
    ApproxPrefixIndex,
    PreciseIndex,
    TokenEstimator,
    request_text,
    request_token_ids,
    text_chunk_hashes,
    token_block_hashes,
)
from .proxy import PairFailure, UpstreamFailure, open_upstream
from .router import LoadReservation, NoWorkerError, WorkerLoad, plan_request
from .table import ModelRoute, RoutingTable, TableStore
from .upstream_http import Target, Timeouts, UpstreamPool

log = logging.getLogger("gateway")
DEFAULT_OUTPUT_TOKENS = 128


def _openai_error(status: int, message: str, kind: str, code: str | None = None):
    return web.json_response(
        {"error": {"message": message, "type": kind, "param": None, "code": code or kind}},
        status=status,
    )


def _has_token(data: bytes) -> bool:
    """Does a streamed chunk carry generated text (not only chat's opening role chunk)?"""
    return not (b'"role"' in data and b'"content":""' in data and data.count(b"data:") <= 1)


_PROMPT_TOKENS_KEY = b'"prompt_tokens"'


def _usage_prompt_tokens(payload: bytes) -> int | None:
    """``usage.prompt_tokens`` of an answer without decoding all of it (an answer can be
    long; only this one number is wanted): the last ``"prompt_tokens": <int>`` in it. The
    key cannot occur unescaped inside generated text (its quotes would be escaped)."""
    at = payload.rfind(_PROMPT_TOKENS_KEY)
    if at < 0:
        return None
    rest = payload[at + len(_PROMPT_TOKENS_KEY):at + len(_PROMPT_TOKENS_KEY) + 32]
    rest = rest.lstrip(b" \t\r\n")
    if not rest.startswith(b":"):
        return None
    digits = rest[1:].lstrip(b" \t\r\n")
    end = 0
    while end < len(digits) and 48 <= digits[end] <= 57:
        end += 1
    return int(digits[:end]) if 0 < end <= 12 else None


class Reservation:
    """The router's load arithmetic for one request (``router.LoadReservation``: queued
    prefill where it prefills, added KV where it decodes), plus what a gateway process adds
    to it: the in-flight gauge and the sibling processes' view of the same load."""

    __slots__ = ("gw", "load")

    def __init__(self, gateway: Gateway, plan, prompt_tokens: int, output_tokens: int,
                 block_size: int):
        self.gw = gateway
        self.load = LoadReservation(gateway.loads, plan, prompt_tokens, output_tokens,
                                    block_size)
        (prefill_worker, prefill_blocks), (decode_worker, decode_blocks) = (
            self.load.prefill, self.load.decode)
        self._gauge(decode_worker)
        if gateway.peers is not None:  # sibling gateway processes see it too
            gateway.peers.load(prefill_worker, prefill_blocks, 0.0, 0)
            gateway.peers.load(decode_worker, 0.0, decode_blocks, 1)

    def _gauge(self, worker_id: str) -> None:
        self.gw.metrics.child(self.gw.metrics.in_flight, worker_id).set(
            self.gw.loads[worker_id].in_flight)

    def prefill_done(self) -> None:
        held = self.load.prefill
        self.load.prefill_done()
        if held is not None and self.gw.peers is not None:
            self.gw.peers.load(held[0], -held[1], 0.0, 0)

    def release(self) -> None:
        self.prefill_done()
        held = self.load.decode
        self.load.release()
        if held is not None:
            self._gauge(held[0])
            if self.gw.peers is not None:
                self.gw.peers.load(held[0], 0.0, -held[1], -1)


class Gateway(AdminAPI):
    def __init__(self, config: GatewayConfig):
        self.config = config
        self.metrics = GatewayMetrics()
        self.store = TableStore(config.state_file, cluster=config.cluster)
        self.store.on_change(self._table_changed)
        self.approx = ApproxPrefixIndex(ttl_s=config.approx_ttl_s)
        self.precise: dict[str, PreciseIndex] = {}
        self.loads: defaultdict[str, WorkerLoad] = defaultdict(WorkerLoad)
        self.estimators: dict[str, TokenEstimator] = {}
        self._sized_at: dict[str, float] = {}
        self.rng = random.Random(config.seed)
        self._id_prefix = f"gw-{uuid.uuid4().hex[:12]}-"
        self._id_counter = itertools.count(1)
        self._urls: dict[tuple[str, str], Target] = {}
        self.pairs = PairHealth(cooldown_s=config.pd_pair_cooldown_s)
        self.metrics.watch_pairs(self.pairs)
        self.decision_log = explain.DecisionLog(config.decision_log_sample,
                                                seed=config.seed)
        self.session: aiohttp.ClientSession | None = None
        self.subscriber: KvEventSubscriber | None = None
        self.peers: PeerBus | None = None
        self.pull_etag: str | None = None
        self.last_pull_error = ""
        self._tasks: list[asyncio.Task] = []
        # Calls to workers go over a lean HTTP/1.1 pool (gateway.upstream_http); the aiohttp
        # session is for the rest (table pulls, /tokenize).
        self.pool = UpstreamPool()
        self.upstream_timeout = Timeouts(total=config.request_timeout_s,
                                         connect=config.connect_timeout_s)
        # A prefill emits one token: one that takes longer than this fails its pair.
        self.prefill_timeout = Timeouts(
            total=min(config.pd_prefill_timeout_s, config.request_timeout_s),
            connect=config.connect_timeout_s)

    # ------------------------------------------------------------------ lifecycle

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics_view)
        app.router.add_put("/admin/routing-table", self.admin_put_table)
        app.router.add_get("/admin/routing-table", self.admin_get_table)
        app.router.add_get("/admin/decisions", self.admin_decisions)
        app.router.add_get("/admin/health", self.admin_health)
        app.on_startup.append(self._startup)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _startup(self, app: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60, ttl_dns_cache=300)
        # No cookie jar: the gateway is not a browser, and filtering cookies per request
        # costs CPU.
        self.session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                             cookie_jar=aiohttp.DummyCookieJar())
        if self.config.kv_events:
            self.subscriber = KvEventSubscriber(self._on_kv_events, self.metrics,
                                                on_reset=self._on_kv_reset,
                                                stall_after_s=self.config.kv_stall_s)
        if self.config.state_file:
            from pathlib import Path

            if Path(self.config.state_file).exists():
                result = self.store.load_file(self.config.state_file)
                self.metrics.child(self.metrics.table_updates, result.outcome, "state").inc()
        if self.config.table_file:
            result = self.store.load_file(self.config.table_file)
            self.metrics.child(self.metrics.table_updates, result.outcome, "file").inc()
            if result.outcome == "nack":
                log.error("table file %s refused: %s", self.config.table_file, result.error)
        if self.store.current is not None:
            self._table_changed(self.store.current)
        if self.config.control_plane_url:
            self._tasks.append(asyncio.create_task(self._pull_loop()))
        if self.config.workers > 1:
            self.peers = PeerBus(self.config.worker_index, self.config.workers,
                                 self.config.port, loads=self.loads,
                                 on_route=self._peer_route, on_table=self._peer_table)
            await self.peers.start()

    def _peer_route(self, model: str, worker: str, hashes: list[bytes]) -> None:
        self.approx.record(model, hashes, worker, time.monotonic())

    def _peer_table(self, raw: bytes) -> None:
        """A sibling process received a pushed table: apply it here too (one push reaches
        one process of the SO_REUSEPORT group)."""
        try:
            result = self.store.apply(orjson.loads(raw))
        except orjson.JSONDecodeError:
            return
        self.metrics.child(self.metrics.table_updates, result.outcome, "peer").inc()

    async def _cleanup(self, app: web.Application) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task  # it was cancelled: its ending is expected
        if self.subscriber:
            await self.subscriber.close()
        if self.peers is not None:
            await self.peers.close()
        if self.session:
            await self.session.close()
        await self.pool.close()

    def _table_changed(self, table: RoutingTable) -> None:
        self.metrics.table_version.set(table.version)
        self.pairs.forget_workers({w.id for w in table.all_workers()})
        for model in table.models.values():
            self._size_prefix_index(model)
        if self.subscriber is not None:
            # RuntimeError: no running loop yet (table applied before start-up).
            with contextlib.suppress(RuntimeError):
                self.subscriber.sync(table)

    def _size_prefix_index(self, model: ModelRoute) -> None:
        """Bound each worker's approximate entries by its KV capacity, in chunks.

        Twice the nominal capacity: an engine's freed prefix blocks stay reusable until they
        are overwritten, and the chunk ↔ token conversion is an estimate; on the Mooncake
        benchmark a bound of 1× forgot prefixes the engines still held."""
        estimator = self.estimators.setdefault(model.name, TokenEstimator())
        chunk_chars = model.block_size * CHARS_PER_TOKEN
        for worker in model.workers:
            chunks = int(2 * worker.kv_tokens * estimator.chars_per_token / chunk_chars)
            self.approx.set_capacity(worker.id, chunks)
        self._sized_at[model.name] = estimator.chars_per_token

    def _on_kv_events(self, model: str, worker_id: str, events) -> None:
        index = self.precise.setdefault(model, PreciseIndex())
        index.apply(worker_id, events)
        if any(isinstance(e, AllBlocksCleared) for e in events):
            self.approx.forget_worker(worker_id)

    def _on_kv_reset(self, model: str, worker_id: str) -> None:
        """The worker's engine restarted (its stream started over): its cache is empty, so
        forget what both indexes believed it held; the new stream refills them."""
        index = self.precise.get(model)
        if index is not None:
            index.forget_worker(worker_id)
        self.approx.forget_worker(worker_id)

    # ------------------------------------------------------------------ plain endpoints

    async def health(self, request: web.Request) -> web.Response:
        current = self.store.current
        if current is None:
            return web.json_response({"status": "starting", "reason": "no routing table yet"},
                                     status=503)
        return web.json_response({"status": "ok", "table_version": current.version})

    async def metrics_view(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def models(self, request: web.Request) -> web.Response:
        current = self.store.current
        names = sorted(current.models) if current else []
        return web.json_response({
            "object": "list",
            "data": [{"id": n, "object": "model", "created": 0, "owned_by": "pdplane"}
                     for n in names],
        })

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "completions", chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "chat/completions", chat=True)

    # ------------------------------------------------------------------ serving

    async def _serve(self, request: web.Request, endpoint: str, *, chat: bool):
        started = time.perf_counter()
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return self._reject(400, f"request body is not JSON: {exc}", "?", endpoint)
        if not isinstance(body, dict):
            return self._reject(400, "request body must be a JSON object", "?", endpoint)
        model_name = body.get("model")
        table = self.store.current
        if table is None:
            return self._reject(503, "the gateway has no routing table yet", "(unknown)",
                                endpoint, kind="service_unavailable")
        model = table.models.get(model_name) if isinstance(model_name, str) else None
        if model is None:
            # The label is not the name asked for: clients must not mint metric series.
            return self._reject(404, f"The model `{str(model_name)[:200]}` does not exist.",
                                "(unknown)", endpoint, kind="model_not_found")
        request_id = request.headers.get("X-Request-Id") or self._next_request_id()
        prompt = await self._prompt_view(model, body, chat)
        exclude: set[str] = set()
        bad_pairs: set[tuple[str, str]] = set()
        attempt = 0
        # Only the even-inflow tie-break reads it (cost picks at temperature 0).
        inflow = None
        if model.cache_balance_band > 0 and model.temperature <= 0:
            now = time.monotonic()
            inflow = {w.id: self.approx.inflow(w.id, now) for w in model.workers}
        while True:
            try:
                plan = plan_request(model, prompt["tokens"], prompt["cached"], self.loads,
                                    self.rng, exclude, inflow)
            except NoWorkerError as exc:
                self.metrics.child(self.metrics.errors, model.name, "no_worker").inc()
                return self._reject(503, str(exc), model.name, endpoint,
                                    kind="service_unavailable")
            if plan.prefill and ((plan.prefill, plan.decode) in bad_pairs
                                 or not self.pairs.allows(plan.prefill, plan.decode)):
                # Not over a pair that is failing: plan again without that prefill worker
                # (with none left the decode worker prefills locally).
                exclude.add(plan.prefill)
                continue
            reason = plan.reason if attempt == 0 else f"retry_{plan.reason}"
            self.metrics.child(self.metrics.decisions, model.name, reason).inc()
            why = self._explain(model, plan, prompt, request_id, retried=attempt > 0)
            try:
                response = await self._execute(request, model, plan, body, raw, endpoint,
                                               chat, request_id, prompt, started, why)
            except UpstreamFailure as exc:
                self.metrics.child(self.metrics.errors, model.name, "upstream").inc()
                log.warning("request %s: %s", request_id, exc)
                if isinstance(exc, PairFailure):
                    self.pairs.failed(exc.prefill, exc.decode, exc.kind)
                    self.metrics.child(self.metrics.pair_failures, exc.prefill, exc.decode,
                                       exc.kind).inc()
                    bad_pairs.add((exc.prefill, exc.decode))
                    if exc.kind == "prefill_failed":
                        exclude.add(exc.prefill)
                else:
                    exclude.add(exc.worker_id)
                attempt += 1
                if attempt >= self.config.max_attempts or not self.config.retry_before_first_byte:
                    return self._reject(502, f"upstream failed: {exc.reason}", model.name,
                                        endpoint, kind="upstream_error")
                self.metrics.child(self.metrics.retries, model.name, "before_first_byte").inc()
                continue
            self.metrics.child(self.metrics.requests, model.name, endpoint,
                               str(response.status)).inc()
            self.metrics.child(self.metrics.e2e, model.name).observe(time.perf_counter() - started)
            return response

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

    def _next_request_id(self) -> str:
        """Unique per gateway process and cheap (a random prefix and a counter; uuid4 on
        every request costs a system call)."""
        return f"{self._id_prefix}{next(self._id_counter):x}"

    def _reject(self, status, message, model, endpoint, kind="invalid_request_error"):
        self.metrics.child(self.metrics.requests, model, endpoint, str(status)).inc()
        return _openai_error(status, message, kind)

    async def _prompt_view(self, model: ModelRoute, body: dict, chat: bool) -> dict[str, Any]:
        """Prompt length and who is believed to hold its prefix."""
        estimator = self.estimators.setdefault(model.name, TokenEstimator())
        text = request_text(body)
        token_ids = request_token_ids(body)
        precise = self.precise.get(model.name)
        if token_ids is None and self.config.tokenize_via_engine and precise is not None:
            token_ids = await self._tokenize(model, body, chat)
        now = time.monotonic()
        if text:
            chunk_chars = int(model.block_size * CHARS_PER_TOKEN)
            hashes = text_chunk_hashes(text, chunk_chars)
            unit = chunk_chars / estimator.chars_per_token
            tokens = len(token_ids) if token_ids else estimator.estimate(len(text))
        else:
            hashes = token_block_hashes(token_ids or [], model.block_size)
            unit = model.block_size
            tokens = len(token_ids or [])
        cached = {w: int(n * unit) for w, n in self.approx.match(model.name, hashes, now).items()}
        if token_ids and precise is not None:
            subscriber = self.subscriber
            for w, held in precise.match(token_ids).items():
                if subscriber is not None and subscriber.stalled(w):
                    continue  # stalled stream: its precise entries may be stale
                cached[w] = max(cached.get(w, 0), held)
        cached = {w: min(t, tokens) for w, t in cached.items()}
        return {"tokens": tokens, "cached": cached, "hashes": hashes, "chars": len(text)}

    async def _tokenize(self, model: ModelRoute, body: dict, chat: bool) -> list[int] | None:
        worker = next((w for w in model.workers if w.active), None)
        if worker is None:
            return None
        payload = {"model": model.name}
        if chat:
            payload["messages"] = body.get("messages")
        else:
            payload["prompt"] = body.get("prompt")
        try:
            async with self.session.post(
                worker.url + "/tokenize", json=payload, timeout=aiohttp.ClientTimeout(total=2)
            ) as response:
                if response.status != 200:
                    return None
                answer = await response.json(loads=orjson.loads)
                tokens = answer.get("tokens")
                return tokens if isinstance(tokens, list) else None
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
            return None

    def _explain(self, model: ModelRoute, plan, prompt, request_id: str, *,
                 retried: bool) -> str:
        """The deciding rule, counted; the avoidable prefill, counted; a sampled log entry;
        returns the X-Pdplane-Route header value."""
        rule = explain.rule_of(plan, retried, model.temperature)
        self.metrics.child(self.metrics.route_rules, model.name, rule).inc()
        avoidable, on = explain.avoidable_prefill(plan, model, prompt["cached"],
                                                  prompt["tokens"])
        if avoidable:
            self.metrics.child(self.metrics.avoidable_prefill_tokens, model.name).inc(avoidable)
        if self.decision_log.wants(rule, avoidable):
            self.decision_log.add(request_id=request_id, model=model.name, rule=rule,
                                  plan=plan, prompt_tokens=prompt["tokens"],
                                  avoidable=avoidable, avoidable_on=on)
        return explain.route_header(rule, plan)

    async def _execute(self, request, model: ModelRoute, plan, body, raw, endpoint, chat,
                       request_id, prompt, started, why: str = ""):
        bs = model.block_size
        max_out = body.get("max_tokens") or body.get("max_completion_tokens")
        out_tokens = max_out if isinstance(max_out, int) and max_out > 0 else DEFAULT_OUTPUT_TOKENS
        reservation = Reservation(self, plan, prompt["tokens"], out_tokens, bs)
        headers = {"Content-Type": "application/json", "X-Request-Id": request_id}
        if "Authorization" in request.headers:
            headers["Authorization"] = request.headers["Authorization"]
        stream = bool(body.get("stream"))
        # Remember the prefix at dispatch, not at the first token: requests sharing it that
        # arrive while this one is still prefilling should follow it (as SGLang's tree does).
        self._remember_prefix(model, plan, prompt)
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
                    self.metrics.child(self.metrics.errors, model.name,
                                       "first_token_deadline").inc()
                    return self._reject(
                        503, f"no first token within {model.first_token_deadline_ms:.0f} ms "
                        "(the gateway sheds requests that have missed their latency target)",
                        model.name, endpoint, kind="service_unavailable")
            else:
                upstream = await until_first_token
            if isinstance(upstream, web.Response):
                return upstream
            try:
                reservation.prefill_done()
                response_headers = {
                    **upstream.client_headers(),
                    "X-Request-Id": request_id,
                    "X-Pdplane-Worker": plan.decode,
                    explain.ROUTE_HEADER: why,
                }
                if plan.prefill:
                    response_headers["X-Pdplane-Prefill-Worker"] = plan.prefill
                if not stream or upstream.status != 200:
                    rest = await self._read_rest(upstream)
                    payload = upstream.first_chunk + rest
                    self._learn_tokens(model, prompt, payload)
                    return web.Response(body=payload, status=upstream.status,
                                        headers=response_headers)
                ttft = time.perf_counter() - started
                self.metrics.child(self.metrics.ttft, model.name).observe(ttft)
                return await self._relay(request, upstream, response_headers, model, prompt)
            finally:
                upstream.close()
        finally:
            reservation.release()

    async def _until_first_token(self, model, plan, body, raw, endpoint, chat, headers, prompt,
                                 stream, reservation):
        """Remote prefill (P/D), then the answering worker's response up to its first token:
        the open upstream, or a Response to pass on (the prefill worker refused the request)."""
        data = raw
        worker = model.worker(plan.decode)
        handshake = handshake_for(worker.engine)
        if plan.prefill:
            early = await self._prefill(model, plan, body, endpoint, chat, headers, prompt,
                                        handshake)
            if isinstance(early, web.Response):
                return early
            reservation.prefill_done()
            data = orjson.dumps(handshake.decode_request(body, early))
        self.metrics.child(self.metrics.worker_requests, worker.id, "decode" if plan.prefill else
                                            "full").inc()
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
            return web.Response(body=payload, status=upstream.status,
                                content_type="application/json")
        if plan.prefill:
            self.pairs.succeeded(plan.prefill, plan.decode)
        try:
            if stream and upstream.status == 200 and not _has_token(upstream.first_chunk):
                # Hold chat's opening role chunk back until a token comes, so a worker
                # that dies in between can still be replaced.
                upstream.first_chunk += await self._read_more(upstream)
        except BaseException:  # incl. cancellation by the first-token deadline
            upstream.close()
            raise
        return upstream

    async def _prefill(self, model, plan, body, endpoint, chat, headers, prompt, handshake):
        worker = model.worker(plan.prefill)
        self.metrics.child(self.metrics.worker_requests, worker.id, "prefill").inc()
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
            return web.Response(body=payload, status=upstream.status,
                                content_type="application/json")
        try:
            answer = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise PairFailure(plan.prefill, plan.decode, "prefill_failed",
                              "prefill answer is not JSON") from exc
        self._learn_tokens(model, prompt, payload, answer)
        params = handshake.transfer_params(answer)
        if params is None:
            self.metrics.child(self.metrics.decisions, model.name, "pd_no_kv_params").inc()
            return None
        return params

    async def _read_more(self, upstream) -> bytes:
        try:
            extra = b""
            while not _has_token(upstream.first_chunk + extra):
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

    async def _relay(self, request, upstream, headers, model, prompt) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers=headers)
        await response.prepare(request)
        await response.write(upstream.first_chunk)
        last = time.perf_counter()
        itl = self.metrics.child(self.metrics.itl, model.name)
        tail = upstream.first_chunk
        try:
            async for chunk in upstream.response.content.iter_any():
                now = time.perf_counter()
                itl.observe(now - last)
                last = now
                tail = chunk
                await response.write(chunk)
            await response.write_eof()
            if b'"prompt_tokens"' in tail:  # stream_options.include_usage: learn from it
                self._learn_from_stream_tail(model, prompt, tail)
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            self.metrics.child(self.metrics.errors, model.name, "client_disconnect").inc()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            # After the first byte there is no retry: end the stream, count it.
            self.metrics.child(self.metrics.errors, model.name, "upstream_mid_stream").inc()
            log.warning("upstream %s failed mid-stream: %r", upstream.worker_id, exc)
        return response

    def _remember_prefix(self, model: ModelRoute, plan, prompt) -> None:
        now = time.monotonic()
        hashes = prompt["hashes"]
        if hashes:
            self.approx.record(model.name, hashes, plan.decode, now)
            if plan.prefill:
                self.approx.record(model.name, hashes, plan.prefill, now)
            if self.peers is not None:
                self.peers.route(model.name, plan.decode, hashes)
                if plan.prefill:
                    self.peers.route(model.name, plan.prefill, hashes)
        if self.subscriber is not None and prompt["tokens"] - plan.cached_tokens >= \
                model.block_size:
            # At least one uncached block: the engine will store it and publish an event.
            self.subscriber.expect_events(plan.prefill or plan.decode)
        self.metrics.child(self.metrics.prefix_hit_tokens, model.name).inc(plan.cached_tokens)
        self.metrics.child(self.metrics.prompt_tokens, model.name).inc(prompt["tokens"])

    def _learn_from_stream_tail(self, model, prompt, tail: bytes) -> None:
        for line in reversed(tail.split(b"\n")):
            if line.startswith(b"data:") and b'"prompt_tokens"' in line:
                self._learn_tokens(model, prompt, line[5:].strip())
                return

    def _learn_tokens(self, model, prompt, payload: bytes, answer=None) -> None:
        if not prompt["chars"]:
            return
        if answer is not None:
            try:
                tokens = answer["usage"]["prompt_tokens"]
            except (KeyError, TypeError):
                return
        else:
            tokens = _usage_prompt_tokens(payload)
        if isinstance(tokens, int) and not isinstance(tokens, bool):
            estimator = self.estimators[model.name]
            estimator.observe(prompt["chars"], tokens)
            sized = self._sized_at.get(model.name, 0.0)
            if abs(estimator.chars_per_token - sized) > 0.05 * max(sized, 1.0):
                self._size_prefix_index(model)


def create_app(config: GatewayConfig) -> tuple[Gateway, web.Application]:
    gateway = Gateway(config)
    return gateway, gateway.build_app()
