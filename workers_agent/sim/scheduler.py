"""The engine's scheduler: vLLM v1's continuous batching over a token budget.

Every step: running sequences first, in order — each gets the tokens it still needs
(1 when decoding, up to the remaining prompt when prefilling: chunked prefill) while the
per-step token budget lasts; when its new tokens need blocks and none are free, the most
recently admitted running sequence is preempted (its blocks are freed and it is recomputed
later, helped by whatever of its prefix stays cached). Then, if nothing was preempted,
waiting sequences are admitted in arrival order while the budget, ``max_num_seqs`` and free
blocks allow: each first takes its prefix-cache hit (whole blocks; at least one prompt token
is always computed, as in vLLM), and a P/D decode-side sequence takes the transferred KV as
computed and waits ``transfer_seconds`` before its first step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence as SequenceABC

from .blocks import KVBlockManager

WAITING = "waiting"
RUNNING = "running"
HELD = "held"  # finished on the prefill side, blocks kept for the decode side to pull
FINISHED = "finished"
ABORTED = "aborted"


class Sequence:
    """Scheduler state of one request. Generated tokens are not stored: they are a pure
    function of (seed, index), produced when sampled."""

    __slots__ = (
        "arrival_time",
        "blocks",
        "first_scheduled_time",
        "hashes",
        "hold",
        "kv_from_remote",
        "max_tokens",
        "num_cached_tokens",
        "num_computed",
        "num_external_tokens",
        "num_output",
        "num_preemptions",
        "num_prompt",
        "num_registered",
        "ready_at",
        "remote_pending",
        "request_id",
        "seed",
        "status",
        "token_ids",
        "transfer_seconds",
    )

    def __init__(
        self,
        request_id: str,
        num_prompt: int,
        hashes: list[int],
        token_ids: SequenceABC[int] | None,
        max_tokens: int,
        arrival_time: float,
        seed: int,
        kv_from_remote: int = 0,
        transfer_seconds: float = 0.0,
        hold: bool = False,
    ) -> None:
        self.request_id = request_id
        self.num_prompt = num_prompt
        self.hashes = hashes
        self.token_ids = token_ids
        self.max_tokens = max_tokens
        self.arrival_time = arrival_time
        self.seed = seed
        self.kv_from_remote = kv_from_remote
        self.transfer_seconds = transfer_seconds
        self.hold = hold
        self.remote_pending = kv_from_remote > 0
        self.num_computed = 0
        self.num_output = 0
        self.blocks: list[int] = []
        self.num_registered = 0  # prompt blocks already offered to the prefix cache
        self.status = WAITING
        self.ready_at = 0.0
        self.num_cached_tokens = -1  # local prefix-cache hit at first admission
        self.num_external_tokens = 0
        self.num_preemptions = 0
        self.first_scheduled_time = -1.0

    @property
    def num_tokens(self) -> int:
        return self.num_prompt + self.num_output


class SchedulerConfig:
    __slots__ = ("block_size", "enable_prefix_caching", "max_num_batched_tokens", "max_num_seqs")

    def __init__(
        self,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_prefix_caching: bool,
    ) -> None:
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_prefix_caching = enable_prefix_caching


class ScheduleResult:
    """What one step runs: ``entries`` of (sequence, new tokens), plus counters for stats."""

    __slots__ = (
        "entries",
        "external_tokens",
        "hit_tokens",
        "next_ready_at",
        "preemptions",
        "query_tokens",
    )

    def __init__(self) -> None:
        self.entries: list[tuple[Sequence, int]] = []
        self.preemptions = 0
        self.query_tokens = 0
        self.hit_tokens = 0
        self.external_tokens = 0
        self.next_ready_at = float("inf")


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVBlockManager) -> None:
        self.config = config
        self.kv = kv
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def preempt(self, seq: Sequence) -> None:
        """Recompute preemption: free the blocks, back to the front of the queue."""
        self.kv.release(seq.blocks)
        seq.blocks = []
        seq.num_computed = 0
        seq.num_registered = 0
        seq.status = WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)

    def remove(self, seq: Sequence) -> None:
        """Take a sequence out of the queues (finish or abort); its blocks are the caller's."""
        if seq.status == RUNNING:
            self.running.remove(seq)
        elif seq.status == WAITING:
            self.waiting.remove(seq)

    def schedule(self, now: float) -> ScheduleResult:
        config = self.config
        bs = config.block_size
        kv = self.kv
        result = ScheduleResult()
        entries = result.entries
        budget = config.max_num_batched_tokens
        running = self.running

        index = 0
        while index < len(running) and budget > 0:
            seq = running[index]
            if seq.ready_at > now:
                result.next_ready_at = min(result.next_ready_at, seq.ready_at)
                index += 1
                continue
            num_new = min(seq.num_prompt + seq.num_output - seq.num_computed, budget)
            need = (seq.num_computed + num_new + bs - 1) // bs - len(seq.blocks)
            scheduled = True
            if need > 0:
                while need > kv.num_free:
                    victim = running.pop()
                    self.preempt(victim)
                    result.preemptions += 1
                    if victim is seq:
                        scheduled = False
                        break
                if not scheduled:
                    break
                seq.blocks.extend(kv.allocate(need))
            entries.append((seq, num_new))
            budget -= num_new
            index += 1

        if result.preemptions:
            return result

        waiting = self.waiting
        caching = config.enable_prefix_caching
        while waiting and budget > 0 and len(running) < config.max_num_seqs:
            seq = waiting[0]
            num_tokens = seq.num_prompt + seq.num_output
            # Prefix-cache hit: whole blocks, leaving at least one token to compute.
            hit_blocks = (
                kv.longest_cached_prefix(seq.hashes, (num_tokens - 1) // bs) if caching else []
            )
            computed = len(hit_blocks) * bs
            remote = 0
            if seq.remote_pending:
                target = min(seq.kv_from_remote, num_tokens - 1)
                remote = max(target - computed, 0)
            total = computed + remote
            waits_for_transfer = remote > 0 and seq.transfer_seconds > 0
            num_new = 0 if waits_for_transfer else min(num_tokens - total, budget)
            need = (total + num_new + bs - 1) // bs - len(hit_blocks)
            if need + kv.num_evictable(hit_blocks) > kv.num_free:
                break
            kv.touch(hit_blocks)
            seq.blocks = hit_blocks + kv.allocate(need)
            seq.num_computed = total
            seq.num_registered = len(hit_blocks)
            waiting.popleft()
            running.append(seq)
            seq.status = RUNNING
            result.query_tokens += num_tokens
            result.hit_tokens += computed
            if seq.num_cached_tokens < 0:
                seq.num_cached_tokens = computed
                seq.num_external_tokens = remote
                seq.first_scheduled_time = now
            if seq.remote_pending:
                seq.remote_pending = False
                result.external_tokens += remote
                if remote:
                    # The pulled KV lands in these blocks: cache them like computed ones.
                    full = min(total // bs, len(seq.hashes))
                    kv.cache_full_blocks(
                        seq.blocks, seq.hashes, seq.num_registered, full, seq.token_ids
                    )
                    seq.num_registered = max(seq.num_registered, full)
                if waits_for_transfer:
                    seq.ready_at = now + seq.transfer_seconds
                    result.next_ready_at = min(result.next_ready_at, seq.ready_at)
                    continue
            entries.append((seq, num_new))
            budget -= num_new
        return result
