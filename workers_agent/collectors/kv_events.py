"""KV-cache event subscriber for vLLM's ZMQ publisher (and the simulator's): the agent's
thread driver around the one stream module, :mod:`workers_agent.kvstream` (decoding and
sequence rules: gaps → replay, engine restart, stray huge sequence numbers, stalls).

Usage as a plain class::

    sub = KVEventSubscriber("tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558")
    sub.start()                 # background thread; or call sub.poll(timeout_ms) yourself
    sub.block_count             # blocks the engine holds (stored − removed), GPU medium
    sub.stats()                 # {"blocks", "digest", "last_seq", "gaps", "replayed", ...}
    sub.stop()

Replay: the subscriber talks to the publisher's ROUTER with a DEALER, sending
``[b"", start_seq]``; answers come back as ``[b"", seq, payload]`` and end with seq −1.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from typing import Any

import zmq

from workers_agent.kvstream import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEvent,
    KvStream,
    Replay,
    decode_batch,
    decode_event,
    live_frame,
    replay_frame,
    replay_request,
)

log = logging.getLogger(__name__)

GPU_MEDIA = (None, "GPU", "gpu", "cuda", "CUDA")


def decode_events(payload: bytes) -> list[KvEvent | None]:
    """The events of one batch, ``None`` for each one not understood (counted by
    :class:`KVBlockState`). Raises ValueError when the payload is not a batch at all."""
    batch = decode_batch(payload)
    return [*batch.events, *([None] * batch.unknown)]


def normalise_event(event: Any) -> KvEvent | None:
    return decode_event(event)


def _hash64(block_hash: Any) -> int:
    """A 64-bit integer for a block hash (ints as they are, bytes/str hashed)."""
    if isinstance(block_hash, int):
        return block_hash & 0xFFFFFFFFFFFFFFFF
    if isinstance(block_hash, str):
        block_hash = block_hash.encode()
    if isinstance(block_hash, bytes | bytearray):
        return int.from_bytes(hashlib.blake2b(bytes(block_hash), digest_size=8).digest(), "big")
    return int.from_bytes(hashlib.blake2b(repr(block_hash).encode(), digest_size=8).digest(),
                          "big")


class KVBlockState:
    """Blocks an engine holds, from its events (pure; no sockets). A :mod:`kvstream` sink."""

    def __init__(self):
        self.blocks: set[int] = set()
        self.other_media: dict[str, int] = {}
        self.digest = 0  # XOR of held block hashes: order-free, updated in O(1)
        self.stored_events = 0
        self.removed_events = 0
        self.cleared = 0
        self.unknown_events = 0

    def apply(self, event: Any) -> None:
        """One event: decoded, or in any wire shape (map / array); unknown ones counted."""
        if isinstance(event, dict | list | tuple):
            event = decode_event(event)
        if isinstance(event, BlockStored):
            self.stored_events += 1
            self._each(event.block_hashes, event.medium, add=True)
        elif isinstance(event, BlockRemoved):
            self.removed_events += 1
            self._each(event.block_hashes, event.medium, add=False)
        elif isinstance(event, AllBlocksCleared):
            self.cleared += 1
            self.reset()
        else:
            self.unknown_events += 1

    def reset(self) -> None:
        self.blocks.clear()
        self.other_media.clear()
        self.digest = 0

    def _each(self, hashes: tuple, medium: str | None, add: bool) -> None:
        if medium not in GPU_MEDIA:
            key = str(medium)
            self.other_media[key] = max(0, self.other_media.get(key, 0) + (len(hashes) if add
                                                                              else -len(hashes)))
            return
        for h in hashes:
            h = _hash64(h)
            if add and h not in self.blocks:
                self.blocks.add(h)
                self.digest ^= h
            elif not add and h in self.blocks:
                self.blocks.discard(h)
                self.digest ^= h


class _LockedSink:
    """Applies a batch to the subscriber's current state (swapped on restart)."""

    def __init__(self, owner: KVEventSubscriber):
        self.owner = owner

    def apply(self, events: list[KvEvent]) -> None:
        for event in events:
            self.owner.state.apply(event)

    def reset(self) -> None:
        unknown = self.owner.state.unknown_events
        self.owner.state = KVBlockState()
        self.owner.state.unknown_events = unknown


class KVEventSubscriber:
    def __init__(self, endpoint: str, replay_endpoint: str | None = None, *, topic: str = "",
                 replay_timeout_s: float = 1.0, replay_on_start: bool = True,
                 tail_check_s: float = 2.0, probe_interval_s: float = 10.0,
                 context: zmq.Context | None = None):
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint or None
        self.topic = topic
        self.replay_timeout_s = replay_timeout_s
        self.ctx = context or zmq.Context.instance()
        self.state = KVBlockState()
        self.stream = KvStream(_LockedSink(self), can_replay=self.replay_endpoint is not None,
                               replay_on_start=replay_on_start, tail_check_s=tail_check_s,
                               probe_interval_s=probe_interval_s)
        self._lock = threading.Lock()
        self._sub: zmq.Socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # The stream's counters, under the names reports and agent metrics use.
    last_seq = property(lambda self: self.stream.last_seq)
    batches = property(lambda self: self.stream.batches)
    gaps = property(lambda self: self.stream.gaps)
    replayed = property(lambda self: self.stream.replayed_batches)
    lost = property(lambda self: self.stream.lost)
    decode_errors = property(lambda self: self.stream.decode_errors)
    restarts = property(lambda self: self.stream.restarts)
    complete = property(lambda self: self.stream.complete)
    last_event_at = property(lambda self: self.stream.last_event_at)

    # ------------------------------------------------------------------ sockets

    def connect(self) -> None:
        if self._sub is None:
            sub = self.ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt_string(zmq.SUBSCRIBE, self.topic)
            sub.connect(self.endpoint)
            self._sub = sub

    def close(self) -> None:
        if self._sub is not None:
            self._sub.close(linger=0)
            self._sub = None

    def start(self) -> None:
        self.connect()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"kv-events {self.endpoint}",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if not self.poll(100):
                    self._run_replay(self.stream.due_replay())
            except Exception:  # never let the thread die: log, back off, go on
                log.exception("KV event subscriber %s failed; continuing", self.endpoint)
                time.sleep(0.5)

    def poll(self, timeout_ms: int = 100) -> int:
        """Handle the messages that arrive within ``timeout_ms``; returns how many."""
        self.connect()
        handled = 0
        if not self._sub.poll(timeout_ms):
            return 0
        while True:
            try:
                frames = self._sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return handled
            self.handle_frames(frames)
            handled += 1

    def check_tail(self, force: bool = False) -> int:
        """After a quiet spell, fetch batches published after the last one seen (lost
        tail). Returns how many were recovered."""
        if force:
            self.stream._tail_checked = False
            self.stream._last_frame_at = -float("inf")
        return self._run_replay(self.stream.due_replay())

    # ------------------------------------------------------------------ messages

    def handle_frames(self, frames: list[bytes]) -> None:
        parsed = live_frame(frames)
        if parsed is None:
            with self._lock:
                self.stream.decode_errors += 1
            return
        self.handle_batch(*parsed)

    def handle_batch(self, seq: int, payload: bytes) -> None:
        with self._lock:
            replay = self.stream.receive(seq, payload)
        self._run_replay(replay)

    def _run_replay(self, replay: Replay | None) -> int:
        """Fetch and apply the batches ``replay`` asks for (and any follow-up the stream
        asks for); returns how many were applied."""
        applied = 0
        while replay is not None:
            got, replay = self._replay_once(replay)
            applied += got
        return applied

    def _replay_once(self, replay: Replay) -> tuple[int, Replay | None]:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        applied, answered = 0, False
        try:
            sock.connect(self.replay_endpoint)
            sock.send_multipart(replay_request(replay.start))
            while True:
                # An idle timeout, not a total one: a long buffer may take a while to stream.
                if not sock.poll(int(self.replay_timeout_s * 1000) + 1):
                    log.warning("KV replay from %s timed out", self.replay_endpoint)
                    break
                answered = True
                parsed = replay_frame(sock.recv_multipart())
                if parsed is None:
                    continue
                if parsed[0] == END_SEQ:
                    break
                with self._lock:
                    applied += self.stream.replayed(*parsed)
        except zmq.ZMQError as exc:
            log.warning("KV replay from %s failed: %s", self.replay_endpoint, exc)
        finally:
            sock.close(linger=0)
        with self._lock:
            return applied, self.stream.replay_done(answered)

    # ------------------------------------------------------------------ read side

    @property
    def block_count(self) -> int:
        return len(self.state.blocks)

    def digest(self) -> str:
        return f"{self.state.digest:016x}"

    def stats(self) -> dict:
        """The compact per-engine summary sent in reports (``kv_events``)."""
        with self._lock:
            s = self.stream
            return {
                "blocks": len(self.state.blocks),
                "digest": f"{self.state.digest:016x}",
                "last_seq": -1 if s.last_seq is None else s.last_seq,
                "gaps": s.gaps,
                "replayed": s.replayed_batches,
                "lost": s.lost,
                "unknown_events": self.state.unknown_events + s.unknown_events,
                "decode_errors": s.decode_errors,
                "restarts": s.restarts,
                "strays": s.strays,
                "complete": s.complete,
                "stalled": s.stalled,
            }
