"""Where does a prompt's prefix already sit in KV cache? Two pure indexes and a decoder.

- :class:`ApproxPrefixIndex` learns from the gateway's own routing decisions: the prompt
  text is cut into fixed-size character chunks (≈ one KV block each at 4 chars/token, as
  llm-d's approximate mode does), chained-hashed, and each chunk hash remembers which
  workers were sent it, until the worker's LRU bound (its KV capacity) pushes it out — or,
  where the capacity is unknown, for a TTL (120 s as in SGLang's and vllm-router's
  approximate trees).
- :class:`PreciseIndex` is fed by the engines' KV-cache events (BlockStored /
  BlockRemoved / AllBlocksCleared). It re-hashes each stored block's token ids with its own
  chained hash (engine hashes depend on an algorithm and seed we cannot rely on), so a
  request whose token ids are known (prompt given as ids, or tokenised by the engine's
  /tokenize) is matched exactly, and evictions are seen as they happen.
- KV events are decoded by :mod:`workers_agent.kvstream` (every wire variant), re-exported
  here.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

from workers_agent.kvstream import (  # noqa: F401 - re-exported for the gateway's callers
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEvent,
    KvEventDecodeError,
    decode_event_batch,
)

CHARS_PER_TOKEN = 4.0
_FOREVER = float("inf")
ROOT = b"pdplane-prefix-v1"


_blake2b = hashlib.blake2b


def _h(parent: bytes, chunk: bytes) -> bytes:
    return _blake2b(parent + chunk, digest_size=8).digest()


def text_chunk_hashes(text: str, chunk_chars: int, limit: int = 4096) -> list[bytes]:
    """Chained hashes of the full ``chunk_chars``-character chunks of ``text`` (at most
    ``limit``, and at least one where there is a full chunk)."""
    data = text.encode("utf-8", "surrogatepass")
    step = int(chunk_chars)
    if step < 1:
        step = 1
    # The number of chunks up front instead of a length test per chunk, and _h inlined
    # (issue 19: this runs on every request; the same hashes as before,
    # tests/unit/test_gateway_hot_paths_prefix_index.py).
    end = len(data) // step
    if end > limit:
        end = limit if limit >= 1 else (1 if end else 0)
    out: list[bytes] = []
    append, blake2b, parent = out.append, _blake2b, ROOT
    for start in range(0, end * step, step):
        parent = blake2b(parent + data[start : start + step], digest_size=8).digest()
        append(parent)
    return out


def token_block_hashes(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """Chained hashes of the full blocks of a token-id sequence."""
    out, parent = [], ROOT
    bs = max(int(block_size), 1)
    for start in range(0, len(token_ids) - bs + 1, bs):
        block = token_ids[start : start + bs]
        parent = _h(parent, struct.pack(f"<{len(block)}q", *block))
        out.append(parent)
    return out


def request_text(body: dict[str, Any]) -> str:
    """The text that decides prefix reuse: the prompt, or the chat messages in order."""
    if "messages" in body:
        parts = []
        for message in body.get("messages") or []:
            if not isinstance(message, dict):
                continue
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(
                    str(p.get("text", "")) for p in content if isinstance(p, dict)
                )
            parts.append(f"<{message.get('role', '')}>{content or ''}")
        return "\n".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return "\n".join(prompt)
    return ""


def request_token_ids(body: dict[str, Any]) -> list[int] | None:
    """Token ids when the client sent them (``prompt: [int, …]``), else None."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    ):
        return prompt
    if (
        isinstance(prompt, list)
        and len(prompt) == 1
        and isinstance(prompt[0], list)
        and all(isinstance(t, int) for t in prompt[0])
    ):
        return prompt[0]
    return None


class TokenEstimator:
    """Characters per token, learned from the engines' usage counts (EMA)."""

    def __init__(self, initial: float = CHARS_PER_TOKEN, alpha: float = 0.1):
        self.chars_per_token = initial
        self.alpha = alpha

    def estimate(self, chars: int) -> int:
        return int(chars / self.chars_per_token) if chars else 0

    def observe(self, chars: int, tokens: int) -> None:
        if chars <= 0 or tokens <= 0:
            return
        ratio = min(max(chars / tokens, 0.5), 32.0)
        self.chars_per_token += self.alpha * (ratio - self.chars_per_token)


class ApproxPrefixIndex:
    """Chunk hash → workers believed to hold it: per worker, an LRU bounded by the worker's
    KV capacity (``set_capacity``), and a TTL for workers whose capacity is not known. An
    engine evicts least-recently-used blocks when full, so believing it still holds
    everything it was ever sent would send requests after prefixes long gone; an engine
    with room evicts nothing, so with its capacity known the LRU bound alone follows its
    eviction (entries recorded before the capacity was set keep their TTL until sent
    again)."""

    def __init__(self, ttl_s: float = 120.0, max_entries: int = 500_000):
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, bytes], dict[str, float]] = OrderedDict()
        self._lru: dict[str, OrderedDict[tuple[str, bytes], None]] = {}
        self._capacity: dict[str, int] = {}
        # Per worker: chunks sent to it that it did not hold yet (new KV it had to make room
        # for), decayed with a half-life of ``ttl_s``, and when that was last brought up to date.
        self._inflow: dict[str, tuple[float, float]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def set_capacity(self, worker_id: str, chunks: int | None) -> None:
        """At most ``chunks`` entries are remembered for the worker (None/0: no bound)."""
        if chunks:
            self._capacity[worker_id] = int(chunks)
            self._trim(worker_id)
        else:
            self._capacity.pop(worker_id, None)

    def match(self, model: str, hashes: Sequence[bytes], now: float) -> dict[str, int]:
        """Worker id → number of leading chunks it is believed to hold."""
        # Plain loops, no comprehension per chunk (each is a call): the workers alive at the
        # first chunk, in the same set (so ``matched`` keeps its order), then only those
        # of them whose entry has not expired. A worker's count is written once, when it
        # drops out or at the end (issue 19: not once per chunk).
        get = self._entries.get
        matched: dict[str, int] = {}
        alive: set[str] | None = None
        n = 0
        for h in hashes:
            holders = get((model, h))
            if not holders:
                break
            if alive is None:
                alive = set()
                for w, expiry in holders.items():
                    if expiry > now:
                        alive.add(w)
                if not alive:
                    return matched
                for w in alive:
                    matched[w] = 1
            else:
                gone = None
                for w in alive:
                    expiry = holders.get(w)
                    if expiry is None or not expiry > now:
                        if gone is None:
                            gone = []
                        gone.append(w)
                if gone is not None:
                    for w in gone:
                        matched[w] = n
                    alive = alive.difference(gone)
                    if not alive:
                        return matched
            n += 1
        if n > 1:
            for w in alive:
                matched[w] = n
        return matched

    def inflow(self, worker_id: str, now: float) -> float:
        """Recent new KV sent to the worker, in chunks (decayed, half-life ``ttl_s``). An
        engine's LRU cache keeps as much history as it has room for: the worker that has
        taken the least new KV lately is the one whose older prefixes survive longest."""
        value, at = self._inflow.get(worker_id, (0.0, now))
        return value * 0.5 ** (max(now - at, 0.0) / self.ttl_s)

    def record(self, model: str, hashes: Iterable[bytes], worker_id: str, now: float) -> None:
        # A worker whose capacity is known keeps what it was sent until its LRU bound pushes
        # it out (``_trim``), as the engine does: an engine with room evicts nothing, and a
        # TTL shorter than its real retention forgot prefixes it still held (Mooncake at 1×,
        # 32 engines: 18.0 % of prompt tokens found cached with the TTL, 21.6 % without;
        # docs/benchmarks.md issue 18). The TTL stays the guess for unknown capacity.
        capacity = self._capacity.get(worker_id)
        expiry = _FOREVER if capacity is not None else now + self.ttl_s
        lru = self._lru.get(worker_id)
        if lru is None:
            lru = self._lru[worker_id] = OrderedDict()
        entries = self._entries
        new = 0
        for h in hashes:
            key = (model, h)
            if key in lru:
                lru.move_to_end(key)
            else:
                lru[key] = None  # a new key goes last: what move_to_end would do
                new += 1
            holders = entries.get(key)
            if holders is None:
                entries[key] = {worker_id: expiry}
            else:
                entries.move_to_end(key)
                holders[worker_id] = expiry
        # inflow(worker_id, now) + new, inlined (two calls fewer a request)
        value, at = self._inflow.get(worker_id, (0.0, now))
        since = now - at
        if since > 0.0:
            value *= 0.5 ** (since / self.ttl_s)
        self._inflow[worker_id] = (value + new, now)
        if capacity and len(lru) > capacity:
            self._trim(worker_id)
        while len(entries) > self.max_entries:
            key, holders = entries.popitem(last=False)
            for w in holders:
                self._lru.get(w, {}).pop(key, None)

    def _trim(self, worker_id: str) -> None:
        cap = self._capacity.get(worker_id)
        lru = self._lru.get(worker_id)
        if not cap or lru is None:
            return
        while len(lru) > cap:
            key, _ = lru.popitem(last=False)
            holders = self._entries.get(key)
            if holders is not None:
                holders.pop(worker_id, None)
                if not holders:
                    del self._entries[key]

    def forget_worker(self, worker_id: str) -> None:
        self._inflow.pop(worker_id, None)
        for key in self._lru.pop(worker_id, {}):
            holders = self._entries.get(key)
            if holders is not None:
                holders.pop(worker_id, None)
                if not holders:
                    del self._entries[key]

    def expire(self, now: float) -> None:
        """Drop expired holders (run now and then; match() ignores them anyway)."""
        dead = []
        for key, holders in self._entries.items():
            for w in [w for w, t in holders.items() if t <= now]:
                del holders[w]
                self._lru.get(w, {}).pop(key, None)
            if not holders:
                dead.append(key)
        for key in dead:
            del self._entries[key]


# --- KV events: decoded by the one stream module (shared with the agent) --------------

class PreciseIndex:
    """Worker holdings from KV events, keyed by our own chained hash of token ids."""

    def __init__(self):
        self._holders: dict[bytes, set[str]] = {}
        # Per worker: engine block hash → our hash (to follow parents and removals).
        self._by_worker: dict[str, dict[Any, bytes]] = {}
        self.block_size: int = 0
        self.events_applied = 0
        self.unknown_parents = 0
        # apply_hashed/match_hashes: engine block hash → workers, worker → its hashes.
        self._hash_holders: dict[Any, set[str]] = {}
        self._engine_hashes: dict[str, set[Any]] = {}

    def workers(self) -> list[str]:
        return list(self._by_worker)

    def apply(self, worker_id: str, events: Iterable[KvEvent]) -> None:
        mine = self._by_worker.setdefault(worker_id, {})
        for event in events:
            self.events_applied += 1
            if isinstance(event, BlockStored):
                self._stored(worker_id, mine, event)
            elif isinstance(event, BlockRemoved):
                for engine_hash in event.block_hashes:
                    ours = mine.pop(engine_hash, None)
                    if ours is not None:
                        holders = self._holders.get(ours)
                        if holders is not None:
                            holders.discard(worker_id)
                            if not holders:
                                del self._holders[ours]
            elif isinstance(event, AllBlocksCleared):
                self.forget_worker(worker_id)
                mine = self._by_worker.setdefault(worker_id, {})

    def _stored(self, worker_id: str, mine: dict, event: BlockStored) -> None:
        bs = event.block_size or self.block_size
        if bs <= 0:
            return
        self.block_size = self.block_size or bs
        if event.parent_block_hash is None:
            parent = ROOT
        else:
            parent = mine.get(event.parent_block_hash)
            if parent is None:
                # We missed the parent (events lost or started late): cannot chain.
                self.unknown_parents += 1
                return
        tokens = event.token_ids
        for i, engine_hash in enumerate(event.block_hashes):
            block = tokens[i * bs : (i + 1) * bs]
            if len(block) < bs:
                break
            parent = _h(parent, struct.pack(f"<{len(block)}q", *block))
            mine[engine_hash] = parent
            self._holders.setdefault(parent, set()).add(worker_id)

    def forget_worker(self, worker_id: str) -> None:
        for ours in self._by_worker.pop(worker_id, {}).values():
            holders = self._holders.get(ours)
            if holders is not None:
                holders.discard(worker_id)
                if not holders:
                    del self._holders[ours]

    def apply_hashed(self, worker_id: str, events: Iterable[dict]) -> None:
        """KV events (as maps) keyed by the engine's own block hashes, for engines that all
        hash blocks the same way (the simulator's do): no token ids needed. Matched with
        :meth:`match_hashes`."""
        held = self._engine_hashes.setdefault(worker_id, set())
        for event in events:
            self.events_applied += 1
            kind = event.get("type")
            if kind == "BlockStored":
                self.block_size = self.block_size or int(event.get("block_size") or 0)
                for h in event.get("block_hashes") or ():
                    held.add(h)
                    self._hash_holders.setdefault(h, set()).add(worker_id)
            elif kind == "BlockRemoved":
                removed = set(event.get("block_hashes") or ()) & held
                held -= removed
                self._drop_hashes(worker_id, removed)
            elif kind == "AllBlocksCleared":
                self._drop_hashes(worker_id, held)
                held.clear()

    def _drop_hashes(self, worker_id: str, hashes: Iterable[Any]) -> None:
        for h in hashes:
            holders = self._hash_holders.get(h)
            if holders is not None:
                holders.discard(worker_id)
                if not holders:
                    del self._hash_holders[h]

    def match_hashes(self, block_hashes: Sequence[Any]) -> dict[str, int]:
        """Worker id → leading tokens it holds, by engine block hashes (:meth:`apply_hashed`)."""
        return _leading_match(block_hashes, self._hash_holders, self.block_size)

    def match(self, token_ids: Sequence[int]) -> dict[str, int]:
        """Worker id → number of leading tokens it holds (whole blocks)."""
        if not self.block_size:
            return {}
        return _leading_match(token_block_hashes(token_ids, self.block_size), self._holders,
                              self.block_size)


def _leading_match(hashes: Iterable[Any], holders_of: dict[Any, set[str]],
                   unit: int) -> dict[str, int]:
    """Worker id → ``unit`` × the number of leading hashes it holds."""
    matched: dict[str, int] = {}
    alive: set[str] | None = None
    for i, h in enumerate(hashes):
        holders = holders_of.get(h)
        if not holders:
            break
        alive = set(holders) if alive is None else alive & holders
        if not alive:
            break
        for w in alive:
            matched[w] = (i + 1) * unit
    return matched
