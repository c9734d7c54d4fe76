"""The HTTP half of the P/D hand-off between simulated engine servers (NixlConnector-like
"pull" semantics): the prefill server holds a finished prompt's blocks (in the engine
driver, :class:`workers_agent.sim.driver.HeldKv`) and answers ``/sim/v1/kv/pull``; the
decode server pulls before it submits, and charges the transfer time over the path between
the two locations (:mod:`workers_agent.sim.server.pd`).

A mixin of :class:`workers_agent.sim.server.engine_server.EngineServer`: it uses the
server's driver, clock, config, location, metrics and HTTP session.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
from aiohttp import web

from workers_agent.sim.driver import Tracked
from workers_agent.sim.server import adapters
from workers_agent.sim.server.pd import EngineLocation, KvPath, kv_path
from workers_agent.sim.server.protocol import ApiError, GenerationRequest, parse_json_object

log = logging.getLogger(__name__)


class PdHttp:
    # ------------------------------------------------------------------ prefill side

    def _hold(self, tracked: Tracked, header_id: str | None) -> dict[str, Any]:
        """Transfer params for a held prefill; its blocks expire unpulled after the
        configured hold timeout."""
        rid = tracked.request_id
        held = self.driver.held.get(rid)
        num_tokens = tracked.prompt_tokens
        blocks = held.block_ids if held and held.block_ids else list(
            range((num_tokens + self.cfg.block_size - 1) // self.cfg.block_size))
        if held is not None:
            held.context = header_id
        loop = asyncio.get_running_loop()
        self._hold_timers[rid] = loop.call_later(
            self.clock.wall(self.cfg.kv_hold_timeout_s), self._expire, rid)
        if header_id:
            self._held_by_header[header_id] = rid
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.cfg.id,
            "remote_block_ids": blocks,
            "remote_host": self.host,
            "remote_port": self.cfg.http_port,
            "remote_request_id": rid,
            "remote_num_tokens": num_tokens,
            "tp_size": self.cfg.tp,
            "transfer_mode": "pull",
        }

    def _release_hold(self, rid: str):
        timer = self._hold_timers.pop(rid, None)
        if timer is not None:
            timer.cancel()
        held = self.driver.take_held(rid)
        if held is not None and held.context:
            self._held_by_header.pop(held.context, None)
        self._wake.set()
        return held

    def _expire(self, rid: str) -> None:
        self._hold_timers.pop(rid, None)
        if rid not in self.driver.held:
            return
        self._release_hold(rid)
        self.metrics.counters.nixl_expired_requests += 1
        log.info("engine %s: held KV of %s expired unpulled", self.cfg.id, rid)

    async def kv_pull(self, request: web.Request) -> web.Response:
        """Internal: a decode engine takes the KV of a held prefill (releases the blocks)."""
        body = parse_json_object(await request.read())
        rid = body.get("remote_request_id")
        engine_id = body.get("remote_engine_id")
        if engine_id not in (None, self.cfg.id):
            raise ApiError(404, f"this is engine {self.cfg.id!r}, not {engine_id!r}",
                           code="kv_transfer_params_unknown")
        if not isinstance(rid, str) or rid not in self._hold_timers:
            header = body.get("x_request_id")
            rid = self._held_by_header.get(header) if isinstance(header, str) else None
        if rid is None or rid not in self._hold_timers or rid not in self.driver.held:
            raise ApiError(404, "no held KV for this request: unknown, already pulled or "
                           "expired", code="kv_transfer_params_unknown")
        try:
            puller = EngineLocation.from_dict(body.get("puller"))
        except ValueError as exc:
            raise ApiError(400, str(exc), param="puller") from exc
        held = self._release_hold(rid)
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

    # ------------------------------------------------------------------ decode side

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

