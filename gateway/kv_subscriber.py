"""Subscribe to the engines' KV-cache event streams (ZMQ PUB) named in the routing table.

One task per worker with a ``kv_events`` endpoint. A gap in sequence numbers means lost
batches: ask the worker's replay socket (ROUTER) for everything from the first missing
sequence, as vLLM's protocol provides, and apply what comes back in order. Bad payloads
are counted and skipped; the subscription goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from urllib.parse import urlsplit

import zmq
import zmq.asyncio

from .prefix_index import KvEventDecodeError, decode_event_batch
from .table import RoutingTable, WorkerEntry

log = logging.getLogger(__name__)
END_SEQ = -1
REPLAY_TIMEOUT_S = 2.0


def connectable(endpoint: str, worker_url: str) -> str:
    """A bind-style endpoint (``tcp://*:5557``) becomes one on the worker's host."""
    if endpoint.startswith("tcp://"):
        host_port = endpoint[len("tcp://") :]
        host, _, port = host_port.rpartition(":")
        if host in ("*", "0.0.0.0", "::", "[::]", ""):
            host = urlsplit(worker_url).hostname or "127.0.0.1"
            if ":" in host:
                host = f"[{host}]"
            return f"tcp://{host}:{port}"
    return endpoint


class KvEventSubscriber:
    def __init__(self, on_events: Callable, metrics=None):
        self.on_events = on_events  # (model, worker_id, events) -> None
        self.metrics = metrics
        self.ctx = zmq.asyncio.Context.instance()
        self.tasks: dict[tuple[str, str, str], asyncio.Task] = {}
        self.last_seq: dict[str, int] = {}

    def sync(self, table: RoutingTable) -> None:
        wanted: dict[tuple[str, str, str], tuple[str, WorkerEntry]] = {}
        for model in table.models.values():
            for w in model.workers:
                if w.kv_events_endpoint:
                    key = (model.name, w.id, connectable(w.kv_events_endpoint, w.url))
                    wanted[key] = (model.name, w)
        for key in list(self.tasks):
            if key not in wanted:
                self.tasks.pop(key).cancel()
        for key, (model_name, worker) in wanted.items():
            if key not in self.tasks or self.tasks[key].done():
                self.tasks[key] = asyncio.create_task(self._run(model_name, worker, key[2]))

    async def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        for task in self.tasks.values():
            with contextlib.suppress(BaseException):
                await task
        self.tasks.clear()

    async def _run(self, model: str, worker: WorkerEntry, endpoint: str) -> None:
        sock = self.ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        replay = None
        if worker.kv_replay_endpoint:
            replay = connectable(worker.kv_replay_endpoint, worker.url)
        try:
            sock.connect(endpoint)
            expected: int | None = None
            while True:
                frames = await sock.recv_multipart()
                if len(frames) < 2:
                    continue
                seq_bytes, payload = frames[-2], frames[-1]
                seq = int.from_bytes(seq_bytes, "big", signed=True) if len(seq_bytes) == 8 else None
                if seq is not None and replay and (
                    (expected is None and seq > 0) or (expected is not None and seq > expected)
                ):
                    start = 0 if expected is None else expected
                    if expected is not None and self.metrics:
                        self.metrics.kv_event_gaps.labels(worker.id).inc()
                    await self._replay(model, worker, replay, start, seq)
                if seq is not None and expected is not None and seq < expected:
                    continue  # already applied through replay
                self._apply(model, worker, payload)
                if seq is not None:
                    expected = seq + 1
                    self.last_seq[worker.id] = seq
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("KV event subscription to %s (%s) failed", endpoint, worker.id)
        finally:
            sock.close(linger=0)

    async def _replay(self, model, worker, endpoint: str, start: int, until: int) -> None:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(endpoint)
            await sock.send_multipart([start.to_bytes(8, "big")])
            while True:
                frames = await asyncio.wait_for(sock.recv_multipart(), REPLAY_TIMEOUT_S)
                frames = [f for f in frames if f != b""] if len(frames) > 2 else frames
                if len(frames) < 1:
                    continue
                seq = int.from_bytes(frames[0], "big", signed=True)
                if seq == END_SEQ:
                    return
                if len(frames) >= 2 and start <= seq < until:
                    self._apply(model, worker, frames[1])
        except TimeoutError:
            log.warning("KV replay from %s timed out", endpoint)
        finally:
            sock.close(linger=0)

    def _apply(self, model: str, worker: WorkerEntry, payload: bytes) -> None:
        try:
            _ts, events = decode_event_batch(payload)
        except KvEventDecodeError as exc:
            log.warning("bad KV event batch from %s: %s", worker.id, exc)
            return
        if self.metrics:
            self.metrics.kv_events.labels(worker.id).inc()
        self.on_events(model, worker.id, events)
