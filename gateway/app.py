"""The reference gateway: OpenAI-compatible front, routing by the pushed table.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (streaming or not),
``GET /v1/models``, ``GET /health``, ``GET /metrics``, and the signed admin API
``PUT /admin/routing-table`` (receive a table: 200 ACK, 409 stale, 422 NACK, 401 bad
signature), ``GET /admin/routing-table`` (inspect), ``GET /admin/decisions`` (sampled
decision log) and ``GET /admin/health`` (P/D pairs, KV streams: what the control plane
polls), which live in :mod:`gateway.admin`. See docs/gateway.md.

This module holds the front: the app, its lifecycle (table, KV streams, sibling processes)
and the plan-and-retry loop of each request. What the gateway believes each worker holds
is :mod:`gateway.prefix_knowledge`; a planned request's trip to its workers (P/D prefill,
first token, relay) is :mod:`gateway.request_driver`.
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

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from . import explain
from .admin import AdminAPI
from .answer_lengths import AnswerLengths
from .config import GatewayConfig
from .exchange import AiohttpExchange, Reply, openai_error
from .kv_subscriber import KvEventSubscriber
from .metrics import GatewayMetrics
from .pairs import PairHealth
from .peers import PeerBus
from .prefix_index import ApproxPrefixIndex, PreciseIndex, TokenEstimator, request_token_ids
from .prefix_knowledge import PrefixKnowledge
from .proxy import PairFailure, UpstreamFailure
from .request_driver import RequestDriver
from .router import NoWorkerError, WorkerLoad, plan_request
from .table import ModelRoute, RoutingTable, TableStore
from .upstream_http import Target, Timeouts, UpstreamPool

log = logging.getLogger("gateway")


class Gateway(AdminAPI, PrefixKnowledge, RequestDriver):
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
        self.answer_lengths = AnswerLengths()  # learned from answers: the stall weight booked
        self.rng = random.Random(config.seed)
        self._id_prefix = f"gw-{uuid.uuid4().hex[:12]}-"
        self._id_counter = itertools.count(1)
        self._urls: dict[tuple[str, str], Target] = {}
        self.pairs = PairHealth(cooldown_s=config.pd_pair_cooldown_s)
        self.metrics.watch_pairs(self.pairs)
        self.metrics.watch_loads(self.loads)
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

    # path -> (endpoint, chat): the OpenAI endpoints, which the lean server (gateway.front)
    # hands straight to _serve.
    OPENAI_ENDPOINTS = {"/v1/completions": ("completions", False),
                        "/v1/chat/completions": ("chat/completions", True)}

    def routes(self) -> list[tuple[str, str, object]]:
        """(method, path, aiohttp handler) of every endpoint, for both servers."""
        return [
            ("POST", "/v1/completions", self.completions),
            ("POST", "/v1/chat/completions", self.chat_completions),
            ("GET", "/v1/models", self.models),
            ("GET", "/health", self.health),
            ("GET", "/metrics", self.metrics_view),
            ("PUT", "/admin/routing-table", self.admin_put_table),
            ("GET", "/admin/routing-table", self.admin_get_table),
            ("GET", "/admin/decisions", self.admin_decisions),
            ("GET", "/admin/health", self.admin_health),
        ]

    def build_app(self) -> web.Application:
        """The aiohttp server's app (``--server aiohttp``, and the in-process test client)."""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        for method, path, handler in self.routes():
            if method == "GET":
                app.router.add_get(path, handler)  # and HEAD, as the lean server
            else:
                app.router.add_route(method, path, handler)
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
        exchange = AiohttpExchange(request)
        return exchange.finish(await self._serve(exchange, "completions", chat=False))

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        exchange = AiohttpExchange(request)
        return exchange.finish(await self._serve(exchange, "chat/completions", chat=True))

    # ------------------------------------------------------------------ serving

    async def _serve(self, request, endpoint: str, *, chat: bool) -> Reply | None:
        """One OpenAI request, planned and retried. ``request`` is the server's exchange
        (:mod:`gateway.exchange`); returns the whole answer, or ``None`` once it streamed."""
        started = time.perf_counter()
        raw = request.body_now()  # the whole body, if it is in (the usual case)
        if raw is None:
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
        counted = self.metrics.model(model.name)
        request_id = request.headers.get("X-Request-Id") or self._next_request_id()
        token_ids = request_token_ids(body)
        if token_ids is None and self.config.tokenize_via_engine and model.name in self.precise:
            token_ids = await self._tokenize(model, body, chat)
        now = time.monotonic()
        prompt = self._prompt_of(model, body, token_ids, now)
        exclude: set[str] = set()
        bad_pairs: set[tuple[str, str]] = set()
        attempt = 0
        # Only the even-inflow tie-break reads it (cost picks at temperature 0), and only
        # for the near ties: worked out for those alone.
        inflow = None
        if model.cache_balance_band > 0 and model.temperature <= 0:
            inflow = _Inflow(self.approx, now)
        while True:
            try:
                plan = plan_request(model, prompt["tokens"], prompt["cached"], self.loads,
                                    self.rng, exclude, inflow, now)
            except NoWorkerError as exc:
                counted.errors["no_worker"].inc()
                return self._reject(503, str(exc), model.name, endpoint,
                                    kind="service_unavailable")
            if plan.prefill and ((plan.prefill, plan.decode) in bad_pairs
                                 or not self.pairs.allows(plan.prefill, plan.decode)):
                # Not over a pair that is failing: plan again without that prefill worker
                # (with none left the decode worker prefills locally).
                exclude.add(plan.prefill)
                continue
            reason = plan.reason if attempt == 0 else f"retry_{plan.reason}"
            counted.decisions[reason].inc()
            why = self._explain(model, plan, prompt, request_id, retried=attempt > 0,
                                counted=counted)
            try:
                response = await self._execute(request, model, plan, body, raw, endpoint,
                                               chat, request_id, prompt, started, why, counted)
            except UpstreamFailure as exc:
                counted.errors["upstream"].inc()
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
                counted.retries["before_first_byte"].inc()
                continue
            counted.requests[endpoint][200 if response is None else response.status].inc()
            counted.e2e.observe(time.perf_counter() - started)
            return response

    def _next_request_id(self) -> str:
        """Unique per gateway process and cheap (a random prefix and a counter; uuid4 on
        every request costs a system call)."""
        return f"{self._id_prefix}{next(self._id_counter):x}"

    def _reject(self, status, message, model, endpoint, kind="invalid_request_error") -> Reply:
        self.metrics.model(model).requests[endpoint][status].inc()
        return openai_error(status, message, kind)

    def _explain(self, model: ModelRoute, plan, prompt, request_id: str, *,
                 retried: bool, counted=None) -> str:
        """The deciding rule, counted; the avoidable prefill, counted; a sampled log entry;
        returns the X-Pdplane-Route header value. ``counted``: the model's metrics."""
        if counted is None:
            counted = self.metrics.model(model.name)
        rule = explain.rule_of(plan, retried, model.temperature)
        counted.route_rules[rule].inc()
        avoidable, on = explain.avoidable_prefill(plan, model, prompt["cached"],
                                                  prompt["tokens"])
        if avoidable:
            counted.avoidable_prefill_tokens.inc(avoidable)
        if self.decision_log.wants(rule, avoidable):
            self.decision_log.add(request_id=request_id, model=model.name, rule=rule,
                                  plan=plan, prompt_tokens=prompt["tokens"],
                                  avoidable=avoidable, avoidable_on=on)
        return explain.route_header(rule, plan)


class _Inflow:
    """Each worker's recent new KV (``ApproxPrefixIndex.inflow``) as the router reads it
    (``inflow.get(worker)``), computed on demand: most requests have no near tie."""

    __slots__ = ("approx", "now")

    def __init__(self, approx: ApproxPrefixIndex, now: float):
        self.approx, self.now = approx, now

    def get(self, worker_id: str, default: float = 0.0) -> float:
        return self.approx.inflow(worker_id, self.now)


def create_app(config: GatewayConfig) -> tuple[Gateway, web.Application]:
    gateway = Gateway(config)
    return gateway, gateway.build_app()
