"""The gateway's admin side: the signed routing-table API (push, inspect, decision log) and
the signed pull from the control plane. A mixin of :class:`gateway.app.Gateway`.

Everything that can be refused before a pushed body is read is refused first (signature
headers, Content-Length), and bodies are read in chunks and cut off at
``max_table_bytes``, pushed or pulled: a hostile or broken sender costs no memory.
"""

from __future__ import annotations

import asyncio
import logging
import time
from urllib.parse import urlsplit

import aiohttp
import orjson
from aiohttp import web

from . import signing

log = logging.getLogger("gateway")


class BodyTooLarge(ValueError):
    pass


async def read_limited(stream, limit: int) -> bytes:
    """The whole body, refused as soon as it passes ``limit`` bytes (never buffered beyond)."""
    chunks, size = [], 0
    async for chunk in stream.iter_chunked(256 * 1024):
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"body is over the {limit}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


class AdminAPI:
    """Needs: config, store, metrics, session, rng, approx, precise, loads, subscriber,
    pairs, decision_log, pull_etag, last_pull_error (set by Gateway)."""

    def kv_streams_view(self) -> dict[str, dict]:
        """Per worker: the stream's state and the blocks the precise index holds for it."""
        if self.subscriber is None:
            return {}
        held: dict[str, int] = {}
        for index in self.precise.values():
            for worker_id, blocks in index._by_worker.items():
                held[worker_id] = held.get(worker_id, 0) + len(blocks)
        return {w: {**stream.stats(), "blocks": held.get(w, 0)}
                for w, stream in self.subscriber.streams.items()}

    # ------------------------------------------------------------------ pull (cold start)

    async def _pull_loop(self) -> None:
        delay = 0.5
        while self.store.current is None:
            if await self.pull_once():
                break
            await asyncio.sleep(delay * (0.5 + self.rng.random()))
            delay = min(delay * 2, 10.0)
        if self.config.pull_interval_s <= 0:
            return
        while True:
            await asyncio.sleep(self.config.pull_interval_s)
            await self.pull_once()

    async def pull_once(self) -> bool:
        cfg = self.config
        url = f"{cfg.control_plane_url.rstrip('/')}/routing/v1/clusters/{cfg.cluster}/table"
        path = urlsplit(url).path
        headers = {
            signing.GATEWAY_HEADER: cfg.gateway_name or "",
            signing.APPLIED_VERSION_HEADER: str(self.store.version),
            **signing.signed_headers(cfg.admin_secrets[0], "GET", path, b"", now=time.time()),
        }
        if self.pull_etag and self.store.current is not None:
            headers["If-None-Match"] = self.pull_etag
        try:
            async with self.session.get(
                url, headers=headers, timeout=aiohttp.ClientTimeout(total=10)
            ) as response:
                if response.status == 304:
                    return True
                limit = cfg.max_table_bytes
                if (response.content_length or 0) > limit:
                    raise BodyTooLarge(f"table of {response.content_length} bytes is over the "
                                       f"{limit}-byte limit")
                raw = await read_limited(response.content, limit)
                if response.status != 200:
                    self.last_pull_error = f"HTTP {response.status}: {raw[:200]!r}"
                    log.warning("table pull failed: %s", self.last_pull_error)
                    return False
                result = self.store.apply(orjson.loads(raw))
                self.metrics.child(self.metrics.table_updates, result.outcome, "pull").inc()
                if result.outcome != "nack":
                    self.pull_etag = response.headers.get("ETag")
                self.last_pull_error = result.error if result.outcome == "nack" else ""
                return result.outcome != "nack"
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
            if isinstance(exc, BodyTooLarge):
                self.metrics.child(self.metrics.table_updates, "too_large", "pull").inc()
            self.last_pull_error = repr(exc)
            log.info("table pull failed: %r", exc)
            return False

    # ------------------------------------------------------------------ admin API

    def _signature_problem(self, request: web.Request, body: bytes) -> str | None:
        if not self.config.admin_secrets:
            return "admin API disabled (no secret configured)"
        try:
            signing.verify(
                self.config.admin_secrets,
                request.headers.get(signing.TIMESTAMP_HEADER),
                request.headers.get(signing.SIGNATURE_HEADER),
                request.method,
                request.path,
                body,
                now=time.time(),
            )
        except signing.SignatureError as exc:
            return exc.reason
        return None

    def _refuse_push(self, status: int, outcome: str, reason: str, error: str):
        self.metrics.child(self.metrics.table_updates, outcome, "push").inc()
        return web.json_response({"status": outcome, "applied_version": self.store.version,
                                  "reason": reason, "error": error}, status=status)

    async def admin_put_table(self, request: web.Request) -> web.Response:
        # Everything that can be refused before the body is read is refused first: an
        # unsigned or oversized push costs no memory.
        problem = None
        if not self.config.admin_secrets:
            problem = "admin API disabled (no secret configured)"
        else:
            try:
                signing.check_headers(request.headers.get(signing.TIMESTAMP_HEADER),
                                      request.headers.get(signing.SIGNATURE_HEADER),
                                      now=time.time())
            except signing.SignatureError as exc:
                problem = exc.reason
        if problem:
            return self._refuse_push(401, "unauthorized", "unauthorized", problem)
        limit = self.config.max_table_bytes
        if (request.content_length or 0) > limit:
            return self._refuse_push(422, "nack", "too_large",
                                     f"table of {request.content_length} bytes is over the "
                                     f"{limit}-byte limit")
        try:
            raw = await read_limited(request.content, limit)
        except BodyTooLarge as exc:
            return self._refuse_push(422, "nack", "too_large", str(exc))
        problem = self._signature_problem(request, raw)
        if problem:
            return self._refuse_push(401, "unauthorized", "unauthorized", problem)
        expected = request.headers.get(signing.EXPECTED_VERSION_HEADER)
        if expected and expected.isdigit() and int(expected) != self.store.version:
            log.info("sender believed v%s applied; actual v%d", expected, self.store.version)
        try:
            table = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return self._refuse_push(422, "nack", "not_json", f"body is not JSON: {exc}")
        result = self.store.apply(table)
        self.metrics.child(self.metrics.table_updates, result.outcome, "push").inc()
        if result.outcome == "ack" and self.peers is not None:
            self.peers.table(raw)
        return web.json_response(result.as_dict(), status=result.http_status)

    async def admin_get_table(self, request: web.Request) -> web.Response:
        problem = self._signature_problem(request, b"")
        if problem:
            return web.json_response({"status": "unauthorized", "error": problem}, status=401)
        current = self.store.current
        return web.json_response(
            {
                "applied_version": self.store.version,
                "last_error": self.store.last_error,
                "last_pull_error": self.last_pull_error,
                "table": current.raw if current else None,
                "loads": {
                    w: {"prefill_blocks": v.prefill_blocks, "decode_blocks": v.decode_blocks,
                        "in_flight": v.in_flight}
                    for w, v in self.loads.items()
                },
                "approx_index_entries": len(self.approx),
                "kv_event_workers": {m: idx.workers() for m, idx in self.precise.items()},
                "kv_streams": self.kv_streams_view(),
                "pd_pairs": self.pairs.view(),
            }
        )

    async def admin_health(self, request: web.Request) -> web.Response:
        """What the control plane polls between pushes: the P/D pairs' health and the
        KV-event streams' state (small; the table itself is not in it)."""
        problem = self._signature_problem(request, b"")
        if problem:
            return web.json_response({"status": "unauthorized", "error": problem}, status=401)
        return web.json_response({
            "applied_version": self.store.version,
            "pd_pairs": self.pairs.view(),
            "kv_streams": {w: {k: s[k] for k in ("stalled", "stall_reason", "complete")
                               if k in s}
                           for w, s in self.kv_streams_view().items()},
        })

    async def admin_decisions(self, request: web.Request) -> web.Response:
        """The sampled decision log, newest first (``?limit=N``, at most 1000)."""
        problem = self._signature_problem(request, b"")
        if problem:
            return web.json_response({"status": "unauthorized", "error": problem}, status=401)
        try:
            limit = min(max(int(request.query.get("limit", "100")), 1), 1000)
        except ValueError:
            limit = 100
        log_ = self.decision_log
        return web.json_response({"sample_rate": log_.sample_rate, "requests_seen": log_.seen,
                                  "decisions": log_.recent(limit)})
