"""Several gateway processes on one port (``--workers N``, SO_REUSEPORT) share what routing
needs: the in-flight load each one puts on each worker, and the prefixes each one sent
where (the approximate index). Without it every process sees only its own share of the
traffic and double-books workers.

A small bus over ZMQ on ipc:// sockets: each process binds one PUB socket and subscribes to
every sibling's. What a process produced over ``FLUSH_S`` goes out as one batch, its load
deltas summed per worker. Messages (msgpack): ``["load", worker, booked, d_prefill,
d_decode, d_in_flight, finished]`` (the sum of the deltas Reservations applied to one worker
since the last batch; ``booked``/``finished``: whether a prefill was booked or finished
there, which moves the queue's start as in gateway/load.py), ``["route", model, worker,
[chunk hashes]]`` (what ``ApproxPrefixIndex.record`` was told), ``["table", raw]`` (a pushed
table lands on one process of the group; the others apply it from here), plus a heartbeat
each second. A sibling silent for ``dead_after_s`` is taken for dead and the load it had
added is taken back out.

Why a time batch and sums: a message costs both sides a wake-up, and a request makes five
(two bookings, a finished prefill, a release, a route). Sent every event-loop turn, the
bus doubled the CPU a request costs (docs/benchmarks.md, issue 19: 0.26 against 0.10 ms
at 8 in flight on two cores; 0.15 ms with 10 ms batches). ``FLUSH_S`` (10 ms; the
``PDPLANE_GATEWAY_BUS_FLUSH_S`` environment variable) is about one decode step of an
engine: a sibling's view of the load is at most that old, against requests that last from
a fraction of a second to minutes, and each process sees its own bookings at once.
KV events need no sharing: every process subscribes to the engines' streams itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable

import msgpack
import zmq
import zmq.asyncio

log = logging.getLogger(__name__)
HEARTBEAT_S = 1.0
FLUSH_S = float(os.environ.get("PDPLANE_GATEWAY_BUS_FLUSH_S", "0.01"))  # module doc


def bus_endpoint(port: int, index: int, base: str | None = None) -> str:
    base = base or os.environ.get("PDPLANE_GATEWAY_BUS_DIR") or tempfile.gettempdir()
    return f"ipc://{base}/pdplane-gw-{port}-{index}.sock"


class PeerBus:
    def __init__(self, index: int, count: int, port: int, *, loads, on_route: Callable,
                 on_table: Callable | None = None, dead_after_s: float = 5.0,
                 base: str | None = None):
        self.index, self.count = index, count
        self.loads = loads  # worker id -> WorkerLoad (the router's view: own + siblings')
        self.on_route = on_route  # (model, worker, hashes) -> None
        self.on_table = on_table  # (raw table bytes) -> None: a push one sibling received
        self.dead_after_s = dead_after_s
        self.endpoints = [bus_endpoint(port, i, base) for i in range(count)]
        self.ctx = zmq.asyncio.Context.instance()
        self.pub: zmq.asyncio.Socket | None = None
        self.sub: zmq.asyncio.Socket | None = None
        # What each sibling has added to self.loads, to take back out if it dies.
        self.added: dict[int, defaultdict[str, list[float]]] = {}
        self.last_heard: dict[int, float] = {}
        self.received = 0
        self._outbox: list[list] = []
        # Load deltas since the last batch, per worker: [booked, d_prefill, d_decode,
        # d_in_flight, finished] (module doc).
        self._loads: dict[str, list] = {}
        self._routes: set[tuple] = set()  # routes in the batch being gathered
        self._flush_scheduled = False
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.SNDHWM, 100_000)
        path = self.endpoints[self.index][len("ipc://"):]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # left by a process that died
        self.pub.bind(self.endpoints[self.index])
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        for i, endpoint in enumerate(self.endpoints):
            if i != self.index:
                self.sub.connect(endpoint)
        self._tasks = [asyncio.create_task(self._receive()),
                       asyncio.create_task(self._heartbeat())]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        for sock in (self.pub, self.sub):
            if sock is not None:
                sock.close(linger=0)

    # ------------------------------------------------------------------ sending

    def _send(self, message: list | None) -> None:
        """Queue a message (None: only load deltas are queued); what is queued over
        ``FLUSH_S`` goes out as one ZMQ message (module doc)."""
        if self.pub is None:
            return
        if message is not None:
            self._outbox.append(message)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop = asyncio.get_running_loop()
            if FLUSH_S > 0:
                loop.call_later(FLUSH_S, self._flush)
            else:
                loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        batch, self._outbox = self._outbox, []
        self._routes.clear()
        if self._loads:
            batch.extend(["load", worker, *sums] for worker, sums in self._loads.items())
            self._loads = {}
        if batch and self.pub is not None:
            with contextlib.suppress(zmq.Again, zmq.ZMQError):
                self.pub.send(msgpack.packb([self.index, batch]), zmq.NOBLOCK)

    def load(self, worker: str, d_prefill: float, d_decode: float, d_in_flight: int) -> None:
        sums = self._loads.get(worker)
        if sums is None:
            sums = self._loads[worker] = [False, 0.0, 0.0, 0, False]
        if d_prefill > 0:
            sums[0] = True
        elif d_prefill < 0:
            sums[4] = True
        sums[1] += d_prefill
        sums[2] += d_decode
        sums[3] += d_in_flight
        self._send(None)

    def route(self, model: str, worker: str, hashes: list[bytes]) -> None:
        # The same prompt sent to the same worker again within one batch teaches a sibling
        # nothing more: sent once.
        key = (model, worker, tuple(hashes))
        if key in self._routes:
            return
        self._routes.add(key)
        self._send(["route", model, worker, hashes])

    def table(self, raw: bytes) -> None:
        self._send(["table", raw])

    async def _heartbeat(self) -> None:
        while True:
            self._send(["hb"])
            self._reap(time.monotonic())
            await asyncio.sleep(HEARTBEAT_S)

    # ------------------------------------------------------------------ receiving

    async def _receive(self) -> None:
        while True:
            raw = await self.sub.recv()
            while raw is not None:  # drain what is queued before waiting again
                try:
                    peer, batch = msgpack.unpackb(raw)
                    for message in batch:
                        self.apply(peer, message)
                except Exception:  # a bad message must not stop the bus
                    log.exception("bad gateway bus message")
                try:
                    raw = self.sub.recv(zmq.NOBLOCK).result()
                except zmq.Again:
                    raw = None

    def apply(self, peer: int, message: list) -> None:
        kind = message[0]
        now = self.last_heard[peer] = time.monotonic()
        self.received += 1
        if kind == "load":
            worker, booked, d_prefill, d_decode, d_in_flight, finished = message[1:7]
            load = self.loads[worker]
            # A sibling's booking starts an empty queue, its finished prefill starts the
            # next one: the queue's start moves as for this process's own (gateway/load.py).
            if finished or (booked and load.prefill_blocks <= 0):
                load.prefill_since = now
            load.prefill_blocks = max(load.prefill_blocks + d_prefill, 0.0)
            load.decode_blocks = max(load.decode_blocks + d_decode, 0.0)
            load.in_flight = max(load.in_flight + d_in_flight, 0)
            mine = self.added.setdefault(peer, defaultdict(lambda: [0.0, 0.0, 0]))[worker]
            mine[0] += d_prefill
            mine[1] += d_decode
            mine[2] += d_in_flight
        elif kind == "route":
            model, worker, hashes = message[1:4]
            self.on_route(model, worker, hashes)
        elif kind == "table" and self.on_table is not None:
            self.on_table(message[1])

    def _reap(self, now: float) -> None:
        for peer, heard in list(self.last_heard.items()):
            if now - heard < self.dead_after_s:
                continue
            log.warning("gateway process %d went silent: taking its in-flight load out", peer)
            for worker, (d_prefill, d_decode, d_in_flight) in self.added.pop(peer, {}).items():
                load = self.loads[worker]
                load.prefill_blocks = max(load.prefill_blocks - d_prefill, 0.0)
                load.decode_blocks = max(load.decode_blocks - d_decode, 0.0)
                load.in_flight = max(load.in_flight - int(d_in_flight), 0)
            del self.last_heard[peer]
