"""KV-cache blocks: vLLM-style chained block hashes and a block manager with prefix caching.

A full block's hash covers its parent's hash and its own tokens, so equal hashes mean equal
prefixes. Hashes are u64 from blake2b with a fixed key: deterministic across processes and
machines (never Python's salted ``hash()``); pin ``HASH_KEY`` fleet-wide, as with vLLM's seed.

Free blocks sit in one LRU queue (vLLM's free block queue): a finished request's blocks are
appended tail-first, so the end of a prompt is evicted before its beginning; allocation takes
from the front and evicts the cached hash it finds there. A prefix hit on a free cached block
takes it out of the queue.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections import OrderedDict, deque
from collections.abc import Sequence

HASH_KEY = b"pdplane-sim-kv-v1"
ROOT_PARENT_HASH = 0  # hashing seed for a prompt's first block (reported parent is None)
MAX_BUFFERED_EVENTS = 100_000

_blake2b = hashlib.blake2b
_BIG_ENDIAN = sys.byteorder == "big"


def _token_bytes(token_ids: Sequence[int]) -> bytes:
    packed = array("I", token_ids)
    if _BIG_ENDIAN:  # hashes are defined over little-endian u32 tokens
        packed.byteswap()
    return packed.tobytes()


def hash_block(parent_hash: int | None, token_ids: Sequence[int]) -> int:
    """u64 hash of one block given its parent's hash (None for the first block):
    blake2b-64, keyed, over the parent as little-endian u64 then the tokens as u32."""
    parent = ROOT_PARENT_HASH if parent_hash is None else parent_hash
    digest = _blake2b(
        parent.to_bytes(8, "little") + _token_bytes(token_ids), digest_size=8, key=HASH_KEY
    ).digest()
    return int.from_bytes(digest, "little")


def chain_hashes(
    token_ids: Sequence[int], block_size: int, parent_hash: int | None = None
) -> list[int]:
    """Hashes of every *full* block of ``token_ids``, chained from ``parent_hash``."""
    full = len(token_ids) // block_size
    if full == 0:
        return []
    data = _token_bytes(token_ids[: full * block_size])
    width = 4 * block_size
    parent = (ROOT_PARENT_HASH if parent_hash is None else parent_hash).to_bytes(8, "little")
    digests = []
    key = HASH_KEY
    for start in range(0, full * width, width):
        parent = _blake2b(parent + data[start : start + width], digest_size=8, key=key).digest()
        digests.append(parent)
    from_bytes = int.from_bytes
    return [from_bytes(d, "little") for d in digests]


class KVBlockManager:
    """Blocks of one engine: reference counts, the hash→block cache map and the LRU queue."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        record_events: bool = True,
    ) -> None:
        if num_blocks <= 0:
            raise ValueError("num_blocks must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.record_events = record_events
        self.ref = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.events: deque[dict] = deque(maxlen=MAX_BUFFERED_EVENTS)
        self.events_dropped = 0

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    def longest_cached_prefix(self, hashes: Sequence[int], limit: int | None = None) -> list[int]:
        """Block ids of the longest run of ``hashes`` (from the start) that is cached."""
        if not self.enable_prefix_caching:
            return []
        get = self.cached.get
        found = []
        end = len(hashes) if limit is None else min(limit, len(hashes))
        for index in range(end):
            block = get(hashes[index])
            if block is None:
                break
            found.append(block)
        return found

    def count_cached_prefix(self, hashes: Sequence[int]) -> int:
        """Length in blocks of the cached prefix of ``hashes`` (no side effects)."""
        cached = self.cached
        count = 0
        for block_hash in hashes:
            if block_hash not in cached:
                break
            count += 1
        return count

    def touch(self, blocks: Sequence[int]) -> None:
        """Take a reference on cached blocks found by a prefix hit."""
        ref = self.ref
        free = self.free
        for block in blocks:
            if ref[block] == 0:
                del free[block]
            ref[block] += 1

    def num_evictable(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` are free now (a hit on them takes them off the free queue)."""
        ref = self.ref
        return sum(1 for block in blocks if ref[block] == 0)

    def allocate(self, count: int) -> list[int] | None:
        """``count`` fresh blocks from the LRU front, evicting their cached hashes; None if
        there are not enough free blocks."""
        free = self.free
        if count > len(free):
            return None
        popitem = free.popitem
        out = [popitem(last=False)[0] for _ in range(count)]
        ref = self.ref
        for block in out:
            ref[block] = 1
        block_hash = self.block_hash
        evicted = [block for block in out if block_hash[block] is not None]
        if evicted:
            cached = self.cached
            removed = []
            for block in evicted:
                old = block_hash[block]
                block_hash[block] = None
                if cached.get(old) == block:
                    del cached[old]
                removed.append(old)
            if self.record_events:
                self._emit({"type": "BlockRemoved", "block_hashes": removed, "medium": "GPU"})
        return out

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference on each block; blocks reaching zero join the LRU tail, last
        block first (so a prompt's tail is evicted before its shared head)."""
        ref = self.ref
        free = self.free
        for block in reversed(blocks):
            count = ref[block] - 1
            ref[block] = count
            if count == 0:
                free[block] = None

    def cache_full_blocks(
        self,
        blocks: Sequence[int],
        hashes: Sequence[int],
        start: int,
        end: int,
        token_ids: Sequence[int] | None,
    ) -> None:
        """Register blocks ``start..end-1`` of a request (now full and computed) under their
        hashes, and emit one BlockStored for those newly cached."""
        if not self.enable_prefix_caching or end <= start:
            return
        cached = self.cached
        block_hash = self.block_hash
        run_start = -1
        for index in range(start, end):
            value = hashes[index]
            block = blocks[index]
            if value in cached or block_hash[block] is not None:
                # Another request computed the same block first: keep theirs.
                if run_start >= 0:
                    self._stored(hashes, run_start, index, token_ids)
                    run_start = -1
                continue
            cached[value] = block
            block_hash[block] = value
            if run_start < 0:
                run_start = index
        if run_start >= 0:
            self._stored(hashes, run_start, end, token_ids)

    def _stored(
        self, hashes: Sequence[int], start: int, end: int, token_ids: Sequence[int] | None
    ) -> None:
        if not self.record_events:
            return
        bs = self.block_size
        self._emit(
            {
                "type": "BlockStored",
                "block_hashes": list(hashes[start:end]),
                "parent_block_hash": hashes[start - 1] if start > 0 else None,
                "token_ids": [] if token_ids is None else list(token_ids[start * bs : end * bs]),
                "block_size": bs,
                "lora_id": None,
                "medium": "GPU",
                "lora_name": None,
            }
        )

    def reset_prefix_cache(self) -> bool:
        """Forget every free cached block (vLLM's reset_prefix_cache); False if blocks are
        still in use, as vLLM refuses then."""
        if self.num_used:
            return False
        self.cached.clear()
        self.block_hash = [None] * self.num_blocks
        if self.record_events:
            self._emit({"type": "AllBlocksCleared"})
        return True

    def drain_events(self) -> list[dict]:
        out = list(self.events)
        self.events.clear()
        return out

    def _emit(self, event: dict) -> None:
        if len(self.events) == self.events.maxlen:
            self.events_dropped += 1
        self.events.append(event)
