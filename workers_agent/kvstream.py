"""The one KV-cache event stream module: wire decoding and sequence tracking, shared by the
agent (``workers_agent/collectors/kv_events.py``, a thread) and the gateway
(``gateway/kv_subscriber.py``, asyncio). Pure: no sockets, no Django; the two drivers do
the ZMQ I/O and call in here.

Wire format (vLLM, see /work/shared/reference/ENGINES.md): three frames — topic, 8-byte
big-endian sequence number (from 0, +1 per batch), msgpack payload. The payload is
``[ts, events, dp_rank]`` (0.32) or a map ``{"ts", "events", …}`` (some builds); each event
is a map with ``"type"`` (0.3x) or an array with the tag first (≤ ~0.26). Unknown event
types and fields are counted and skipped, never fatal.

Sequence rules (:class:`KvStream`), each for a failure seen in practice:

- **gap** (seq jumps ahead): ask the replay socket for the missing batches, then apply the
  held one; what the publisher no longer buffers is counted ``lost``.
- **engine restart**: a live PUB stream never repeats or goes back, so a sequence number
  at or below the last one *received live* means the publisher started over — drop that
  engine's blocks (``sink.reset()``) and follow the new stream (replaying from 0). Numbers
  at or below the last *applied* one but above the last live one are batches a replay
  already delivered (duplicates), not a restart.
- **stray huge sequence** (one corrupt or foreign frame): a jump of more than ``max_jump``
  is held, not believed, until the next frame says which is true. If that frame continues
  the held one, the stream really moved on (a long outage): start over from there. If it
  continues the old stream, the stray is discarded. One frame can no longer freeze the
  stream (the old agent subscriber dropped every later batch as a "duplicate").
- **stall**: the owner says when it expects events (the gateway: it just sent that engine a
  prompt with uncached blocks) and probes the replay socket when the stream is quiet; no
  batch for ``stall_after_s`` after an expectation, or an unanswered probe, marks the
  stream ``stalled`` (the gateway then uses only its approximate index for that worker and
  says so in /metrics; the agent reports it to the control plane). Any applied batch
  clears it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack

END_SEQ = -1
DEFAULT_MAX_JUMP = 100_000  # vLLM buffers 10,000 steps for replay; 10× that is no gap
DEFAULT_STALL_S = 15.0
DEFAULT_TAIL_CHECK_S = 2.0
DEFAULT_PROBE_S = 10.0


# --- events --------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockStored:
    block_hashes: tuple
    parent_block_hash: Any
    token_ids: tuple[int, ...]
    block_size: int
    medium: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: tuple
    medium: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KvEventDecodeError(ValueError):
    """The payload is not an event batch at all."""


@dataclass
class Batch:
    ts: float | None
    events: list[KvEvent]
    unknown: int = 0  # events of unknown type or shape, skipped


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


def _hashes(value: Any) -> tuple:
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise ValueError("block_hashes must be a list")
    return tuple(_hashable(h) for h in value)


def _medium(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _stored(hashes, parent, tokens, block_size, medium) -> BlockStored:
    if tokens is not None and not isinstance(tokens, list | tuple):
        raise ValueError("token_ids must be a list")
    ids = tuple(tokens or ())
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise ValueError("token ids must be integers")
    return BlockStored(_hashes(hashes), _hashable(parent), ids, int(block_size or 0),
                       _medium(medium))


def _event_from_map(ev: dict) -> KvEvent | None:
    kind = ev.get("type", ev.get("_type"))
    if kind == "BlockStored":
        return _stored(ev.get("block_hashes"), ev.get("parent_block_hash"),
                       ev.get("token_ids"), ev.get("block_size"), ev.get("medium"))
    if kind == "BlockRemoved":
        return BlockRemoved(_hashes(ev.get("block_hashes")), _medium(ev.get("medium")))
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def _event_from_array(ev: Sequence) -> KvEvent | None:
    kind = ev[0] if ev else None
    if isinstance(kind, bytes):
        kind = kind.decode("utf-8", "replace")
    if kind == "BlockStored" and len(ev) >= 5:
        return _stored(ev[1], ev[2], ev[3], ev[4], ev[6] if len(ev) > 6 else None)
    if kind == "BlockRemoved" and len(ev) >= 2:
        return BlockRemoved(_hashes(ev[1]), _medium(ev[2]) if len(ev) > 2 else None)
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def decode_event(item: Any) -> KvEvent | None:
    """One event in any wire shape (map or tag-first array); None if not understood."""
    try:
        if isinstance(item, dict):
            return _event_from_map(item)
        if isinstance(item, list | tuple):
            return _event_from_array(item)
    except (TypeError, ValueError, OverflowError):
        pass
    return None


def decode_batch(payload: bytes) -> Batch:
    """Decode one msgpack payload. Raises :class:`KvEventDecodeError` only when it is not a
    batch at all; events that are not understood are counted in ``unknown``."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several types
        raise KvEventDecodeError(f"not msgpack: {exc}") from None
    if isinstance(raw, dict):
        ts, raw_events = raw.get("ts"), raw.get("events")
    elif isinstance(raw, list | tuple) and len(raw) >= 2:
        ts, raw_events = raw[0], raw[1]
    else:
        raise KvEventDecodeError("payload is not an event batch")
    if not isinstance(raw_events, list | tuple):
        raise KvEventDecodeError("batch has no event list")
    events: list[KvEvent] = []
    unknown = 0
    for item in raw_events:
        event = decode_event(item)
        if event is None:
            unknown += 1
        else:
            events.append(event)
    stamp = float(ts) if isinstance(ts, int | float) and not isinstance(ts, bool) else None
    return Batch(stamp, events, unknown)


def decode_event_batch(payload: bytes) -> tuple[float | None, list[KvEvent]]:
    """(timestamp, events) of one payload (see :func:`decode_batch`)."""
    batch = decode_batch(payload)
    return batch.ts, batch.events


# --- frames --------------------------------------------------------------------------


def live_frame(frames: Sequence[bytes]) -> tuple[int, bytes] | None:
    """(seq, payload) of a PUB message ``[topic, seq, payload]``; None if malformed."""
    if len(frames) < 3 or len(frames[-2]) != 8:
        return None
    return int.from_bytes(frames[-2], "big", signed=True), frames[-1]


def replay_request(start: int) -> list[bytes]:
    """What a DEALER sends to vLLM's replay ROUTER (it wants ``[id, b"", start]``)."""
    return [b"", max(start, 0).to_bytes(8, "big")]


def replay_frame(frames: Sequence[bytes]) -> tuple[int, bytes] | None:
    """(seq, payload) of one replay answer ``[b"", (topic,) seq, payload]``; seq is
    :data:`END_SEQ` at the end; None if malformed."""
    frames = list(frames)
    if frames and frames[0] == b"":
        frames = frames[1:]
    if len(frames) < 2 or len(frames[-2]) != 8:
        return None
    seq = int.from_bytes(frames[-2], "big", signed=True)
    return (END_SEQ, b"") if seq == END_SEQ or not frames[-1] else (seq, frames[-1])


# --- the sequence tracker ------------------------------------------------------------


class StreamSink(Protocol):
    def apply(self, events: list[KvEvent]) -> None: ...

    def reset(self) -> None: ...


@dataclass(frozen=True)
class Replay:
    """Ask the replay socket for batches ``start <= seq < stop`` (no bound when None)."""

    start: int
    stop: int | None
    probe: bool = False  # a liveness probe of a quiet stream (no answer → stalled)
    # The probe starts at the last applied batch: the publisher must hand back that very
    # batch, or it is not the engine we followed (it restarted while we were not looking).
    verify: int | None = None


class KvStream:
    """Sequence tracking of one engine's stream, applying batches to a sink in order.

    Driver protocol: for each live frame call :meth:`receive`; when it returns a
    :class:`Replay`, fetch that range, pass each answer to :meth:`replayed`, then call
    :meth:`replay_done` (with whether the socket answered), which may return one more
    :class:`Replay` to run (after a restart seen by a probe: everything from 0). When idle,
    call :meth:`due_replay` now and then and run what it returns the same way."""

    def __init__(
        self,
        sink: StreamSink,
        *,
        can_replay: bool = True,
        replay_on_start: bool = True,
        max_jump: int = DEFAULT_MAX_JUMP,
        stall_after_s: float = DEFAULT_STALL_S,
        tail_check_s: float = DEFAULT_TAIL_CHECK_S,
        probe_interval_s: float = DEFAULT_PROBE_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.sink = sink
        self.can_replay = can_replay
        self.replay_on_start = replay_on_start
        self.max_jump = max_jump
        self.stall_after_s = stall_after_s
        self.tail_check_s = tail_check_s
        self.probe_interval_s = probe_interval_s
        self.clock = clock
        self.last_seq: int | None = None  # last batch applied
        self._live: int | None = None  # last sequence number received live
        self._stray: tuple[int, bytes] | None = None
        self._held: tuple[int, bytes] | None = None  # waits for a replay to finish
        self._pending: Replay | None = None
        self._pending_applied = 0
        self._last_digest: int | None = None  # hash of the last applied batch's payload
        self._verified: bool | None = None
        now = clock()
        self._last_frame_at = now
        self._last_probe_at = now
        self._tail_checked = True
        self._expect_since: float | None = None
        # True once followed from seq 0 (or an AllBlocksCleared): the block set is the
        # engine's whole cache, not only what happened since we joined.
        self.complete = False
        self.stalled = False
        self.stall_reason = ""
        self.last_event_at: float | None = None  # wall clock of the last applied batch
        self.batches = self.gaps = self.replayed_batches = self.lost = 0
        self.decode_errors = self.unknown_events = self.restarts = 0
        self.strays = self.jumps = self.duplicates = self.stalls = self.replay_failures = 0

    # ------------------------------------------------------------------ live frames

    def receive(self, seq: int, payload: bytes) -> Replay | None:
        if seq < 0:  # never valid on the live stream (-1 ends a replay)
            self.decode_errors += 1
            return None
        self._last_frame_at = self.clock()
        self._tail_checked = False
        if self._pending is not None:  # a driver that skipped replay_done
            self.replay_done(answered=False)
        if self._stray is not None:
            stray_seq, stray_payload = self._stray
            self._stray = None
            if seq == stray_seq + 1:
                # Two frames agree: the stream did move on that far (a long outage). What
                # lies between is beyond any replay buffer; start over from the stray.
                self.jumps += 1
                self._start_over()
                self._live = stray_seq
                self._apply(stray_seq, stray_payload)
            else:
                self.strays += 1  # one stray frame: ignore it and go on
        if self._live is not None and seq <= self._live:
            self.restarts += 1  # a live stream never goes back: the engine restarted
            self._start_over()
        elif self.last_seq is not None and seq <= self.last_seq:
            self._live = seq
            self.duplicates += 1  # a replay delivered it already
            return None
        elif self.last_seq is not None and seq > self.last_seq + self.max_jump:
            self._stray = (seq, payload)  # believe it only if the next frame agrees
            return None
        self._live = seq
        start = 0 if self.last_seq is None else self.last_seq + 1
        if seq > start:
            if self.last_seq is not None:
                self.gaps += 1
            if self.can_replay and (self.last_seq is not None or self.replay_on_start):
                self._held = (seq, payload)
                self._pending = Replay(start, seq)
                self._pending_applied = 0
                return self._pending
            if self.last_seq is not None:
                self.lost += seq - start
        self._apply(seq, payload)
        return None

    # ------------------------------------------------------------------ replays

    def due_replay(self) -> Replay | None:
        """While the stream is quiet: once after ``tail_check_s`` look for a lost last
        batch (it shows no gap until the next one), then probe every
        ``probe_interval_s`` that the publisher is still there."""
        if not self.can_replay or self._pending is not None:
            return None
        now = self.clock()
        quiet = now - self._last_frame_at
        start = 0 if self.last_seq is None else self.last_seq + 1
        if not self._tail_checked and quiet >= self.tail_check_s:
            self._tail_checked = True
            self._last_probe_at = now
        elif self.probe_interval_s > 0 and now - self._last_probe_at >= self.probe_interval_s \
                and quiet >= self.probe_interval_s:
            self._last_probe_at = now
        else:
            return None
        if self.last_seq is None and not self.replay_on_start:
            return None
        self._pending = Replay(start, None, probe=True) if self.last_seq is None else \
            Replay(self.last_seq, None, probe=True, verify=self.last_seq)
        self._pending_applied = 0
        self._verified = None
        return self._pending

    def replayed(self, seq: int, payload: bytes) -> bool:
        """One batch from the replay socket; applied if it is the next one we need."""
        r = self._pending
        if r is not None and r.verify is not None:
            if self._verified is None:
                self._verified = seq == r.verify and hash(payload) == self._last_digest
            if not self._verified:
                return False  # another engine's batches: replay_done starts over
        last = -1 if self.last_seq is None else self.last_seq
        if r is None or seq <= last or seq < r.start or (r.stop is not None and seq >= r.stop):
            return False
        self._apply(seq, payload)
        self._pending_applied += 1
        self.replayed_batches += 1
        return True

    def replay_done(self, answered: bool) -> Replay | None:
        r, self._pending = self._pending, None
        if r is None:
            return None
        if answered and r.verify is not None and not self._verified:
            # The publisher no longer has the batch we applied last (or has another one
            # under its number): the engine restarted unseen. Start over from its seq 0.
            self.restarts += 1
            self._start_over()
            self._held = None
            self._pending = Replay(0, None)
            self._pending_applied = 0
            return self._pending
        if not answered:
            self.replay_failures += 1
            if r.probe:
                self._stall("no answer from the replay socket")
        elif r.probe:
            if self._pending_applied:
                self.gaps += 1  # the tail had been lost on the wire
            if self.stall_reason.startswith("no answer"):
                self._unstall()
        if r.stop is not None and r.start > 0:
            # Gap replays only: a late joiner's missing history is "incomplete", not lost.
            missing = r.stop - r.start - self._pending_applied
            if missing > 0:
                self.lost += missing
                self.complete = False
        held, self._held = self._held, None
        if held is not None:
            self._apply(*held)
        return None

    # ------------------------------------------------------------------ stalls

    def expect_events(self) -> None:
        """The owner sent the engine work that should produce events soon."""
        if self._expect_since is None:
            self._expect_since = self.clock()

    def check_stall(self) -> bool:
        if (
            not self.stalled
            and self._expect_since is not None
            and self.clock() - self._expect_since >= self.stall_after_s
        ):
            self._stall(f"no KV events {self.stall_after_s:g}s after work was sent")
        return self.stalled

    def _stall(self, reason: str) -> None:
        if not self.stalled:
            self.stalls += 1
        self.stalled, self.stall_reason = True, reason

    def _unstall(self) -> None:
        self.stalled, self.stall_reason = False, ""

    # ------------------------------------------------------------------ applying

    def _start_over(self) -> None:
        self.sink.reset()
        self.last_seq = None
        self._live = None
        self.complete = False

    def _apply(self, seq: int, payload: bytes) -> None:
        self.last_seq = seq
        self._last_digest = hash(payload)
        self._expect_since = None
        if self.stalled:
            self._unstall()
        try:
            batch = decode_batch(payload)
        except KvEventDecodeError:
            self.decode_errors += 1
            return
        self.batches += 1
        self.unknown_events += batch.unknown
        self.last_event_at = time.time()
        if seq == 0 or any(isinstance(e, AllBlocksCleared) for e in batch.events):
            self.complete = True
        self.sink.apply(batch.events)

    def stats(self) -> dict[str, Any]:
        return {
            "last_seq": -1 if self.last_seq is None else self.last_seq,
            "batches": self.batches,
            "gaps": self.gaps,
            "replayed": self.replayed_batches,
            "lost": self.lost,
            "decode_errors": self.decode_errors,
            "unknown_events": self.unknown_events,
            "restarts": self.restarts,
            "strays": self.strays,
            "jumps": self.jumps,
            "complete": self.complete,
            "stalled": self.stalled,
            "stall_reason": self.stall_reason,
        }
