"""Issue 19's cheaper hot paths decide exactly as the code they replaced (bit for bit:
floats compared by ``repr``, dict orders included). Each ``old_*`` below is the function as
it was before (router, prefix index and answer lengths at b961afd), kept only as the oracle.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.answer_lengths import BUCKETS, IPW_CAP, MIN_DURATION_S, AnswerLengths, _Histogram

# --- AnswerLengths.observe -----------------------------------------------------------------

class OldAnswerLengths(AnswerLengths):
    def observe(self, model, prompt_tokens, completion_tokens, duration_s=None, now=None):
        if completion_tokens <= 0:
            return
        count = 1.0
        if duration_s is not None and now is not None and duration_s >= 0:
            start = now - duration_s
            if self._start is None:
                self._start = start
            else:
                self._start = min(self._start, start)
                span = now - self._start
                count = min(IPW_CAP, span / (span - duration_s)) if span > duration_s \
                    else IPW_CAP
            if 0.0 < duration_s < MIN_DURATION_S:
                duration_s = MIN_DURATION_S
        else:
            duration_s = None
        b = int(completion_tokens).bit_length() - 1
        if b >= BUCKETS:
            b = BUCKETS - 1
        decay = self.decay
        hists = self._hists
        prompt_class = int(prompt_tokens)
        prompt_class = prompt_class.bit_length() if prompt_class > 0 else 0
        for key in ((model, -1), (model, prompt_class)):
            hist = hists.get(key)
            if hist is None:
                hist = hists[key] = _Histogram()
            scale = hist.scale = hist.scale / decay
            if scale > 1e100:
                for sums in (hist.count, hist.inverse, hist.dur, hist.dur_inverse):
                    sums[:] = [v / scale for v in sums]
                scale = hist.scale = 1.0
            scale *= count
            hist.count[b] += scale
            hist.inverse[b] += scale / completion_tokens
            hist.total += 1
            if duration_s is not None:
                hist.dur[b] += scale * duration_s
                hist.dur_inverse[b] += scale * duration_s / completion_tokens
                hist.timed += 1
        answers = self._answers = self._answers + 1
        if answers >= self._next_epoch:
            self.epoch += 1
            self._next_epoch = self._epoch_after(answers)
            for stream in tuple(self.following):
                stream.rebook()


def _lengths_state(learner: AnswerLengths) -> str:
    return repr(([(k, h.count, h.inverse, h.dur, h.dur_inverse, h.scale, h.total, h.timed)
                  for k, h in learner._hists.items()], learner._start, learner.epoch,
                 learner._answers, learner._next_epoch))


class _Rebook:
    def __init__(self):
        self.calls = 0

    def rebook(self):
        self.calls += 1


answer_st = st.tuples(
    st.sampled_from(["m", "n"]), st.integers(-3, 70_000) | st.sampled_from([0, 1, 2.5]),
    st.integers(-2, 3_000_000) | st.sampled_from([0.5, 3.0]),
    st.none() | st.floats(-1, 50, allow_nan=False) | st.sampled_from([0.0, 1e-9, 5e-324]),
    st.none() | st.floats(0, 1000, allow_nan=False))


@settings(max_examples=300, deadline=None)
@given(answers=st.lists(answer_st, max_size=60), memory=st.sampled_from([2, 3, 500]),
       min_samples=st.sampled_from([1, 5, 20]))
def test_answer_lengths_observe_as_before(answers, memory, min_samples):
    new = AnswerLengths(memory=memory, min_samples=min_samples)
    old = OldAnswerLengths(memory=memory, min_samples=min_samples)
    new_streams, old_streams = _Rebook(), _Rebook()
    new.following.add(new_streams)
    old.following.add(old_streams)
    clock = 0.0
    for model, prompt, completion, duration, step in answers:
        now = None if step is None else clock + step
        clock = clock if now is None else now
        new.observe(model, prompt, completion, duration, now)
        old.observe(model, prompt, completion, duration, now)
        assert _lengths_state(new) == _lengths_state(old)
        for prompt_tokens in (0, 100, 5000):
            for cap in (None, 64, 4096):
                assert repr(new.weight(model, prompt_tokens, cap, 20.0)) == \
                    repr(old.weight(model, prompt_tokens, cap, 20.0))
    assert new_streams.calls == old_streams.calls


def test_answer_lengths_fold_as_before():
    """memory 2 doubles the scale per answer: it folds back every ~330 answers."""
    new, old = AnswerLengths(memory=2, min_samples=1), OldAnswerLengths(memory=2, min_samples=1)
    rng = random.Random(7)
    for i in range(1500):
        args = ("m", rng.randrange(0, 9000), rng.randrange(1, 5000),
                rng.random() * 3 if i % 3 else None, float(i))
        new.observe(*args)
        old.observe(*args)
    assert _lengths_state(new) == _lengths_state(old)
    assert max(h.scale for h in new._hists.values()) < 1e100


