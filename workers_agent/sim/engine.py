"""One simulated vLLM engine: a pure model driven by an external clock.

The engine does no I/O and never reads a clock: a driver calls :meth:`SimEngine.next_step`
with the current time, waits ``step.duration`` (sleeps in real time, schedules an event in
virtual time) and calls :meth:`SimEngine.finish_step`. The same model therefore serves the
asyncio servers (real time) and the discrete-event fleet (virtual time).

The records it takes and returns (spec, request, step, output, stats) are in
:mod:`workers_agent.sim.enginetypes`; the batching policy is :mod:`workers_agent.sim.scheduler`.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence as SequenceABC

from . import tokens as tok
from .blocks import KVBlockManager, chain_hashes, hash_block
from .enginetypes import (
    DecodeBurst,
    EngineSpec,
    EngineStats,
    Output,
    RequestRejectedError,
    SimRequest,
    Step,
)
from .scheduler import (
    ABORTED,
    FINISHED,
    HELD,
    RUNNING,
    WAITING,
    Scheduler,
    SchedulerConfig,
    Sequence,
)
from .timing import TimingModel

_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


def _prompt_seed(hashes: list[int], token_ids: SequenceABC[int] | None, num_prompt: int) -> int:
    """Seed of a request's generated tokens: its prompt (last full block hash, tail tokens)."""
    h = hashlib.blake2b(digest_size=8, person=b"pdplane-gen")
    h.update(num_prompt.to_bytes(8, "little"))
    h.update((hashes[-1] if hashes else 0).to_bytes(8, "little"))
    if token_ids is not None:
        tail = num_prompt % 64 or 64
        h.update(" ".join(map(str, token_ids[-tail:])).encode())
    return int.from_bytes(h.digest(), "little")


def generated_token(seed: int, index: int) -> int:
    """The ``index``-th generated token of a request: deterministic, an ordinary word."""
    x = (seed + (index + 1) * _GOLDEN) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    x ^= x >> 31
    return tok.FIRST_WORD_ID + x % tok.NUM_WORD_IDS


class SimEngine:
    def __init__(self, spec: EngineSpec):
        self.spec = spec
        self.engine_id = spec.engine_id
        self.block_size = spec.block_size
        self.num_gpu_blocks = spec.num_gpu_blocks or spec.derived_num_gpu_blocks()
        self.timing = TimingModel(spec.model, spec.hardware, spec.tp)
        self.kv = KVBlockManager(
            self.num_gpu_blocks, spec.block_size, spec.enable_prefix_caching,
            spec.record_kv_events,
        )
        self.scheduler = Scheduler(
            SchedulerConfig(
                spec.block_size, spec.max_num_seqs, spec.max_num_batched_tokens,
                spec.enable_prefix_caching,
            ),
            self.kv,
        )
        self._seqs: dict[str, Sequence] = {}  # waiting, running and held
        self._step_ids = itertools.count(1)
        self._pending: Step | None = None
        self._queries = 0
        self._hits = 0
        self._prompt_tokens = 0
        self._local_compute = 0
        self._cached = 0
        self._external = 0
        self._generation_tokens = 0
        self._preemptions = 0
        self._finished = 0
        self._aborted = 0
        self._busy = 0.0
        self._steps = 0
        self._by_reason: dict[str, int] = {}

    # -- requests ---------------------------------------------------------------------------

    def submit(self, req: SimRequest) -> None:
        if req.request_id in self._seqs:
            raise RequestRejectedError(f"duplicate request id {req.request_id!r}")
        if req.max_tokens < 1:
            raise RequestRejectedError("max_tokens must be at least 1")
        token_ids = req.prompt_token_ids or None
        if token_ids is not None:
            num_prompt = len(token_ids)
            hashes = req.block_hashes
            if hashes is None:
                hashes = chain_hashes(token_ids, self.block_size)
        else:
            if req.num_prompt_tokens is None or req.block_hashes is None:
                raise RequestRejectedError("a request needs prompt_token_ids")
            num_prompt = req.num_prompt_tokens
            hashes = req.block_hashes
        if num_prompt < 1:
            raise RequestRejectedError("the prompt is empty")
        if len(hashes) != num_prompt // self.block_size:
            raise RequestRejectedError("block_hashes do not match the prompt length")
        if token_ids is not None:
            # Private copies: generated tokens (and their block hashes) are appended.
            token_ids = list(token_ids)
            hashes = list(hashes)
        max_tokens = 1 if req.hold_for_remote_decode else req.max_tokens
        needed = -(-(num_prompt + max_tokens) // self.block_size)
        if needed > self.num_gpu_blocks:
            raise RequestRejectedError(
                f"prompt of {num_prompt} tokens + {max_tokens} to generate needs {needed} KV "
                f"blocks; the engine has {self.num_gpu_blocks}"
            )
        seq = Sequence(
            req.request_id, num_prompt, hashes, token_ids, max_tokens, req.arrival_time,
            _prompt_seed(hashes, token_ids, num_prompt),
            kv_from_remote=min(max(req.kv_from_remote, 0), num_prompt),
            transfer_seconds=max(req.transfer_seconds, 0.0),
            hold=req.hold_for_remote_decode,
        )
        self._seqs[req.request_id] = seq
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> bool:
        """Drop a request wherever it is and free its blocks; False if unknown."""
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return False
        if seq.status in (WAITING, RUNNING):
            self.scheduler.remove(seq)
        self.kv.release(seq.blocks)
        seq.blocks = []
        seq.status = ABORTED
        self._aborted += 1
        return True

    def release_held(self, request_id: str) -> bool:
        seq = self._seqs.get(request_id)
        if seq is None or seq.status != HELD:
            return False
        del self._seqs[request_id]
        self.kv.release(seq.blocks)
        seq.blocks = []
        seq.status = FINISHED
        return True

    def expire_held(self, now: float, max_age_s: float) -> list[str]:
        """Release held blocks nobody pulled within ``max_age_s`` of their arrival (vLLM's
        abort timeout for remote decode); returns the released request ids."""
        stale = [
            rid for rid, seq in self._seqs.items()
            if seq.status == HELD and now - seq.arrival_time > max_age_s
        ]
        for rid in stale:
            self.release_held(rid)
        return stale

    def held_blocks(self, request_id: str) -> list[int] | None:
        """Block ids a prefill-side request holds for the decode side (None if not held);
        what vLLM returns as ``remote_block_ids``."""
        seq = self._seqs.get(request_id)
        if seq is None or seq.status != HELD:
            return None
        return list(seq.blocks)

    def is_queued(self, request_id: str) -> bool:
        """True while the request waits in the queue: not yet admitted to a batch, or
        preempted back to it (a P/D decode whose KV is in transfer is admitted)."""
        seq = self._seqs.get(request_id)
        return seq is not None and seq.status == WAITING

    def has_request(self, request_id: str) -> bool:
        return request_id in self._seqs

    # -- steps --------------------------------------------------------------------------------

    def has_work(self) -> bool:
        return bool(self.scheduler.waiting or self.scheduler.running)

    def next_step(self, now: float) -> Step | None:
        """Plan the next iteration at ``now``. None: nothing can run (idle, or every queued
        request waits for blocks that only a finish, abort or ``release_held`` frees — call
        again after those). A step with ``idle=True`` means only P/D transfers are in flight:
        wait up to ``duration`` (or less, if new work arrives) and plan again; finishing an
        idle step is optional and does nothing. Otherwise call :meth:`finish_step` after
        ``duration`` seconds, before planning the next step."""
        if self._pending is not None:
            raise RuntimeError("finish_step() the previous step first")
        sched = self.scheduler
        if not sched.waiting and not sched.running:
            return None
        result = sched.schedule(now)
        self._queries += result.query_tokens
        self._hits += result.hit_tokens
        self._external += result.external_tokens
        self._preemptions += result.preemptions
        entries = result.entries
        if not entries:
            if result.next_ready_at != float("inf"):
                # Only transfers in flight: an idle step until the first one lands.
                return Step(next(self._step_ids), [], result.next_ready_at - now, now, idle=True)
            return None
        chunks = []
        decode_seqs = 0
        decode_context = 0
        prefill_tokens = 0
        for seq, num_new in entries:
            if num_new == 1 and seq.num_output > 0 and seq.num_computed >= seq.num_prompt:
                decode_seqs += 1
                decode_context += seq.num_computed
            else:
                chunks.append((num_new, seq.num_computed))
                prefill_tokens += num_new
        duration = self.timing.step_seconds(chunks, decode_seqs, decode_context)
        step = Step(
            next(self._step_ids), entries, duration, now, prefill_tokens, decode_seqs,
        )
        self._pending = step
        return step

    def decode_burst(
        self, now: float, horizon: float, max_steps: int = 100_000
    ) -> DecodeBurst | None:
        """Run, in one call, the pure-decode steps that would end by ``horizon`` — only when
        nothing can change the batch before then: no queue, every running sequence decoding,
        blocks free for all the steps, and (the caller's promise) no new work arriving before
        ``horizon``. The state is advanced at once; the step times say when each token came.
        None (use :meth:`next_step`) when fewer than two such steps fit."""
        sched = self.scheduler
        running = sched.running
        if self._pending is not None or sched.waiting or not running:
            return None
        batch = len(running)
        if batch > self.spec.max_num_batched_tokens:
            return None
        context = 0
        remaining = max_steps
        for seq in running:
            if (
                seq.num_output == 0
                or seq.token_ids is not None  # token-level mode: step by step
                or seq.ready_at > now
                or seq.num_computed != seq.num_prompt + seq.num_output - 1
            ):
                return None
            context += seq.num_computed
            left = seq.max_tokens - seq.num_output
            if left < remaining:
                remaining = left
        decode_seconds = self.timing.decode_seconds
        times = []
        t = now
        for _ in range(remaining):
            t += decode_seconds(batch, context)
            if t >= horizon:  # strictly before: ties go to the step-by-step path
                break
            times.append(t)
            context += batch
        steps = len(times)
        if steps < 2:
            return None
        bs = self.block_size
        need = 0
        for seq in running:
            need += (seq.num_computed + steps + bs - 1) // bs - len(seq.blocks)
        if need > self.kv.num_free:
            return None
        allocate = self.kv.allocate
        entries = []
        finished = []
        for seq in running:
            more = (seq.num_computed + steps + bs - 1) // bs - len(seq.blocks)
            if more > 0:
                seq.blocks.extend(allocate(more))
            seq.num_computed += steps
            seq.num_output += steps
            done = seq.num_output >= seq.max_tokens
            entries.append((seq.request_id, seq.num_output, done))
            if done:
                finished.append(seq)
        for seq in finished:
            self._finish(seq)
            self._by_reason["length"] = self._by_reason.get("length", 0) + 1
        self._generation_tokens += batch * steps
        self._steps += steps
        self._busy += times[-1] - now
        return DecodeBurst(times, entries, now)

    def finish_step(self, step: Step, now: float) -> list[Output]:
        if step.idle:
            return []
        if step is not self._pending:
            raise RuntimeError("finish_step() got a step this engine is not running")
        self._pending = None
        self._steps += 1
        self._busy += step.duration
        kv = self.kv
        bs = self.block_size
        caching = self.spec.enable_prefix_caching
        outputs = []
        for seq, num_new in step.entries:
            if seq.status != RUNNING:
                continue  # aborted while the step ran
            seq.num_computed += num_new
            if caching:
                full = seq.num_computed // bs
                if full > seq.num_registered:
                    hashes = seq.hashes
                    ids = seq.token_ids
                    if full > len(hashes) and ids is not None:
                        # Blocks that hold generated tokens are cached too (vLLM does), so
                        # a follow-up turn that repeats the answer hits them.
                        parent = hashes[-1] if hashes else None
                        for index in range(len(hashes), full):
                            parent = hash_block(parent, ids[index * bs : (index + 1) * bs])
                            hashes.append(parent)
                    end = min(full, len(hashes))
                    if end > seq.num_registered:
                        kv.cache_full_blocks(seq.blocks, hashes, seq.num_registered, end, ids)
                        seq.num_registered = end
            if seq.num_computed < seq.num_prompt + seq.num_output:
                continue  # a prefill chunk that does not finish the prompt
            token = generated_token(seq.seed, seq.num_output)
            if seq.token_ids is not None:
                seq.token_ids.append(token)
            seq.num_output += 1
            self._generation_tokens += 1
            first = seq.num_output == 1
            if first:
                self._prompt_tokens += seq.num_prompt
                self._cached += seq.num_cached_tokens
                self._local_compute += (
                    seq.num_prompt - seq.num_cached_tokens - seq.num_external_tokens
                )
            finished = seq.num_output >= seq.max_tokens
            reason = None
            if finished:
                reason = "length"
                self._finish(seq)
                self._by_reason[reason] = self._by_reason.get(reason, 0) + 1
            outputs.append(
                Output(
                    seq.request_id, [token], first, finished, reason,
                    max(seq.num_cached_tokens, 0), seq.num_prompt,
                    seq.num_external_tokens, seq.num_output, finished and seq.hold,
                    seq.num_preemptions,
                )
            )
        return outputs

    def _finish(self, seq: Sequence) -> None:
        self.scheduler.running.remove(seq)
        self._finished += 1
        if seq.hold:
            seq.status = HELD
            return
        seq.status = FINISHED
        del self._seqs[seq.request_id]
        self.kv.release(seq.blocks)
        seq.blocks = []

    # -- cache, events, stats -----------------------------------------------------------------

    def block_hashes_for(self, token_ids: SequenceABC[int]) -> list[int]:
        return chain_hashes(token_ids, self.block_size)

    def cached_prefix_tokens(self, block_hashes: SequenceABC[int]) -> int:
        """Tokens of a prompt (given its block hashes) this engine's prefix cache holds."""
        if not self.spec.enable_prefix_caching:
            return 0
        return self.kv.count_cached_prefix(block_hashes) * self.block_size

    def drain_kv_events(self) -> list[dict]:
        return self.kv.drain_events()

    def reset_prefix_cache(self) -> bool:
        return self.kv.reset_prefix_cache()

    def pending_prefill_tokens(self) -> int:
        """Prompt tokens queued or mid-prefill (not yet computed), for routers."""
        total = 0
        for seq in self.scheduler.waiting:
            total += seq.num_prompt + seq.num_output - seq.num_computed
        for seq in self.scheduler.running:
            if seq.num_computed < seq.num_prompt:
                total += seq.num_prompt - seq.num_computed
        return total

    def stats(self) -> EngineStats:
        used = self.kv.num_used
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_gpu_blocks=self.num_gpu_blocks,
            num_used_blocks=used,
            kv_usage=used / self.num_gpu_blocks,
            prefix_cache_queries=self._queries,
            prefix_cache_hits=self._hits,
            prompt_tokens=self._prompt_tokens,
            generation_tokens=self._generation_tokens,
            num_preemptions=self._preemptions,
            requests_finished=self._finished,
            busy_seconds=self._busy,
            prompt_tokens_local_compute=self._local_compute,
            prompt_tokens_cached=self._cached,
            prompt_tokens_external=self._external,
            requests_aborted=self._aborted,
            num_held=sum(1 for seq in self._seqs.values() if seq.status == HELD),
            num_steps=self._steps,
            finished_by_reason=dict(self._by_reason),
        )
