"""What the gateway keeps in flight per worker, and the load one routed request books. Pure.

:class:`WorkerLoad` is a worker's booked load (queued prefill, KV, requests in flight, the
stall weights of this process's requests); :class:`LoadReservation` books one request's
share and releases it once; :func:`stall_weight` is how much a stall to a request in flight
counts (gateway/router.py's module doc has the cost they feed).

**Queued prefill drains as the engine computes it** (issue 18, docs/benchmarks.md,
router_quality sixth pass). A request's prefill is booked as queued until its first token,
so a worker part-way through a long prompt looks as busy as when it started: in the virtual
fleet the affinity bound refused prefix holders booked 979 and 2,925 blocks that had 82 and
237 left to compute. Each worker therefore also keeps when its current prefill work started
(``prefill_since``: the queue became non-empty, or a prefill finished there) and the rate at
which it computes prefill (``prefill_rate``, blocks/s, learned from this process's own
requests: at the first token, the request's uncached blocks ÷ the time since its prefill
could start, the later of its dispatch and ``prefill_since`` — a worker computes its queue in
order; a decayed mean over ``RATE_MEMORY`` requests). :meth:`WorkerLoad.queued_at` is the
booked queue less what that rate has computed since: never below 0, never above what is
booked, and the booked queue itself until a rate is learned. Sibling gateway processes
share the booked queue (gateway/peers.py), and their bookings and finished prefills move
``prefill_since`` as this process's do. Only the affinity bound reads the estimate (the
cost keeps the booked queue: with the engines' true queues in the cost too, the Azure
cells of bench/router_quality.py moved both ways; with this estimate in the cost, Azure
code gained and Azure conversation lost 38 of 5,600 requests over 14 slices: seventh
pass, docs/benchmarks.md). Times are the caller's clock (the gateway's
``time.monotonic()``, the simulator's virtual time); without one (``now`` None) nothing
drains.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

RATE_MEMORY = 5  # requests after which an old prefill-rate sample counts 1/e as much


@dataclass
class WorkerLoad:
    """What the gateway has in flight on a worker, in KV blocks of the model's routing size."""

    prefill_blocks: float = 0.0
    decode_blocks: float = 0.0
    in_flight: int = 0
    # This process's own requests here and the sum of their stall weights (see
    # :func:`stall_weight`). Kept per process (sibling gateways share only the three above):
    # the cost uses their mean, times ``in_flight``.
    own_requests: int = 0
    stall_weight_sum: float = 0.0
    # When the worker's current prefill work started, and the rate it computes prefill at
    # (blocks/s; 0: not learned yet): the module doc.
    prefill_since: float = 0.0
    prefill_rate: float = 0.0

    def mean_stall_weight(self, default: float = 1.0) -> float:
        return self.stall_weight_sum / self.own_requests if self.own_requests > 0 else default

    def queued_at(self, now: float | None) -> float:
        """The booked queued prefill less what ``prefill_rate`` has computed since
        ``prefill_since`` (module doc): in [0, ``prefill_blocks``]."""
        booked = self.prefill_blocks
        if now is None or self.prefill_rate <= 0.0 or booked <= 0.0:
            return booked if booked > 0.0 else 0.0
        left = booked - self.prefill_rate * (now - self.prefill_since)
        return booked if left > booked else (left if left > 0.0 else 0.0)


def stall_weight(output_tokens: int, ttft_itl_ratio: float) -> float:
    """How much a stall of one unit of time to a request in flight counts against the same
    time added to a new request's own wait: ``min(1, ttft_itl_ratio / output_tokens)``.

    SLOs judge the first token against a TTFT target and the decode by its mean ITL against
    an ITL target. A stall of *s* raises a request's mean ITL by *s* / its output tokens;
    measured against the targets that is (s / output) / ITL target, against s / TTFT target
    for a wait — a ratio of ``ttft_itl_ratio / output`` (TTFT target ÷ ITL target). A long
    answer absorbs a stall that would sink a short one. Never more than 1: a stall also
    delays that request's end by *s*, no more than the same wait delays the new one's start
    (and 1 is the form measured before, issue 18). ``ttft_itl_ratio`` 0 (absent from the
    table): 1, every stall in full."""
    if ttft_itl_ratio <= 0:
        return 1.0
    return min(1.0, ttft_itl_ratio / max(output_tokens, 1))


class LoadReservation:
    """The load one routed request puts on workers, as the gateway keeps it, released once.

    At dispatch the prefill worker (the decode worker when it prefills locally) gets the
    prompt's uncached blocks as queued prefill, and the decode worker the KV the request
    adds there: its uncached prompt blocks (cached ones are shared by prefix caching; with
    remote prefill all arrive by transfer) plus its output. :meth:`prefill_done` when the
    prompt is computed (remote prefill answered, or the first token), :meth:`release` when
    the request ends in any way. The decode worker also counts the request among its own
    with its :func:`stall_weight` (from its output tokens and the plan's
    ``ttft_itl_ratio``), or ``weight`` when given (an expected weight for an answer of
    unknown length: :class:`gateway.answer_lengths.AnswerLengths`). ``now`` (the caller's
    clock, at dispatch and at :meth:`prefill_done`) lets the prefill worker's queue drain
    as it computes (module doc); without it nothing is timed."""

    __slots__ = ("decode", "loads", "prefill", "sent", "weight")

    def __init__(self, loads: defaultdict[str, WorkerLoad], plan, prompt_tokens: int,
                 output_tokens: int, block_size: int, weight: float | None = None,
                 now: float | None = None) -> None:
        # blocks_for inlined (no calls on the hot path): for non-negative ints -(-t // bs)
        # is ceil(t / bs); a count <= 0 is 0 blocks. Likewise max(x, 0) below.
        self.loads = loads
        bs = block_size if block_size > 1 else 1
        cached, decode = plan.cached_tokens, plan.decode
        prefill = plan.prefill or decode
        uncached = -((cached - prompt_tokens) // bs) if prompt_tokens > cached else 0
        added = (-(-prompt_tokens // bs) if prompt_tokens > 0 else 0) - (
            0 if plan.prefill or cached <= 0 else -(-cached // bs))
        added = (added if added > 0 else 0) + (
            -(-output_tokens // bs) if output_tokens > 0 else 0)
        self.prefill: tuple[str, float] | None = (prefill, uncached)
        self.decode: tuple[str, float] | None = (decode, added)
        self.sent = now
        held = loads[prefill]
        if now is not None and held.prefill_blocks <= 0.0:
            held.prefill_since = now  # its queue starts now
        held.prefill_blocks += uncached
        load = loads[decode]
        load.decode_blocks += added
        load.in_flight += 1
        if weight is None:
            weight = stall_weight(output_tokens, plan.ttft_itl_ratio)
        self.weight = weight
        load.own_requests += 1
        load.stall_weight_sum += weight

    def reweight(self, weight: float) -> None:
        """A better estimate of the request's stall weight while it is in flight (e.g. from
        a stream's progress: :meth:`gateway.answer_lengths.AnswerLengths.weight_after`)."""
        if self.decode is not None:
            load = self.loads[self.decode[0]]
            total = load.stall_weight_sum + weight - self.weight
            load.stall_weight_sum = total if total > 0.0 else 0.0
        self.weight = weight

    def prefill_done(self, now: float | None = None) -> None:
        held = self.prefill
        if held is not None:
            load = self.loads[held[0]]
            blocks = load.prefill_blocks - held[1]
            load.prefill_blocks = 0.0 if blocks < 0.0 else blocks
            self.prefill = None
            if now is not None:
                # Its prefill could start at the later of its dispatch and the worker's
                # queue start; the worker's next prefill starts now (module doc).
                sent = self.sent
                start = load.prefill_since if sent is None or sent < load.prefill_since \
                    else sent
                if held[1] > 0 and now > start:
                    sample = held[1] / (now - start)
                    rate = load.prefill_rate
                    load.prefill_rate = sample if rate <= 0.0 else \
                        rate + (sample - rate) / RATE_MEMORY
                load.prefill_since = now

    def release(self) -> None:
        if self.prefill is not None:
            self.prefill_done()
        held = self.decode
        if held is not None:
            load = self.loads[held[0]]
            blocks, n = load.decode_blocks - held[1], load.in_flight - 1
            load.decode_blocks = 0.0 if blocks < 0.0 else blocks
            load.in_flight = 0 if n < 0 else n
            own, weights = load.own_requests - 1, load.stall_weight_sum - self.weight
            load.own_requests = own if own > 0 else 0
            load.stall_weight_sum = (0.0 if weights < 0.0 else weights) if own > 0 else 0.0
            self.decode = None
