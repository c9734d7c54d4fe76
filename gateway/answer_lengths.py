"""How much a stall counts for a request whose answer length the gateway does not know.

The router weighs the stall a prefill brings to a request in flight by
:func:`gateway.router.stall_weight` (``min(1, ttft_itl_ratio ÷ output tokens)``). A gateway
does not know a request's output length when it routes it: it sees ``max_tokens`` (an upper
bound, often generous) or nothing. Taking ``max_tokens`` as the length undercounts stalls
(a 2× generous bound halves every weight), and one fixed length for every request
(128 when absent) is right for no trace (issue 18, docs/benchmarks.md).

:class:`AnswerLengths` learns, per model and prompt length (powers of two), the
distribution of answer lengths from finished responses (their ``usage.completion_tokens``)
and gives the **expected** stall weight of a new request,
``E[min(1, ratio ÷ min(L, max_tokens))]`` over the learned lengths *L* (an answer is cut at
``max_tokens``, so the bound still tells something when it is tight).
The expectation of the weight, not the weight of the mean length: the cost adds weights
over the requests in flight, and by Jensen's inequality ``ratio ÷ mean length`` would
undercount short answers, the ones a stall sinks. Per prompt length because the prompt
is the one thing about a request the gateway sees and answers depend on the kind of
request: in the public traces long prompts get short answers (Azure conversation: ~380
tokens after 512–2k-token prompts, ~60 after 2k+; Mooncake: ~150 after 8–32k, ~40 after
32k+); a prompt-length class with fewer than ``min_samples`` answers uses the model's
whole distribution. Lengths go into power-of-two buckets
(count and sum of 1 ÷ length per bucket, decayed so that the mix follows the traffic);
a few floats per class, a few dozen operations per request.

Until it has seen ``min_samples`` answers it returns the weight of ``max_tokens`` (else of
``default_tokens``), the gateway's behaviour before.

**The requests in flight are not the requests dispatched** (issue 18, measured in the
virtual fleet, Azure conversation 2× on 8 engines: booked weights summed over the requests
in flight were 3.8× their true weights). The cost adds the booked weights of the requests
*in flight*, and two biases make a plain mean over finished answers overstate them:

- *Length bias* (the inspection paradox): a request stays in flight for its duration, so
  the ones found in flight are the long-lived ones — long answers, low weights. Each
  request books the weight expected **of a request found in flight**,
  ``E[weight × duration] ÷ E[duration]``, when the answers' durations (dispatch to end,
  which a gateway measures) are given to :meth:`AnswerLengths.observe`. Where durations are
  mostly queueing (overload, short answers) this is near the plain mean; where they are
  mostly decoding, near ``E[min(L, ratio)] ÷ E[L]``.
- *Survivorship at the start*: the first answers to finish are the short ones (the long
  ones dispatched at the same time are still running), so a young learner sees too many
  short answers. With ``now`` given, an answer of duration *D* seen when the learner's
  traffic has run for *T* (since its earliest known dispatch) is counted ``T ÷ (T − D)``
  times — the inverse of the chance that a request of that duration, dispatched at a
  uniform time in the window, has finished (Horvitz–Thompson), capped at ``IPW_CAP`` so
  one answer as old as the learner cannot dominate; in steady state (T ≫ D) every answer
  counts once.
"""

from __future__ import annotations

from .router import stall_weight

BUCKETS = 20  # answers up to 2^20 tokens; longer ones go into the last bucket
DEFAULT_OUTPUT_TOKENS = 128  # what the gateway books for a request without max_tokens
IPW_CAP = 10.0  # the most one answer counts for (survivorship correction, module doc)
# The shortest duration taken as measured: below a microsecond a dispatch-to-end time is
# clock noise, and durations near the float minimum underflow ratio × D / length to 0,
# which booked a weight of 0 (hypothesis found D = 5e-324 s).
MIN_DURATION_S = 1e-6


class _Histogram:
    """Decayed counts, stored scaled: a new answer adds ``scale`` (which grows by 1 ÷ decay
    per answer) instead of every bucket shrinking by the decay, so an answer costs O(1) on
    the request path; only ratios of the counts are read, which the scale leaves as
    they are."""

    __slots__ = ("after", "count", "dur", "dur_inverse", "inverse", "scale", "timed", "total",
                 "weights")

    def __init__(self) -> None:
        self.count = [0.0] * BUCKETS
        self.inverse = [0.0] * BUCKETS  # sum of 1 / length per bucket
        # Answers with a known duration D: sums of D and of D / length per bucket (the
        # weight expected of a request found in flight, module doc).
        self.dur = [0.0] * BUCKETS
        self.dur_inverse = [0.0] * BUCKETS
        self.timed = 0  # answers seen with a duration (not decayed)
        self.scale = 1.0
        self.total = 0  # answers seen (not decayed)
        # (max_tokens, ratio) -> (total when computed, expected weight): see weight()
        self.weights: dict[tuple[int | None, float], tuple[int, float]] = {}
        # (floor, ratio, buckets ruled out) -> (total when computed, weight): weight_after
        self.after: dict[tuple[float, float, int], tuple[int, float]] = {}


class AnswerLengths:
    """Per model: learned answer lengths → the expected stall weight of a new request.

    ``memory``: answers after which an old one counts 1/e as much (the decay, so the mix
    follows a traffic that changes); ``min_samples``: answers seen before the learned
    distribution is used."""

    def __init__(self, *, memory: int = 500, min_samples: int = 20,
                 default_tokens: int = DEFAULT_OUTPUT_TOKENS) -> None:
        self.memory = max(memory, 1)
        self.decay = 1.0 - 1.0 / self.memory
        self.min_samples = min_samples
        self.default_tokens = default_tokens
        # (model, prompt class) -> lengths; class -1: every prompt of the model.
        self._hists: dict[tuple[str, int], _Histogram] = {}
        # (model, prompt class) -> (its model's histogram, its own): observe's lookup.
        self._pairs: dict[tuple[str, int], tuple[_Histogram, _Histogram]] = {}
        self._start: float | None = None  # earliest dispatch of an answer seen (``now``'s clock)
        self.epoch = 0  # grows every ~1/64 of the memory's answers (see observe)
        self._answers = 0
        self._next_epoch = 1  # the answer count at which the epoch moves next
        # Streams in flight whose weights were booked from weight_after (objects with a
        # ``rebook()``: gateway.request_driver.StreamWeight): re-booked as the epoch moves.
        self.following: set = set()

    def observe(self, model: str, prompt_tokens: int, completion_tokens: int,
                duration_s: float | None = None, now: float | None = None) -> None:
        """A finished answer's length (its usage's ``completion_tokens``); ``duration_s``:
        dispatch to end; ``now``: the clock the durations are on (with both, the two
        corrections of the module doc apply)."""
        if completion_tokens <= 0:
            return
        count = 1.0
        if duration_s is not None and now is not None and duration_s >= 0:
            start = now - duration_s
            first = self._start
            if first is None:  # the first answer: no span to judge it by yet
                self._start = start
            else:
                if start < first:  # min(first, start), without the call
                    first = self._start = start
                span = now - first
                if span > duration_s:
                    count = span / (span - duration_s)
                    if not count < IPW_CAP:  # min(IPW_CAP, count)
                        count = IPW_CAP
                else:
                    count = IPW_CAP
            if 0.0 < duration_s < MIN_DURATION_S:
                duration_s = MIN_DURATION_S
        else:
            duration_s = None
        # Both histograms (the model's, the prompt class's) in one loop, the bucket once:
        # this runs per finished answer (the arithmetic is what a separate _add did). The
        # pair is looked up once per (model, prompt class) key (issue 19: no key tuples
        # per histogram).
        b = int(completion_tokens).bit_length() - 1
        if b >= BUCKETS:
            b = BUCKETS - 1
        decay = self.decay
        prompt_class = int(prompt_tokens)
        prompt_class = prompt_class.bit_length() if prompt_class > 0 else 0  # _prompt_class
        pair = self._pairs.get((model, prompt_class))
        if pair is None:
            pair = self._pair(model, prompt_class)
        for hist in pair:
            scale = hist.scale = hist.scale / decay
            if scale > 1e100:  # fold the scale back in before it overflows
                scale = _fold(hist, scale)
            scale *= count
            hist.count[b] += scale
            hist.inverse[b] += scale / completion_tokens
            hist.total += 1
            if duration_s is not None:
                hist.dur[b] += scale * duration_s
                hist.dur_inverse[b] += scale * duration_s / completion_tokens
                hist.timed += 1
        # Every ~1/64 of the memory's answers (each while few are seen): weights booked
        # from the learned lengths are worth re-booking (weight_after's callers).
        answers = self._answers = self._answers + 1
        if answers >= self._next_epoch:
            self.epoch += 1
            self._next_epoch = self._epoch_after(answers)
            for stream in tuple(self.following):
                stream.rebook()

    def _pair(self, model: str, prompt_class: int) -> tuple[_Histogram, _Histogram]:
        """The model's histogram and the prompt class's, made (in that order) if new."""
        hists = self._hists
        pair = []
        for key in ((model, -1), (model, prompt_class)):
            hist = hists.get(key)
            if hist is None:
                hist = hists[key] = _Histogram()
            pair.append(hist)
        found = self._pairs[(model, prompt_class)] = (pair[0], pair[1])
        return found

    def _epoch_after(self, answers: int) -> int:
        """The first count of answers ``a`` > ``answers`` with ``(a - answers) × 64 ≥
        min(a, memory)`` (the left side grows faster than the right, so it is the only
        edge), worked out when an epoch starts instead of tested per answer: up to the
        memory, ``63 a ≥ 64 answers``; past it, ``a ≥ answers + memory / 64``."""
        memory = self.memory
        a = max(answers + 1, -(-64 * answers // 63))
        if a <= memory:
            return a
        return max(memory + 1, answers - (-memory // 64))

    def _learned(self, model: str, prompt_tokens: int) -> _Histogram | None:
        """The prompt class's lengths once it has ``min_samples`` answers, else the model's,
        else None (not enough learned yet)."""
        for key in ((model, _prompt_class(prompt_tokens)), (model, -1)):
            hist = self._hists.get(key)
            if hist is not None and hist.total >= self.min_samples:
                return hist
        return None

    def weight(self, model: str, prompt_tokens: int, max_tokens: int | None,
               ttft_itl_ratio: float) -> float:
        """The expected :func:`~gateway.router.stall_weight` of a request of ``model`` with
        ``prompt_tokens`` allowed ``max_tokens`` (None: unbounded)."""
        if ttft_itl_ratio <= 0:
            return 1.0
        cap = max_tokens if max_tokens and max_tokens > 0 else None
        hist = self._learned(model, prompt_tokens)
        if hist is None:
            return stall_weight(cap or self.default_tokens, ttft_itl_ratio)
        # The expectation moves by about 1 / min(answers, memory) per answer: recomputed
        # once that adds up to ~1/64 (every answer while few are seen), not per request.
        key = (cap, ttft_itl_ratio)
        cached = hist.weights.get(key)
        if cached is not None and (hist.total - cached[0]) * 64 < min(hist.total, self.memory):
            return cached[1]
        if len(hist.weights) > 64:  # many distinct max_tokens: keep the cache small
            hist.weights.clear()
        value = self._expected(hist, cap, ttft_itl_ratio)
        hist.weights[key] = (hist.total, value)
        return value

    def dispatch_weight(self, model: str, prompt_tokens: int, max_tokens: int | None,
                        ttft_itl_ratio: float, stream: bool) -> float:
        """The weight to book when a request is sent: a stream books its own expected weight
        (:meth:`weight_after` at 0 tokens; the relay re-books it as it streams, which is the
        in-flight correction), anything else — or a stream before enough answers are
        learned — the weight of a request found in flight (:meth:`weight`). The gateway's
        relay and the simulator's GatewayRouter both book through this."""
        if stream:
            weight = self.weight_after(model, prompt_tokens, max_tokens, ttft_itl_ratio, 0)
            if weight is not None:
                return weight
        return self.weight(model, prompt_tokens, max_tokens, ttft_itl_ratio)

    def weight_after(self, model: str, prompt_tokens: int, max_tokens: int | None,
                     ttft_itl_ratio: float, produced: int) -> float | None:
        """The expected stall weight of a request in flight that has already produced
        ``produced`` tokens (a stream's progress), ``E[weight | length > produced]`` over
        the learned lengths (per request, so no in-flight correction: conditioning is it).
        None before ``min_samples`` answers (keep the weight booked). Power-of-two buckets:
        it changes only when ``produced`` crosses one, so a relay calls it ~log2(length)
        times per answer."""
        if ttft_itl_ratio <= 0:
            return 1.0
        hist = self._learned(model, prompt_tokens)
        if hist is None:
            return None
        floor = 1.0 / max_tokens if max_tokens and max_tokens > 0 else 0.0
        # Buckets [2^b, 2^(b+1)) with room above ``produced`` (the answer goes on) are those
        # with b >= (produced + 1).bit_length() - 1: the result depends on ``produced`` only
        # through that, so it is cached by it until the next answer is learned (a stream
        # asks ~log2(length) times, every stream of a class the same questions). Exact, not
        # weight()'s 1/64 staleness: with that, the router_quality stream variant moved in
        # 9 of 18 cells (up to -16 %, Mooncake 8 engines 4x) from what was measured.
        first = (produced + 1).bit_length() - 1
        key = (floor, ttft_itl_ratio, first)
        cached = hist.after.get(key)
        if cached is not None and cached[0] == hist.total:
            return cached[1]
        weighted = seen = 0.0
        for count, inverse in zip(hist.count[first:], hist.inverse[first:], strict=True):
            if count > 0:
                weighted += count * min(1.0, ttft_itl_ratio * max(inverse / count, floor))
                seen += count
        if seen > 0:
            if len(hist.after) > 256:  # many distinct max_tokens: keep the cache small
                hist.after.clear()
            value = hist.after[key] = (hist.total, weighted / seen)
            return value[1]
        # Longer than every answer seen: at most the weight of what it has produced.
        return min(1.0, ttft_itl_ratio * max(1.0 / max(produced, 1), floor))

    def _expected(self, hist: _Histogram, cap: int | None, ttft_itl_ratio: float) -> float:
        floor = 1.0 / cap if cap else 0.0  # an answer is cut at max_tokens
        weighted = seen = 0.0
        if hist.timed >= self.min_samples:
            # Of a request found in flight: E[weight × D] / E[D]. Per bucket, min(Σ D,
            # ratio × Σ D / length): exact wherever the weight is < 1 (or 1) bucket-wide.
            for dur, dur_inverse in zip(hist.dur, hist.dur_inverse, strict=True):
                if dur > 0:
                    weighted += min(dur, ttft_itl_ratio * max(dur_inverse, dur * floor))
                    seen += dur
            if seen > 0:
                return weighted / seen
        for count, inverse in zip(hist.count, hist.inverse, strict=True):
            if count <= 0:
                continue
            # Within a bucket, the mean of 1 / length (exact wherever the weight is < 1).
            weighted += count * min(1.0, ttft_itl_ratio * max(inverse / count, floor))
            seen += count
        return weighted / seen if seen > 0 else stall_weight(
            cap or self.default_tokens, ttft_itl_ratio)


def _fold(hist: _Histogram, scale: float) -> float:
    """Folds the scale back into the sums before it overflows; the new scale (1.0)."""
    for sums in (hist.count, hist.inverse, hist.dur, hist.dur_inverse):
        sums[:] = [v / scale for v in sums]
    hist.scale = 1.0
    return 1.0


def _prompt_class(prompt_tokens: int) -> int:
    return max(int(prompt_tokens), 0).bit_length()
