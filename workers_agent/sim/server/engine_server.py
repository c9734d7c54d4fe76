"""One simulated engine behind a vLLM-0.32-compatible HTTP server (aiohttp) and ZMQ sockets.

The engine model (workers_agent.sim.engine) is pure and clock-free, and the one engine driver
(workers_agent.sim.driver) tracks its requests, latencies and held P/D blocks; this module is
the real-time clock around them: take the next step, sleep its duration (scaled by
``time_scale``), finish it, and push the produced tokens to the waiting HTTP responses. The
HTTP P/D pull (prefill side and decode side) is in workers_agent.sim.server.pd_http. All
engine calls happen on the one asyncio loop, so the model needs no locking.

Time: the engine sees *simulated* seconds (wall seconds ÷ time_scale since start), and the
latency histograms in /metrics are in simulated seconds too, so a fleet run ten times faster
(time_scale 0.1) still reports realistic TTFT/ITL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from workers_agent.sim.driver import EngineDriver, Tracked
from workers_agent.sim.fleetconfig import EngineConfig
from workers_agent.sim.kvevents import KvEventPublisher
from workers_agent.sim.metrics import CONTENT_TYPE, CacheConfigInfo, EngineMetrics
from workers_agent.sim.server import adapters
from workers_agent.sim.server.pd import EngineLocation
from workers_agent.sim.server.pd_http import PdHttp
from workers_agent.sim.server.protocol import (
    ApiError,
    GenerationRequest,
    error_middleware,
    full_response,
    new_request_id,
    parse_chat,
    parse_completion,
    parse_json_object,
    sse,
    stream_chunk,
    usage,
)

log = logging.getLogger(__name__)

VLLM_VERSION = "0.32.0"
MAX_BODY_BYTES = 32 * 1024 * 1024
PULL_TIMEOUT_S = 5.0
CATCH_UP_WALL_S = 0.05
SHUTDOWN_TIMEOUT_S = 2.0


class SimClock:
    """Simulated seconds since start; ``time_scale`` wall seconds per simulated second."""

    def __init__(self, time_scale: float = 1.0) -> None:
        self.time_scale = time_scale
        self._t0 = time.monotonic()

    def now(self) -> float:
        return self.at(time.monotonic())

    def at(self, wall_monotonic: float) -> float:
        """Simulated time at a time.monotonic() instant."""
        return (wall_monotonic - self._t0) / self.time_scale

    def wall(self, sim_seconds: float) -> float:
        return max(sim_seconds, 0.0) * self.time_scale


@dataclass
class _Client:
    """The HTTP side of a tracked request: what it asked for and where its tokens go."""

    req: GenerationRequest
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)


class _Histograms:
    """The driver's latency figures onto the engine's Prometheus histograms."""

    def __init__(self, metrics: EngineMetrics) -> None:
        self.metrics = metrics

    def first_token(self, tracked: Tracked, ttft: float) -> None:
        self.metrics.ttft.observe(max(ttft, 0.0))

    def token_gaps(self, tracked: Tracked, gap: float, count: int) -> None:
        for _ in range(count):
            self.metrics.itl.observe(gap)

    def finished(self, tracked: Tracked, *, queued: float, prefill: float,
                 decode: float) -> None:
        self.metrics.record_finished(
            reason=tracked.finish_reason or "length", e2e=tracked.finished_at - tracked.arrival,
            queued=queued, prefill=prefill, decode=decode, prompt_tokens=tracked.prompt_tokens,
            generation_tokens=tracked.generated, max_tokens=tracked.max_tokens,
        )


def _reported_cached(tracked: Tracked) -> int:
    # vLLM reports local prefix-cache hits and KV received from a prefill engine together.
    return tracked.cached_tokens + tracked.external_tokens


class EngineServer(PdHttp):
    def __init__(
        self,
        cfg: EngineConfig,
        *,
        gpu_profile: str,
        location: EngineLocation,
        host: str = "127.0.0.1",
        clock: SimClock | None = None,
        telemetry: Any = None,
        kv_batch_format: str = "array",
    ) -> None:
        self.cfg = cfg
        self.host = host
        self.clock = clock or SimClock()
        self.location = location
        self.telemetry = telemetry  # the node (record_kv_transfer), or None
        self.role = cfg.role
        self.gpu_profile = gpu_profile
        self.model_profile, self.hardware_profile = adapters.profiles_for(cfg.model, gpu_profile)
        self.engine = adapters.make_engine(cfg, self.model_profile, self.hardware_profile)
        self.kv_bytes_per_token = adapters.kv_bytes_per_token(self.model_profile)
        self.max_model_len = cfg.max_model_len or adapters.max_model_len(self.model_profile)
        stats = self.engine.stats()
        self.num_gpu_blocks = stats.num_gpu_blocks
        self.metrics = EngineMetrics(
            model_name=cfg.model_name,
            stats_fn=self.engine.stats,
            cache_info=CacheConfigInfo(
                block_size=cfg.block_size,
                num_gpu_blocks=stats.num_gpu_blocks,
                enable_prefix_caching=cfg.enable_prefix_caching,
                kv_cache_memory_bytes=stats.num_gpu_blocks * cfg.block_size
                * self.kv_bytes_per_token,
            ),
            max_model_len=self.max_model_len,
        )
        self.publisher: KvEventPublisher | None = None
        if cfg.kv_events:
            self.publisher = KvEventPublisher(
                f"tcp://{host}:{cfg.kv_events_port}",
                f"tcp://{host}:{cfg.kv_replay_port}",
                drop_every=cfg.drop_kv_batch_every,
                batch_format=kv_batch_format,
            )
        self.driver = EngineDriver(self.engine, _Histograms(self.metrics), record_itls=False)
        self._requests: dict[str, Tracked] = {}
        self._held_by_header: dict[str, str] = {}
        self._hold_timers: dict[str, asyncio.TimerHandle] = {}
        self._wake = asyncio.Event()
        self._last_submit_wall = 0.0
        self._driver: asyncio.Task | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.started_at = time.time()

    # ------------------------------------------------------------------ lifecycle

    @property
    def api_url(self) -> str:
        return f"http://{self.host}:{self.cfg.http_port}"

    def describe(self) -> dict[str, Any]:
        """The engine as node telemetry lists it (docs/sim.md, "engines")."""
        return {
            "id": self.cfg.id,
            "model": self.cfg.model_name,
            "profile": self.cfg.model,
            "kind": "sim",
            "api_url": self.api_url,
            "metrics_url": f"{self.api_url}/metrics",
            "kv_events_endpoint": self.publisher.endpoint if self.publisher else "",
            "kv_replay_endpoint": self.publisher.replay_endpoint if self.publisher else "",
            "gpus": list(self.cfg.gpus),
            "tp": self.cfg.tp,
            "role": self.role,
            "block_size": self.cfg.block_size,
            "num_gpu_blocks": self.num_gpu_blocks,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "max_model_len": self.max_model_len,
        }

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[error_middleware])
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        app.router.add_get("/metrics", self.metrics_view)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        app.router.add_post("/sim/v1/kv/pull", self.kv_pull)
        app.router.add_get("/sim/v1/engine", self.engine_view)
        return app

    async def start(self) -> None:
        if self.publisher is not None:
            await self.publisher.start()
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PULL_TIMEOUT_S))
        # handler_cancellation: a client that disconnects cancels its handler, which aborts
        # the request in the engine (see _generate's finally).
        self._runner = web.AppRunner(self.build_app(), handler_cancellation=True,
                                     access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.cfg.http_port, reuse_address=True)
        await site.start()
        self._driver = asyncio.create_task(self._drive(), name=f"engine-{self.cfg.id}")

    async def stop(self) -> None:
        if self._driver is not None:
            self._driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._driver
        for timer in self._hold_timers.values():
            timer.cancel()
        # End every open response (streams get a final chunk with finish_reason "abort")
        # so the HTTP server can close without waiting for them.
        for tracked in list(self._requests.values()):
            if not tracked.finished:
                tracked.finished = True
                tracked.finish_reason = "abort"
                tracked.context.queue.put_nowait(([], True))
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
        if self.publisher is not None:
            await self.publisher.close()

    # ------------------------------------------------------------------ the driver

    async def _drive(self) -> None:
        # Steps run back to back on a wall-clock schedule: each starts at the previous one's
        # deadline, so the driver's own overhead (HTTP, JSON, Python, a busy host) is absorbed
        # instead of stretching the simulated GPU time, which matters most when time_scale is
        # small. If the driver falls further behind than CATCH_UP_WALL_S it restarts the
        # schedule from now (the host is overloaded; simulated time slips).
        prev_deadline: float | None = None
        while True:
            wall_now = time.monotonic()
            if prev_deadline is not None and 0.0 <= wall_now - prev_deadline < CATCH_UP_WALL_S:
                # Catching up; but a step never starts before the latest arrival, so no
                # request is served before it came.
                start_wall = max(prev_deadline, self._last_submit_wall)
            else:
                start_wall = wall_now
            sim_start = self.clock.at(start_wall)
            try:
                step = self.driver.next_step(sim_start)
            except Exception:
                log.exception("engine %s: next_step failed", self.cfg.id)
                step = None
            if step is None:
                prev_deadline = None
                await self._publish_kv_events()
                self._wake.clear()
                # With requests pending but no step, poll; else sleep until one arrives.
                timeout = self.clock.wall(0.002) if self._has_pending() else None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                continue
            deadline = start_wall + self.clock.wall(step.duration)
            await asyncio.sleep(max(deadline - time.monotonic(), 0.0))
            sim_end = self.clock.at(deadline)
            try:
                updates = self.driver.finish(step, sim_end)
            except Exception:
                log.exception("engine %s: finish_step failed", self.cfg.id)
                updates = []
            prev_deadline = deadline
            tokens = adapters.step_tokens(step)
            if tokens:
                self.metrics.iteration_tokens.observe(tokens)
            for update in updates:
                update.tracked.context.queue.put_nowait(
                    (list(update.new_token_ids), update.finished))
            await self._publish_kv_events()

    def _has_pending(self) -> bool:
        stats = self.engine.stats()
        return bool(stats.num_running or stats.num_waiting)

    async def _publish_kv_events(self) -> None:
        try:
            events = self.engine.drain_kv_events()
        except Exception:
            log.exception("engine %s: drain_kv_events failed", self.cfg.id)
            return
        if events and self.publisher is not None:
            await self.publisher.publish(events)

    # ------------------------------------------------------------------ OpenAI API

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = parse_json_object(await request.read())
        req = parse_completion(body, served_model=self.cfg.model_name, encode=adapters.encode)
        return await self._generate(request, req)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = parse_json_object(await request.read())
        req = parse_chat(body, served_model=self.cfg.model_name, encode_chat=adapters.encode_chat)
        return await self._generate(request, req)

    async def _generate(self, request: web.Request, req: GenerationRequest) -> web.StreamResponse:
        prompt_len = len(req.prompt_token_ids)
        if req.do_remote_decode:
            # Prefill half of a P/D pair: compute the prompt, emit one token, keep the KV.
            req.max_tokens = 1
            req.stream = False
        if prompt_len + req.max_tokens > self.max_model_len:
            raise ApiError(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens. However,"
                f" you requested {prompt_len + req.max_tokens} tokens ({prompt_len} in the "
                f"messages, {req.max_tokens} in the completion). Please reduce the length of "
                "the messages or completion.",
                param="max_tokens",
            )
        header_id = request.headers.get("X-Request-Id")
        rid = new_request_id(req.kind, header_id)
        external = 0
        transfer_seconds = 0.0
        if req.do_remote_prefill:
            external, transfer_seconds = await self._pull_remote_kv(req, header_id)
        sim_request = adapters.make_request(
            request_id=rid,
            prompt_token_ids=req.prompt_token_ids,
            max_tokens=req.max_tokens,
            arrival_time=self.clock.now(),
            kv_from_remote=external,
            transfer_seconds=transfer_seconds,
            hold_for_remote_decode=req.do_remote_decode,
        )
        try:
            tracked = self.driver.submit(sim_request, external_tokens=external,
                                         context=_Client(req))
        except Exception as exc:
            log.warning("engine %s refused %s: %s", self.cfg.id, rid, exc)
            raise ApiError(400, f"The engine refused the request: {exc}") from exc
        self._requests[rid] = tracked
        self._last_submit_wall = time.monotonic()
        self._wake.set()
        try:
            if req.stream:
                return await self._stream(request, tracked)
            return await self._collect(tracked, header_id)
        finally:
            if not tracked.finished:
                # Client went away (handler cancelled) or the write failed.
                with contextlib.suppress(Exception):
                    self.driver.abort(rid)
                tracked.finish_reason = "abort"
                self.metrics.counters.request_success["abort"] += 1
                self._wake.set()
            elif tracked.hold and rid not in self._hold_timers:
                # Prefilled and held, but the client left before it got the transfer
                # params: nobody can ever pull these blocks, so free them now.
                with contextlib.suppress(Exception):
                    self.driver.take_held(rid)
                self._wake.set()
            self._requests.pop(rid, None)

    async def _collect(self, tracked: Tracked, header_id: str | None) -> web.Response:
        token_ids: list[int] = []
        queue = tracked.context.queue
        while True:
            new_ids, done = await queue.get()
            token_ids.extend(new_ids)
            if done:
                break
        req = tracked.context.req
        kv_params = None
        if tracked.hold and tracked.finish_reason != "abort":
            kv_params = self._hold(tracked, header_id)
        body = full_response(
            req, tracked.request_id, adapters.decode(token_ids), tracked.finish_reason,
            usage(len(req.prompt_token_ids), len(token_ids), _reported_cached(tracked)),
            kv_params,
        )
        return web.json_response(body)

    async def _stream(self, request: web.Request, tracked: Tracked) -> web.StreamResponse:
        req = tracked.context.req
        rid = tracked.request_id
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        created = int(time.time())
        prompt_len = len(req.prompt_token_ids)
        generated = 0
        if req.kind == "chat":
            await resp.write(sse(stream_chunk(req, rid, created, text="", role=True)))
        elif req.echo_prompt:
            await resp.write(sse(stream_chunk(req, rid, created, text=req.echo_prompt)))
        while True:
            new_ids, done = await tracked.context.queue.get()
            generated += len(new_ids)
            usage_body = (usage(prompt_len, generated, _reported_cached(tracked))
                          if req.continuous_usage else None)
            if new_ids or done:
                # Words are space-separated: every chunk after the first starts with one,
                # so the concatenated stream equals the non-streamed text.
                text = adapters.decode(new_ids)
                if text and generated > len(new_ids):
                    text = " " + text
                await resp.write(sse(stream_chunk(
                    req, rid, created, text=text,
                    finish_reason=tracked.finish_reason if done else None,
                    usage_body=usage_body,
                )))
            if done:
                break
        if req.include_usage:
            await resp.write(sse(stream_chunk(
                req, rid, created, usage_only=True,
                usage_body=usage(prompt_len, generated, _reported_cached(tracked)),
            )))
        await resp.write(sse("[DONE]"))
        await resp.write_eof()
        return resp

    # ------------------------------------------------------------------ other endpoints

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({
            "object": "list",
            "data": [{
                "id": self.cfg.model_name, "object": "model", "created": int(self.started_at),
                "owned_by": "vllm", "root": self.cfg.model, "parent": None,
                "max_model_len": self.max_model_len,
                "permission": [],
            }],
        })

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VLLM_VERSION})

    async def tokenize(self, request: web.Request) -> web.Response:
        body = parse_json_object(await request.read())
        if "messages" in body:
            from workers_agent.sim.server.protocol import message_text

            ids = adapters.encode_chat(message_text(body["messages"]))
        elif isinstance(body.get("prompt"), str):
            ids = adapters.encode(body["prompt"])
        else:
            raise ApiError(400, "give prompt (a string) or messages", param="prompt")
        return web.json_response({"count": len(ids), "max_model_len": self.max_model_len,
                                  "tokens": ids, "token_strs": None})

    async def detokenize(self, request: web.Request) -> web.Response:
        body = parse_json_object(await request.read())
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens
        ):
            raise ApiError(400, "tokens must be a list of token ids", param="tokens")
        return web.json_response({"prompt": adapters.decode(tokens)})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        """vLLM's dev-mode endpoint: forget all cached blocks (publishes AllBlocksCleared)."""
        if not self.engine.reset_prefix_cache():
            raise ApiError(409, "blocks are in use; the prefix cache can be reset only when "
                           "the engine is idle")
        await self._publish_kv_events()
        return web.Response(status=200)

    async def metrics_view(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def engine_view(self, request: web.Request) -> web.Response:
        stats = self.engine.stats()
        return web.json_response({
            **self.describe(),
            "node": self.location.node,
            "time_scale": self.clock.time_scale,
            "held_requests": len(self.driver.held),
            "in_flight": len(self._requests),
            "stats": adapters.stats_dict(stats),
            "last_transfer": getattr(self, "last_transfer", None),
            "kv_events": {
                "next_seq": self.publisher.next_seq if self.publisher else 0,
                "dropped": self.publisher.dropped if self.publisher else 0,
            },
        })
