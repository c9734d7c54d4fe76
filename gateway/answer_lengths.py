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
"""

from __future__ import annotations

from .router import stall_weight

BUCKETS = 20  # answers up to 2^20 tokens; longer ones go into the last bucket
DEFAULT_OUTPUT_TOKENS = 128  # what the gateway books for a request without max_tokens


class _Histogram:
    """Decayed counts, stored scaled: a new answer adds ``scale`` (which grows by 1 ÷ decay
    per answer) instead of every bucket shrinking by the decay, so an answer costs O(1) on
    the request path; only ratios of the counts are read, which the scale leaves as
    they are."""

    __slots__ = ("count", "inverse", "scale", "total", "weights")

    def __init__(self) -> None:
        self.count = [0.0] * BUCKETS
        self.inverse = [0.0] * BUCKETS  # sum of 1 / length per bucket
        self.scale = 1.0
        self.total = 0  # answers seen (not decayed)
        # (max_tokens, ratio) -> (total when computed, expected weight): see weight()
        self.weights: dict[tuple[int | None, float], tuple[int, float]] = {}


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

    def observe(self, model: str, prompt_tokens: int, completion_tokens: int) -> None:
        """A finished answer's length (its usage's ``completion_tokens``)."""
        if completion_tokens <= 0:
            return
        for key in ((model, -1), (model, _prompt_class(prompt_tokens))):
            hist = self._hists.get(key)
            if hist is None:
                hist = self._hists[key] = _Histogram()
            self._add(hist, completion_tokens)

    def _add(self, hist: _Histogram, completion_tokens: int) -> None:
        scale = hist.scale = hist.scale / self.decay
        if scale > 1e100:  # fold the scale back in before it overflows
            hist.count = [c / scale for c in hist.count]
            hist.inverse = [v / scale for v in hist.inverse]
            scale = hist.scale = 1.0
        b = min(int(completion_tokens).bit_length() - 1, BUCKETS - 1)
        hist.count[b] += scale
        hist.inverse[b] += scale / completion_tokens
        hist.total += 1

    def weight(self, model: str, prompt_tokens: int, max_tokens: int | None,
               ttft_itl_ratio: float) -> float:
        """The expected :func:`~gateway.router.stall_weight` of a request of ``model`` with
        ``prompt_tokens`` allowed ``max_tokens`` (None: unbounded)."""
        if ttft_itl_ratio <= 0:
            return 1.0
        cap = max_tokens if max_tokens and max_tokens > 0 else None
        hist = self._hists.get((model, _prompt_class(prompt_tokens)))
        if hist is None or hist.total < self.min_samples:
            hist = self._hists.get((model, -1))
        if hist is None or hist.total < self.min_samples:
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

    def _expected(self, hist: _Histogram, cap: int | None, ttft_itl_ratio: float) -> float:
        floor = 1.0 / cap if cap else 0.0  # an answer is cut at max_tokens
        weighted = seen = 0.0
        for count, inverse in zip(hist.count, hist.inverse, strict=True):
            if count <= 0:
                continue
            # Within a bucket, the mean of 1 / length (exact wherever the weight is < 1).
            weighted += count * min(1.0, ttft_itl_ratio * max(inverse / count, floor))
            seen += count
        return weighted / seen if seen > 0 else stall_weight(
            cap or self.default_tokens, ttft_itl_ratio)


def _prompt_class(prompt_tokens: int) -> int:
    return max(int(prompt_tokens), 0).bit_length()
