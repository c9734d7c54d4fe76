"""Subscribe to the engines' KV-cache event streams (ZMQ PUB) named in the routing table.

The asyncio driver of the one stream module, :mod:`workers_agent.kvstream`, which owns the
decoding and every sequence rule (gap → replay, engine restart → drop that worker's blocks
and start over, stray huge sequence numbers, stalls). One task per worker with a
``kv_events`` endpoint; this file only moves frames between ZMQ and the stream.

A stalled stream (work was sent, no events came; or the replay socket stopped answering)
is reported by :meth:`KvEventSubscriber.stalled`: the gateway then ignores that worker's
precise entries and routes on its approximate index, and /metrics says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from urllib.parse import urlsplit

import zmq
import zmq.asyncio

from workers_agent.kvstream import (
    DEFAULT_STALL_S,
    END_SEQ,
    KvStream,
    Replay,
    live_frame,
    replay_frame,
    replay_request,
)

from .table import RoutingTable, WorkerEntry

log = logging.getLogger(__name__)
REPLAY_TIMEOUT_S = 2.0
IDLE_TICK_S = 0.25  # how often a quiet stream looks at its stall/probe timers


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


class _WorkerSink:
    """Where one worker's decoded batches go (the gateway's precise index)."""

    def __init__(self, owner: KvEventSubscriber, model: str, worker_id: str):
        self.owner, self.model, self.worker_id = owner, model, worker_id

    def apply(self, events) -> None:
        if self.owner.metrics:
            self.owner.metrics.kv_events.labels(self.worker_id).inc()
        self.owner.on_events(self.model, self.worker_id, events)

    def reset(self) -> None:
        log.info("KV stream of %s started over (engine restart?): dropping its blocks",
                 self.worker_id)
        if self.owner.on_reset is not None:
            self.owner.on_reset(self.model, self.worker_id)


class KvEventSubscriber:
    def __init__(self, on_events: Callable, metrics=None, *, on_reset: Callable | None = None,
                 stall_after_s: float = DEFAULT_STALL_S, tail_check_s: float = 2.0,
                 probe_interval_s: float = 10.0, replay_timeout_s: float = REPLAY_TIMEOUT_S):
        self.on_events = on_events  # (model, worker_id, events) -> None
        self.on_reset = on_reset  # (model, worker_id) -> None: drop that worker's blocks
        self.metrics = metrics
        self.stall_after_s = stall_after_s
        self.tail_check_s = tail_check_s
        self.probe_interval_s = probe_interval_s
        self.replay_timeout_s = replay_timeout_s
        self.ctx = zmq.asyncio.Context.instance()
        self.tasks: dict[tuple[str, str, str], asyncio.Task] = {}
        self.streams: dict[str, KvStream] = {}
        if metrics is not None and hasattr(metrics, "watch_kv_streams"):
            metrics.watch_kv_streams(self.streams)

    @property
    def last_seq(self) -> dict[str, int]:
        return {w: s.last_seq for w, s in self.streams.items() if s.last_seq is not None}

    def stalled(self, worker_id: str) -> bool:
        stream = self.streams.get(worker_id)
        return stream is not None and stream.stalled

    def expect_events(self, worker_id: str) -> None:
        """The gateway just sent this worker work that should produce KV events."""
        stream = self.streams.get(worker_id)
        if stream is not None:
            stream.expect_events()

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
                if not any(k[1] == key[1] for k in wanted):
                    self.streams.pop(key[1], None)
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
        replay = connectable(worker.kv_replay_endpoint, worker.url) if \
            worker.kv_replay_endpoint else None
        stream = KvStream(_WorkerSink(self, model, worker.id), can_replay=replay is not None,
                          stall_after_s=self.stall_after_s, tail_check_s=self.tail_check_s,
                          probe_interval_s=self.probe_interval_s)
        self.streams[worker.id] = stream
        sock = self.ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        try:
            sock.connect(endpoint)
            while True:
                try:
                    if await sock.poll(IDLE_TICK_S * 1000):
                        frames = await sock.recv_multipart()
                        parsed = live_frame(frames)
                        if parsed is None:
                            stream.decode_errors += 1
                            continue
                        pending = stream.receive(*parsed)
                        if pending is not None and self.metrics and pending.start > 0:
                            self.metrics.kv_event_gaps.labels(worker.id).inc()
                    else:
                        pending = stream.due_replay()
                    while pending is not None:
                        pending = await self._replay(stream, replay, pending)
                    was = stream.stalled
                    if stream.check_stall() and not was:
                        log.warning("KV stream of %s stalled (%s): routing it on the "
                                    "approximate index", worker.id, stream.stall_reason)
                except (asyncio.CancelledError, zmq.ContextTerminated):
                    raise
                except Exception:  # one bad frame or replay must not end the subscription
                    log.exception("KV event subscription to %s (%s) hit an error; going on",
                                  endpoint, worker.id)
                    await asyncio.sleep(0.5)
        finally:
            sock.close(linger=0)

    async def _replay(self, stream: KvStream, endpoint: str | None,
                      want: Replay) -> Replay | None:
        """Run one replay; returns the follow-up the stream asks for, if any."""
        answered = False
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(endpoint)
            await sock.send_multipart(replay_request(want.start))
            while True:
                # An idle timeout, not a total one: a long buffer may take a while.
                frames = await asyncio.wait_for(sock.recv_multipart(), self.replay_timeout_s)
                answered = True
                parsed = replay_frame(frames)
                if parsed is None:
                    continue
                if parsed[0] == END_SEQ:
                    break
                stream.replayed(*parsed)
        except TimeoutError:
            log.warning("KV replay from %s timed out", endpoint)
        except zmq.ZMQError as exc:
            log.warning("KV replay from %s failed: %s", endpoint, exc)
        finally:
            sock.close(linger=0)
        return stream.replay_done(answered)
