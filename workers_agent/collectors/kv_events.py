"""KV-cache event subscriber for vLLM's ZMQ publisher (and the simulator's).

Usage as a plain class::

    sub = KVEventSubscriber("tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558")
    sub.start()                 # background thread; or call sub.poll(timeout_ms) yourself
    sub.block_count             # blocks the engine holds (stored − removed), GPU medium
    sub.stats()                 # {"blocks", "digest", "last_seq", "gaps", "replayed", ...}
    sub.stop()

Wire format (ENGINES.md): three frames — topic, 8-byte big-endian sequence number,
msgpack payload. The payload is a batch, either ``[ts, events, dp_rank]`` or a map
``{"ts", "events", "data_parallel_rank"}``; each event is either a map with ``"type"``
(vLLM ≥ 0.3x) or an array with the tag first (older vLLM). Unknown event types, unknown
fields and undecodable payloads are counted and skipped — never fatal.

A jump in sequence numbers is a gap: the subscriber asks the replay socket (ROUTER; we
talk to it with a DEALER, sending ``[b"", start_seq]``) for the missing batches, which
come back as ``[b"", seq, payload]`` (or with a topic frame first) and end with seq −1.
What the publisher no longer buffers is counted as ``lost``.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from typing import Any

import msgpack
import zmq

log = logging.getLogger(__name__)

END_SEQ = -1
GPU_MEDIA = (None, "GPU", "gpu", "cuda", "CUDA")

# Field order of the array-encoded (older) events, after the tag.
ARRAY_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size",
                    "lora_id", "medium"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}


def decode_events(payload: bytes) -> list[dict]:
    """Decode one batch into event maps ``{"type": …, field: …}``.

    Raises ValueError when the payload is not a batch at all; events that are not
    understood come back as ``{"type": "<unknown>", …}`` for the caller to count.
    """
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:
        raise ValueError(f"undecodable msgpack: {exc}") from None
    if isinstance(batch, dict):
        events = batch.get("events")
    elif isinstance(batch, list | tuple) and len(batch) >= 2:
        events = batch[1]
    else:
        raise ValueError("batch is neither an array nor a map")
    if not isinstance(events, list | tuple):
        raise ValueError("batch has no event list")
    return [normalise_event(e) for e in events]


def normalise_event(event: Any) -> dict:
    if isinstance(event, dict):
        kind = event.get("type") or event.get("_type") or "<unknown>"
        return {**event, "type": kind if isinstance(kind, str) else "<unknown>"}
    if isinstance(event, list | tuple) and event and isinstance(event[0], str):
        kind = event[0]
        names = ARRAY_FIELDS.get(kind)
        if names is None:
            return {"type": kind}
        return {"type": kind, **dict(zip(names, event[1:], strict=False))}
    return {"type": "<unknown>"}


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
    """Blocks an engine holds, from its events (pure; no sockets)."""

    def __init__(self):
        self.blocks: set[int] = set()
        self.other_media: dict[str, int] = {}
        self.digest = 0  # XOR of held block hashes: order-free, updated in O(1)
        self.stored_events = 0
        self.removed_events = 0
        self.cleared = 0
        self.unknown_events = 0

    def apply(self, event: dict) -> None:
        kind = event.get("type")
        if kind == "BlockStored":
            self.stored_events += 1
            self._each(event, add=True)
        elif kind == "BlockRemoved":
            self.removed_events += 1
            self._each(event, add=False)
        elif kind == "AllBlocksCleared":
            self.cleared += 1
            self.blocks.clear()
            self.other_media.clear()
            self.digest = 0
        else:
            self.unknown_events += 1

    def _each(self, event: dict, add: bool) -> None:
        hashes = event.get("block_hashes") or []
        if not isinstance(hashes, list | tuple):
            self.unknown_events += 1
            return
        medium = event.get("medium")
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


class KVEventSubscriber:
    def __init__(self, endpoint: str, replay_endpoint: str | None = None, *, topic: str = "",
                 replay_timeout_s: float = 1.0, replay_on_start: bool = True,
                 tail_check_s: float = 2.0, context: zmq.Context | None = None):
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint or None
        self.topic = topic
        self.replay_timeout_s = replay_timeout_s
        self.replay_on_start = replay_on_start
        # A dropped *last* batch shows no gap until the next one arrives; when the stream
        # has been quiet this long, ask the replay socket whether anything was missed.
        self.tail_check_s = tail_check_s
        self._last_activity = time.monotonic()
        self._tail_checked = True
        self.ctx = context or zmq.Context.instance()
        self.state = KVBlockState()
        self.last_seq: int | None = None
        self.batches = 0
        self.gaps = 0
        self.replayed = 0
        self.lost = 0
        self.decode_errors = 0
        self.restarts = 0
        self.last_event_at: float | None = None
        # True once the stream was followed from seq 0 (directly or by replay): only then
        # is the block set the engine's whole cache, not just what happened since we joined.
        self.complete = False
        self._lock = threading.Lock()
        self._sub: zmq.Socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

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
                    self.check_tail()
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
        if self.replay_endpoint is None or self.last_seq is None or self._tail_checked:
            return 0
        if not force and time.monotonic() - self._last_activity < self.tail_check_s:
            return 0
        self._tail_checked = True
        got = self._replay(self.last_seq + 1, None)
        if got:
            with self._lock:
                self.gaps += 1
        return got

    # ------------------------------------------------------------------ messages

    def handle_frames(self, frames: list[bytes]) -> None:
        if len(frames) < 3 or len(frames[-2]) != 8:
            with self._lock:
                self.decode_errors += 1
            return
        seq = int.from_bytes(frames[-2], "big", signed=True)
        self.handle_batch(seq, frames[-1])

    def handle_batch(self, seq: int, payload: bytes) -> None:
        self._last_activity = time.monotonic()
        self._tail_checked = False
        last = self.last_seq
        if last is None:
            if seq > 0 and self.replay_on_start and self.replay_endpoint:
                self._replay(0, seq)
        elif seq <= last:
            if seq == 0 and last > 0:  # publisher restarted (engine restart): start over
                with self._lock:
                    self.restarts += 1
                    self.state = KVBlockState()
            else:
                return  # duplicate (already applied via replay)
        elif seq > last + 1:
            with self._lock:
                self.gaps += 1
            missing = seq - last - 1
            got = self._replay(last + 1, seq) if self.replay_endpoint else 0
            with self._lock:
                self.lost += max(0, missing - got)
        self._apply(seq, payload)

    def _apply(self, seq: int, payload: bytes) -> bool:
        try:
            events = decode_events(payload)
        except ValueError as exc:
            with self._lock:
                self.decode_errors += 1
                self.last_seq = seq
            log.debug("KV batch %d from %s undecodable: %s", seq, self.endpoint, exc)
            return False
        with self._lock:
            for event in events:
                self.state.apply(event)
            if seq == 0 or any(e.get("type") == "AllBlocksCleared" for e in events):
                self.complete = True
            self.last_seq = seq
            self.batches += 1
            self.last_event_at = time.time()
        return True

    def _replay(self, start: int, stop: int | None) -> int:
        """Fetch and apply batches ``start <= seq < stop`` (no upper bound when ``stop`` is
        None); returns how many were applied."""
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        applied = 0
        try:
            sock.connect(self.replay_endpoint)
            sock.send_multipart([b"", start.to_bytes(8, "big")])
            deadline = time.monotonic() + self.replay_timeout_s
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not sock.poll(int(remaining * 1000) + 1):
                    log.warning("KV replay from %s timed out", self.replay_endpoint)
                    break
                frames = sock.recv_multipart()
                # An idle timeout, not a total one: a long buffer may take a while to stream.
                deadline = time.monotonic() + self.replay_timeout_s
                if frames and frames[0] == b"":
                    frames = frames[1:]
                if len(frames) < 2 or len(frames[-2]) != 8:
                    continue
                seq = int.from_bytes(frames[-2], "big", signed=True)
                if seq == END_SEQ or not frames[-1]:
                    break
                last = self.last_seq if self.last_seq is not None else -1
                if seq > last and (stop is None or seq < stop) and self._apply(seq, frames[-1]):
                    applied += 1
        except zmq.ZMQError as exc:
            log.warning("KV replay from %s failed: %s", self.replay_endpoint, exc)
        finally:
            sock.close(linger=0)
        with self._lock:
            self.replayed += applied
        return applied

    # ------------------------------------------------------------------ read side

    @property
    def block_count(self) -> int:
        return len(self.state.blocks)

    def digest(self) -> str:
        return f"{self.state.digest:016x}"

    def stats(self) -> dict:
        """The compact per-engine summary sent in reports (``kv_events``)."""
        with self._lock:
            return {
                "blocks": len(self.state.blocks),
                "digest": f"{self.state.digest:016x}",
                "last_seq": -1 if self.last_seq is None else self.last_seq,
                "gaps": self.gaps,
                "replayed": self.replayed,
                "lost": self.lost,
                "unknown_events": self.state.unknown_events,
                "decode_errors": self.decode_errors,
                "complete": self.complete,
            }
