"""Issue 19's cheaper hot paths decide exactly as the code they replaced (bit for bit:
floats compared by ``repr``, dict orders included). Each ``old_*`` below is the function as
it was before (router, prefix index and answer lengths at b961afd), kept only as the oracle.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.prefix_index import ROOT, ApproxPrefixIndex, text_chunk_hashes

_FOREVER = float("inf")


# --- text_chunk_hashes ---------------------------------------------------------------------

def old_h(parent: bytes, chunk: bytes) -> bytes:
    return hashlib.blake2b(parent + chunk, digest_size=8).digest()


def old_text_chunk_hashes(text: str, chunk_chars: int, limit: int = 4096) -> list[bytes]:
    data = text.encode("utf-8", "surrogatepass")
    out, parent = [], ROOT
    step = max(int(chunk_chars), 1)
    for start in range(0, len(data) - step + 1, step):
        parent = old_h(parent, data[start : start + step])
        out.append(parent)
        if len(out) >= limit:
            break
    return out


@settings(max_examples=400, deadline=None)
@given(text=st.text(max_size=400) | st.text(alphabet="ab", max_size=400),
       chunk_chars=st.integers(-2, 70) | st.sampled_from([64.0, 63.9, 0.5]),
       limit=st.none() | st.integers(-2, 12))
def test_text_chunk_hashes_as_before(text, chunk_chars, limit):
    if limit is None:
        assert text_chunk_hashes(text, chunk_chars) == old_text_chunk_hashes(text, chunk_chars)
    else:
        assert text_chunk_hashes(text, chunk_chars, limit) == \
            old_text_chunk_hashes(text, chunk_chars, limit)


def test_text_chunk_hashes_long_prompt_hits_the_limit():
    text = "x" * (64 * 5000 + 17)
    assert text_chunk_hashes(text, 64) == old_text_chunk_hashes(text, 64)
    assert len(text_chunk_hashes(text, 64)) == 4096


# --- ApproxPrefixIndex.match / record ------------------------------------------------------

class OldIndex(ApproxPrefixIndex):
    def match(self, model: str, hashes: Sequence[bytes], now: float) -> dict[str, int]:
        entries = self._entries
        matched: dict[str, int] = {}
        alive: set[str] | None = None
        for n, h in enumerate(hashes, 1):
            holders = entries.get((model, h))
            if not holders:
                break
            if alive is None:
                alive = set()
                for w, expiry in holders.items():
                    if expiry > now:
                        alive.add(w)
            else:
                gone = None
                for w in alive:
                    expiry = holders.get(w)
                    if expiry is None or not expiry > now:
                        if gone is None:
                            gone = []
                        gone.append(w)
                if gone is not None:
                    alive = alive.difference(gone)
            if not alive:
                break
            for w in alive:
                matched[w] = n
        return matched

    def record(self, model: str, hashes: Iterable[bytes], worker_id: str, now: float) -> None:
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
                lru[key] = None
                new += 1
            holders = entries.get(key)
            if holders is None:
                entries[key] = {worker_id: expiry}
            else:
                entries.move_to_end(key)
                holders[worker_id] = expiry
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


def _state(index: ApproxPrefixIndex) -> str:
    return repr((list(index._entries.items()), {w: list(lru) for w, lru in index._lru.items()},
                 index._inflow, index._capacity))


HASHES = [bytes([i]) * 8 for i in range(6)]
op_st = st.one_of(
    st.tuples(st.just("record"), st.sampled_from(["m", "n"]),
              st.lists(st.sampled_from(HASHES), max_size=6), st.sampled_from("abcd"),
              st.integers(0, 400).map(float)),
    st.tuples(st.just("match"), st.sampled_from(["m", "n"]),
              st.lists(st.sampled_from(HASHES), max_size=6), st.just(""),
              st.integers(0, 400).map(float)),
    st.tuples(st.just("capacity"), st.just(""), st.just([]), st.sampled_from("abcd"),
              st.sampled_from([0.0, 1.0, 3.0, 8.0])),
    st.tuples(st.just("forget"), st.just(""), st.just([]), st.sampled_from("abcd"),
              st.just(0.0)),
)


@settings(max_examples=400, deadline=None)
@given(ops=st.lists(op_st, max_size=40), ttl=st.sampled_from([50.0, 120.0]),
       max_entries=st.sampled_from([3, 500_000]))
def test_prefix_index_matches_and_records_as_before(ops, ttl, max_entries):
    new, old = ApproxPrefixIndex(ttl, max_entries), OldIndex(ttl, max_entries)
    for kind, model, hashes, worker, x in ops:
        if kind == "record":
            new.record(model, hashes, worker, x)
            old.record(model, hashes, worker, x)
        elif kind == "match":
            got, want = new.match(model, hashes, x), old.match(model, hashes, x)
            assert list(got.items()) == list(want.items())
        elif kind == "capacity":
            new.set_capacity(worker, int(x))
            old.set_capacity(worker, int(x))
        else:
            new.forget_worker(worker)
            old.forget_worker(worker)
        assert _state(new) == _state(old)


