"""KV-cache events over ZMQ in vLLM 0.32's wire format.

- PUB socket, one message per batch, three frames: topic (utf-8), sequence number
  (8 bytes big-endian, from 0, +1 per batch), msgpack payload.
- Payload: ``[ts, [event, ...], data_parallel_rank]`` with each event a map whose first
  key is ``"type"`` (``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``). Some newer
  vLLM builds encode the batch as a map ``{"ts", "events", "data_parallel_rank"}``;
  ``batch_format="map"`` reproduces that so consumers can be tested against both.
- Replay: a ROUTER socket. A client (DEALER or REQ) sends the start sequence as 8 bytes
  big-endian; the ROUTER sees ``[identity, b"", start]`` and answers one message per
  buffered batch ``[identity, b"", seq, payload]`` then ``[identity, b"", -1 (signed), b""]``.
  This mirrors vLLM's ``ZmqEventPublisher._service_replay``; a request without the empty
  delimiter frame (a raw DEALER) is answered in the same shape, without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import Any

import msgpack
import zmq
import zmq.asyncio

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class KvEventPublisher:
    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None,
        *,
        topic: str = "kv-events",
        buffer_steps: int = 10_000,
        data_parallel_rank: int = 0,
        drop_every: int = 0,
        batch_format: str = "array",
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic.encode("utf-8")
        self.data_parallel_rank = data_parallel_rank
        self.drop_every = drop_every
        if batch_format not in ("array", "map"):
            raise ValueError("batch_format must be 'array' or 'map'")
        self.batch_format = batch_format
        self._ctx = context or zmq.asyncio.Context.instance()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._next_seq = 0
        self._pub: zmq.asyncio.Socket | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task | None = None
        self.published = 0
        self.dropped = 0

    async def start(self) -> None:
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.set_hwm(100_000)
        self._pub.bind(self.endpoint)
        if self.replay_endpoint:
            self._router = self._ctx.socket(zmq.ROUTER)
            self._router.setsockopt(zmq.LINGER, 0)
            self._router.bind(self.replay_endpoint)
            self._replay_task = asyncio.create_task(self._serve_replay(), name="kv-replay")

    async def close(self) -> None:
        if self._replay_task is not None:
            self._replay_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._replay_task
        for sock in (self._pub, self._router):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._router = None

    def encode(self, events: list[dict[str, Any]], ts: float | None = None) -> bytes:
        ts = time.time() if ts is None else ts
        if self.batch_format == "map":
            batch: Any = {"ts": ts, "events": events, "data_parallel_rank": self.data_parallel_rank}
        else:
            batch = [ts, events, self.data_parallel_rank]
        return msgpack.packb(batch, use_bin_type=True)

    async def publish(self, events: list[dict[str, Any]], ts: float | None = None) -> int:
        """Publish one batch; returns its sequence number."""
        seq = self._next_seq
        self._next_seq += 1
        payload = self.encode(events, ts)
        self._buffer.append((seq, payload))
        if self.drop_every and (seq + 1) % self.drop_every == 0:
            # Fault injection: the batch is "lost on the wire" but stays replayable.
            self.dropped += 1
            return seq
        if self._pub is not None:
            await self._pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
            self.published += 1
        return seq

    @property
    def next_seq(self) -> int:
        return self._next_seq

    async def _serve_replay(self) -> None:
        assert self._router is not None
        while True:
            frames = await self._router.recv_multipart()
            try:
                await self._answer_replay(frames)
            except Exception:  # a bad request must not stop the replay service
                log.exception("KV replay request failed")

    async def _answer_replay(self, frames: list[bytes]) -> None:
        assert self._router is not None
        if len(frames) == 3 and frames[1] == b"":
            identity, prefix, start_bytes = frames[0], [b""], frames[2]
        elif len(frames) == 2:
            identity, prefix, start_bytes = frames[0], [], frames[1]
        else:
            log.warning("invalid KV replay request with %d frames", len(frames))
            return
        if len(start_bytes) != 8:
            log.warning("invalid KV replay start sequence (%d bytes)", len(start_bytes))
            await self._router.send_multipart([identity, *prefix, END_SEQ, b""])
            return
        start = int.from_bytes(start_bytes, "big")
        for seq, payload in list(self._buffer):
            if seq >= start:
                await self._router.send_multipart(
                    [identity, *prefix, seq.to_bytes(8, "big"), payload]
                )
        await self._router.send_multipart([identity, *prefix, END_SEQ, b""])
