"""One simulated engine behind a vLLM-0.32-compatible HTTP server (aiohttp) and ZMQ sockets.

The engine model (workers_agent.sim.engine) is pure and clock-free; this module drives it in
real time: take the next step, sleep its duration (scaled by ``time_scale``), finish it, and
push the produced tokens to the waiting HTTP responses. All engine calls happen on the one
asyncio loop, so the model needs no locking.

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

from workers_agent.sim.fleetconfig import EngineConfig
from workers_agent.sim.kvevents import KvEventPublisher
from workers_agent.sim.metrics import CONTENT_TYPE, CacheConfigInfo, EngineMetrics
from workers_agent.sim.server import adapters
from workers_agent.sim.server.pd import EngineLocation, KvPath, kv_path
from workers_agent.sim.server.protocol import (
    ApiError,
    GenerationRequest,
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
class _Tracked:
    """A request in flight, as the HTTP side sees it."""

    rid: str
    req: GenerationRequest
    arrival: float
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    generated: int = 0
    cached_tokens: int = 0
    external_tokens: int = 0
    finished: bool = False
    finish_reason: str | None = None
    hold: bool = False


@dataclass
class _Held:
    """KV blocks a prefill engine keeps for a decode engine to pull."""

    rid: str
    header_id: str | None
    num_tokens: int
    block_ids: list[int]
    expires: asyncio.TimerHandle | None = None


class EngineServer:
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
        self._requests: dict[str, _Tracked] = {}
        self._held: dict[str, _Held] = {}
        self._held_by_header: dict[str, str] = {}
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
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_error_middleware])
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
        for held in self._held.values():
            if held.expires:
                held.expires.cancel()
        # End every open response (streams get a final chunk with finish_reason "abort")
        # so the HTTP server can close without waiting for them.
        for tracked in list(self._requests.values()):
            if not tracked.finished:
                tracked.finished = True
                tracked.finish_reason = "abort"
                tracked.queue.put_nowait(([], True))
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
                step = self.engine.next_step(sim_start)
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
            self._mark_scheduled(step, sim_start)
            deadline = start_wall + self.clock.wall(step.duration)
            await asyncio.sleep(max(deadline - time.monotonic(), 0.0))
            sim_end = self.clock.at(deadline)
            try:
                outputs = self.engine.finish_step(step, sim_end)
            except Exception:
                log.exception("engine %s: finish_step failed", self.cfg.id)
                outputs = []
            prev_deadline = deadline
            tokens = adapters.step_tokens(step)
            if tokens:
                self.metrics.iteration_tokens.observe(tokens)
            for out in outputs:
                self._dispatch(out, sim_end)
            await self._publish_kv_events()

    def _has_pending(self) -> bool:
        stats = self.engine.stats()
        return bool(stats.num_running or stats.num_waiting)

    def _mark_scheduled(self, step: Any, now: float) -> None:
        ids = adapters.step_request_ids(step)
        for rid in ids:
            tracked = self._requests.get(rid)
            if tracked is not None and tracked.scheduled_at is None:
                tracked.scheduled_at = now

    def _dispatch(self, out: Any, now: float) -> None:
        tracked = self._requests.get(out.request_id)
        if tracked is None:
            return
        new_ids = list(out.new_token_ids or [])
        if out.first_token or (tracked.first_token_at is None and new_ids):
            if tracked.first_token_at is None:
                tracked.first_token_at = now
                # vLLM reports local prefix-cache hits and KV received from a prefill
                # engine together as cached tokens.
                external = int(getattr(out, "num_external_tokens", tracked.external_tokens))
                tracked.cached_tokens = int(out.num_cached_tokens or 0) + external
                self.metrics.ttft.observe(max(now - tracked.arrival, 0.0))
        elif new_ids and tracked.last_token_at is not None:
            gap = (now - tracked.last_token_at) / len(new_ids)
            for _ in new_ids:
                self.metrics.itl.observe(gap)
        if new_ids:
            tracked.last_token_at = now
            tracked.generated += len(new_ids)
        if out.finished:
            tracked.finished = True
            tracked.finish_reason = out.finish_reason or "length"
            self._record_finished(tracked, now)
        tracked.queue.put_nowait((new_ids, bool(out.finished)))

    def _record_finished(self, tracked: _Tracked, now: float) -> None:
        first = tracked.first_token_at if tracked.first_token_at is not None else now
        scheduled = tracked.scheduled_at if tracked.scheduled_at is not None else tracked.arrival
        scheduled = min(scheduled, first)
        self.metrics.record_finished(
            reason=tracked.finish_reason or "length",
            e2e=now - tracked.arrival,
            queued=scheduled - tracked.arrival,
            prefill=first - scheduled,
            decode=now - first,
            prompt_tokens=len(tracked.req.prompt_token_ids),
            generation_tokens=tracked.generated,
            max_tokens=tracked.req.max_tokens,
        )

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
        tracked = _Tracked(rid=rid, req=req, arrival=self.clock.now(), hold=req.do_remote_decode,
                           external_tokens=external)
        self._requests[rid] = tracked
        sim_request = adapters.make_request(
            request_id=rid,
            prompt_token_ids=req.prompt_token_ids,
            max_tokens=req.max_tokens,
            arrival_time=tracked.arrival,
            kv_from_remote=external,
            transfer_seconds=transfer_seconds,
            hold_for_remote_decode=req.do_remote_decode,
        )
        try:
            self.engine.submit(sim_request)
        except Exception as exc:
            self._requests.pop(rid, None)
            log.warning("engine %s refused %s: %s", self.cfg.id, rid, exc)
            raise ApiError(400, f"The engine refused the request: {exc}") from exc
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
                    self.engine.abort(rid)
                tracked.finish_reason = "abort"
                self.metrics.counters.request_success["abort"] += 1
                self._wake.set()
            elif tracked.hold and rid not in self._held:
                # Prefilled and held, but the client left before it got the transfer
                # params: nobody can ever pull these blocks, so free them now.
                with contextlib.suppress(Exception):
                    self.engine.release_held(rid)
                self._wake.set()
            self._requests.pop(rid, None)

    async def _collect(self, tracked: _Tracked, header_id: str | None) -> web.Response:
        token_ids: list[int] = []
        while True:
            new_ids, done = await tracked.queue.get()
            token_ids.extend(new_ids)
            if done:
                break
        req = tracked.req
        kv_params = None
        if tracked.hold:
            kv_params = self._hold(tracked, header_id)
        body = full_response(
            req, tracked.rid, adapters.decode(token_ids), tracked.finish_reason,
            usage(len(req.prompt_token_ids), len(token_ids), tracked.cached_tokens), kv_params,
        )
        return web.json_response(body)

    async def _stream(self, request: web.Request, tracked: _Tracked) -> web.StreamResponse:
        req = tracked.req
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        created = int(time.time())
        prompt_len = len(req.prompt_token_ids)
        generated = 0
        if req.kind == "chat":
            await resp.write(sse(stream_chunk(req, tracked.rid, created, text="", role=True)))
        elif req.echo_prompt:
            await resp.write(sse(stream_chunk(req, tracked.rid, created, text=req.echo_prompt)))
        while True:
            new_ids, done = await tracked.queue.get()
            generated += len(new_ids)
            usage_body = (usage(prompt_len, generated, tracked.cached_tokens)
                          if req.continuous_usage else None)
            if new_ids or done:
                # Words are space-separated: every chunk after the first starts with one,
                # so the concatenated stream equals the non-streamed text.
                text = adapters.decode(new_ids)
                if text and generated > len(new_ids):
                    text = " " + text
                await resp.write(sse(stream_chunk(
                    req, tracked.rid, created, text=text,
                    finish_reason=tracked.finish_reason if done else None,
                    usage_body=usage_body,
                )))
            if done:
                break
        if req.include_usage:
            await resp.write(sse(stream_chunk(
                req, tracked.rid, created, usage_only=True,
                usage_body=usage(prompt_len, generated, tracked.cached_tokens),
            )))
        await resp.write(sse("[DONE]"))
        await resp.write_eof()
        return resp

    # ------------------------------------------------------------------ P/D: prefill side

    def _hold(self, tracked: _Tracked, header_id: str | None) -> dict[str, Any]:
        num_tokens = len(tracked.req.prompt_token_ids)
        blocks = adapters.held_block_ids(self.engine, tracked.rid, num_tokens,
                                         self.cfg.block_size)
        held = _Held(rid=tracked.rid, header_id=header_id, num_tokens=num_tokens,
                     block_ids=blocks)
        loop = asyncio.get_running_loop()
        held.expires = loop.call_later(self.clock.wall(self.cfg.kv_hold_timeout_s),
                                       self._expire, tracked.rid)
        self._held[tracked.rid] = held
        if header_id:
            self._held_by_header[header_id] = tracked.rid
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.cfg.id,
            "remote_block_ids": blocks,
            "remote_host": self.host,
            "remote_port": self.cfg.http_port,
            "remote_request_id": tracked.rid,
            "remote_num_tokens": num_tokens,
            "tp_size": self.cfg.tp,
            "transfer_mode": "pull",
        }

    def _expire(self, rid: str) -> None:
        held = self._held.pop(rid, None)
        if held is None:
            return
        if held.header_id:
            self._held_by_header.pop(held.header_id, None)
        with contextlib.suppress(Exception):
            self.engine.release_held(rid)
        self.metrics.counters.nixl_expired_requests += 1
        self._wake.set()
        log.info("engine %s: held KV of %s expired unpulled", self.cfg.id, rid)

    async def kv_pull(self, request: web.Request) -> web.Response:
        """Internal: a decode engine takes the KV of a held prefill (releases the blocks)."""
        body = parse_json_object(await request.read())
        rid = body.get("remote_request_id")
        engine_id = body.get("remote_engine_id")
        if engine_id not in (None, self.cfg.id):
            raise ApiError(404, f"this is engine {self.cfg.id!r}, not {engine_id!r}",
                           code="kv_transfer_params_unknown")
        if not isinstance(rid, str) or rid not in self._held:
            header = body.get("x_request_id")
            rid = self._held_by_header.get(header) if isinstance(header, str) else None
        if rid is None or rid not in self._held:
            raise ApiError(404, "no held KV for this request: unknown, already pulled or "
                           "expired", code="kv_transfer_params_unknown")
        try:
            puller = EngineLocation.from_dict(body.get("puller"))
        except ValueError as exc:
            raise ApiError(400, str(exc), param="puller") from exc
        held = self._held.pop(rid)
        if held.expires:
            held.expires.cancel()
        if held.header_id:
            self._held_by_header.pop(held.header_id, None)
        with contextlib.suppress(Exception):
            self.engine.release_held(rid)
        self._wake.set()
        nbytes = held.num_tokens * self.kv_bytes_per_token
        path = kv_path(self.location, puller)
        if self.telemetry is not None:
            self.telemetry.record_kv_transfer(self.cfg.id, path, "tx", nbytes)
        return web.json_response({
            "engine_id": self.cfg.id,
            "profile": self.cfg.model,
            "gpu_profile": self.gpu_profile,
            "num_tokens": held.num_tokens,
            "kv_bytes": nbytes,
            "block_ids": held.block_ids,
            "location": self.location.to_dict(),
        })

    # ------------------------------------------------------------------ P/D: decode side

    async def _pull_remote_kv(self, req: GenerationRequest,
                              header_id: str | None) -> tuple[int, float]:
        params = req.kv_transfer_params or {}
        host, port = params.get("remote_host"), params.get("remote_port")
        if not isinstance(host, str) or not host:
            raise ApiError(400, "kv_transfer_params.remote_host is missing",
                           param="kv_transfer_params")
        if isinstance(port, str) and port.isdigit():
            port = int(port)
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise ApiError(400, "kv_transfer_params.remote_port must be a TCP port",
                           param="kv_transfer_params")
        remote_rid = params.get("remote_request_id")
        if remote_rid is not None and not isinstance(remote_rid, str):
            raise ApiError(400, "kv_transfer_params.remote_request_id must be a string",
                           param="kv_transfer_params")
        assert self._session is not None
        payload = {
            "remote_request_id": remote_rid,
            "remote_engine_id": params.get("remote_engine_id"),
            "x_request_id": header_id,
            "puller": self.location.to_dict(),
        }
        url = f"http://{host}:{port}/sim/v1/kv/pull"
        try:
            async with self._session.post(url, json=payload) as resp:
                answer = await resp.json(content_type=None)
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self.metrics.counters.nixl_failed_transfers += 1
            raise ApiError(502, f"KV transfer from {host}:{port} failed: {exc!r}",
                           code="kv_transfer_failed") from exc
        if status != 200:
            self.metrics.counters.nixl_failed_transfers += 1
            message = (answer or {}).get("error", {}).get("message", f"HTTP {status}")
            raise ApiError(404 if status == 404 else 502,
                           f"KV transfer from {host}:{port} refused: {message}",
                           code="kv_transfer_params_unknown" if status == 404
                           else "kv_transfer_failed")
        if answer.get("profile") != self.cfg.model:
            self.metrics.counters.nixl_failed_transfers += 1
            raise ApiError(400, f"the remote KV is for model profile {answer.get('profile')!r}, "
                           f"this engine serves {self.cfg.model!r}",
                           param="kv_transfer_params")
        try:
            source = EngineLocation.from_dict(answer.get("location"))
        except ValueError as exc:
            raise ApiError(502, f"bad pull answer: {exc}", code="kv_transfer_failed") from exc
        tokens = min(int(answer.get("num_tokens", 0)), len(req.prompt_token_ids))
        nbytes = tokens * self.kv_bytes_per_token
        path = kv_path(source, self.location)
        seconds = self.transfer_seconds(path, nbytes)
        self.metrics.record_transfer(seconds=seconds, nbytes=nbytes, tokens=tokens)
        if self.telemetry is not None:
            self.telemetry.record_kv_transfer(self.cfg.id, path, "rx", nbytes)
        self.last_transfer = {"path": path.describe(), "bytes": nbytes, "seconds": seconds,
                              "tokens": tokens, "source_engine": source.engine_id}
        return tokens, seconds

    def transfer_seconds(self, path: KvPath, nbytes: int) -> float:
        return adapters.transfer_seconds(path, nbytes, self.hardware_profile, self.cfg.tp)

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
            "held_requests": len(self._held),
            "in_flight": len(self._requests),
            "stats": adapters.stats_dict(stats),
            "last_transfer": getattr(self, "last_transfer", None),
            "kv_events": {
                "next_seq": self.publisher.next_seq if self.publisher else 0,
                "dropped": self.publisher.dropped if self.publisher else 0,
            },
        })


@web.middleware
async def _error_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except ApiError as exc:
        return web.json_response(exc.body(), status=exc.status)
    except web.HTTPException as exc:
        if exc.status >= 400:
            err = ApiError(exc.status, exc.reason or "error")
            return web.json_response(err.body(), status=exc.status)
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:  # never a bare 500 page: log and answer OpenAI-shaped
        log.exception("unhandled error in %s %s", request.method, request.path)
        err = ApiError(500, f"internal error: {exc.__class__.__name__}")
        return web.json_response(err.body(), status=500)
