"""The agent's websocket transport: connect, hello/welcome, reports, commands, reconnect.

- Auth: ``Authorization: Bearer <token>`` on the upgrade request.
- Heartbeats: websocket pings every ``heartbeat_s``; a missed pong closes the connection.
- Reconnect: exponential backoff with full jitter, ``uniform(0, min(cap, base·2^n))``,
  reset after a successful welcome — a control-plane restart does not bring every agent
  back in the same instant (RELIABILITY.md: no fixed-delay reconnects).
- While disconnected, reports go into a bounded buffer; when full the oldest is dropped
  (newest state kept) and counted; the count travels in ``report.agent.dropped_reports``.
  After reconnecting the backlog is sent paced under the server's announced rate limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque

import orjson
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from . import protocol as proto
from .agent import Agent
from .commands import CommandRunner
from .config import AgentConfig

log = logging.getLogger(__name__)

FATAL_CLOSE_CODES = {proto.CLOSE_UNAUTHORIZED, proto.CLOSE_FORBIDDEN,
                     proto.CLOSE_UNSUPPORTED_VERSION}
WELCOME_TIMEOUT_S = 15.0


def backoff_delay(attempt: int, base: float, cap: float, rng=random.random) -> float:
    """Full jitter: uniform in [0, min(cap, base · 2^attempt)]."""
    return rng() * min(cap, base * (2 ** min(attempt, 32)))


class ReportBuffer:
    """Bounded FIFO of reports waiting to be sent; drops the oldest when full."""

    def __init__(self, maxlen: int):
        self.items: deque[dict] = deque()
        self.maxlen = maxlen
        self.dropped = 0
        self.ready = asyncio.Event()

    def push(self, report: dict) -> None:
        while len(self.items) >= self.maxlen:
            self.items.popleft()
            self.dropped += 1
        self.items.append(report)
        self.ready.set()

    def pop(self) -> dict | None:
        if not self.items:
            self.ready.clear()
            return None
        return self.items.popleft()

    def __len__(self) -> int:
        return len(self.items)


class ServerClosed(Exception):
    def __init__(self, code: int | None, reason: str):
        super().__init__(f"closed by server ({code}): {reason}")
        self.code = code


class AgentTransport:
    def __init__(self, cfg: AgentConfig, agent: Agent):
        self.cfg = cfg
        self.agent = agent
        self.buffer = ReportBuffer(cfg.buffer_size)
        self.runner = CommandRunner(agent.hooks, agent.engine_ids)
        self.interval = cfg.report_interval_s or proto.DEFAULT_REPORT_INTERVAL_S
        self.max_rate = proto.DEFAULT_MAX_REPORTS_PER_S
        self.reconnects = 0
        self.connected = asyncio.Event()
        self.node_id: int | None = None
        self.errors_received = 0
        self.last_error: dict | None = None
        self.pending_results: deque[dict] = deque(maxlen=64)
        self.stop_event = asyncio.Event()
        self.clock_offset = 0.0  # server clock − agent clock, from welcome
        self._tasks: set[asyncio.Task] = set()

    # ------------------------------------------------------------------ top level

    async def run(self) -> None:
        """Collect and send until stop() is called."""
        collector = asyncio.create_task(self._collect_loop())
        try:
            await self._connect_loop()
        finally:
            collector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await collector

    def stop(self) -> None:
        self.stop_event.set()

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop_event.wait(), seconds)

    def counters(self) -> dict:
        return {"dropped_reports": self.buffer.dropped, "buffered": len(self.buffer),
                "reconnects": self.reconnects}

    async def _collect_loop(self) -> None:
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            try:
                report = await self.agent.acollect(self.counters())
                self.buffer.push(report)
            except OSError as exc:  # a source (sim node, engine) is unreachable right now
                log.warning("collecting a report failed: %s", exc)
            except Exception:
                log.exception("collecting a report failed")
            next_at += self.interval
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind (slow engine): don't burst to catch up
                next_at, delay = time.monotonic(), 0
            await self._sleep(delay)

    async def _connect_loop(self) -> None:
        attempt = 0
        token = self.cfg.resolve_token()
        while not self.stop_event.is_set():
            welcomed = False
            try:
                async with connect(
                    self.cfg.server,
                    additional_headers={"Authorization": f"Bearer {token}"},
                    ping_interval=self.cfg.heartbeat_s, ping_timeout=self.cfg.heartbeat_s,
                    max_size=4 * proto.MAX_FRAME_BYTES, open_timeout=10, close_timeout=2,
                ) as ws:
                    welcomed = await self._session(ws)
            except ServerClosed as exc:
                log.warning("%s", exc)
                if exc.code in FATAL_CLOSE_CODES:
                    # Retrying a refused token fast is pointless: go straight to the cap.
                    attempt = max(attempt, 32)
            except (OSError, TimeoutError, InvalidHandshake, ConnectionClosed) as exc:
                log.warning("connection to %s failed: %s", self.cfg.server, exc)
            except Exception:
                log.exception("agent session failed")
            finally:
                self.connected.clear()
            if self.stop_event.is_set():
                break
            if welcomed:
                attempt = 0
            delay = backoff_delay(attempt, self.cfg.backoff_base_s, self.cfg.backoff_cap_s)
            attempt += 1
            self.reconnects += 1
            log.info("reconnecting in %.2fs", delay)
            await self._sleep(delay)

    # ------------------------------------------------------------------ one connection

    async def _recv_json(self, ws, timeout: float) -> dict:
        raw = await asyncio.wait_for(ws.recv(), timeout)
        msg = orjson.loads(raw)
        return msg if isinstance(msg, dict) else {}

    async def _session(self, ws) -> bool:
        hello = await asyncio.to_thread(self.agent.hello)
        await ws.send(orjson.dumps(hello).decode())
        try:
            welcome = await self._recv_json(ws, WELCOME_TIMEOUT_S)
        except ConnectionClosed as exc:
            raise ServerClosed(exc.rcvd.code if exc.rcvd else None,
                               exc.rcvd.reason if exc.rcvd else "") from None
        if welcome.get("type") == "error":
            code = None
            with contextlib.suppress(ConnectionClosed, TimeoutError):
                await asyncio.wait_for(ws.wait_closed(), 2)
            if ws.close_code is not None:
                code = ws.close_code
            raise ServerClosed(code, f"{welcome.get('code')}: {welcome.get('reason')}")
        errors = proto.validate_welcome(welcome)
        if errors:
            raise ServerClosed(None, f"bad welcome: {errors[0].reason} at {errors[0].path}")
        self.node_id = welcome["node_id"]
        if isinstance(welcome.get("server_time"), int | float):
            self.clock_offset = welcome["server_time"] - time.time()
        if not self.cfg.report_interval_s:
            self.interval = float(welcome["report_interval_s"])
        limits = welcome.get("limits") or {}
        self.max_rate = float(limits.get("max_reports_per_s") or self.max_rate)
        self.connected.set()
        log.info("connected as node %s (protocol %s, every %.1fs)", self.node_id,
                 welcome["protocol"], self.interval)
        while self.pending_results:
            await ws.send(orjson.dumps(self.pending_results.popleft()).decode())
        sender = asyncio.create_task(self._send_loop(ws))
        stopper = asyncio.create_task(self._close_on_stop(ws))
        try:
            async for raw in ws:
                await self._on_message(ws, raw)
        except ConnectionClosed:
            pass
        finally:
            for task in (sender, stopper):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                    await task
        if ws.close_code in FATAL_CLOSE_CODES:
            raise ServerClosed(ws.close_code, ws.close_reason or "")
        return True

    async def _close_on_stop(self, ws) -> None:
        await self.stop_event.wait()
        await ws.close(1001, "agent stopping")

    async def _send_loop(self, ws) -> None:
        min_gap = 1.0 / max(self.max_rate * 0.8, 0.1)
        while True:
            await self.buffer.ready.wait()
            report = self.buffer.pop()
            if report is None:
                continue
            if self.agent.inventory_changed():
                inv = await asyncio.to_thread(self.agent.inventory)
                await ws.send(orjson.dumps({"type": "inventory", "inventory": inv}).decode())
            try:
                await ws.send(orjson.dumps(report).decode())
            except ConnectionClosed:
                self.buffer.items.appendleft(report)  # not sent: keep it for the next session
                raise
            if len(self.buffer):
                await asyncio.sleep(min_gap)  # backlog: stay under the server's rate limit

    async def _on_message(self, ws, raw) -> None:
        try:
            msg = orjson.loads(raw)
        except orjson.JSONDecodeError:
            log.warning("undecodable frame from server")
            return
        kind = msg.get("type") if isinstance(msg, dict) else None
        if kind == "command":
            task = asyncio.create_task(self._run_command(ws, msg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif kind == "error":
            self.errors_received += 1
            self.last_error = msg
            log.warning("server error %s: %s (ref %s)", msg.get("code"), msg.get("reason"),
                        msg.get("ref"))
        elif kind == "ack":
            pass
        else:
            log.debug("ignoring server frame of type %r", kind)

    async def _run_command(self, ws, msg: dict) -> None:
        errors = proto.validate_command(msg)
        expires_at = msg.get("expires_at")
        if errors:
            status, detail, values = "refused", errors[0].reason, {}
        elif isinstance(expires_at, int | float) and time.time() + self.clock_offset > expires_at:
            status, detail, values = "refused", "command expired before it arrived", {}
        else:
            log.info("command %s %s", msg["command"], msg.get("args"))
            status, detail, values = await self.runner.run(msg["command"], msg.get("args", {}))
            if status == "succeeded":
                self.agent.command_applied(msg["command"], values)
        result = {"type": "command_result", "id": str(msg.get("id", ""))[:64], "status": status,
                  "detail": detail[:4000]}
        try:
            await ws.send(orjson.dumps(result).decode())
        except ConnectionClosed:
            self.pending_results.append(result)
