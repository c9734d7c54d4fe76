"""Prefix indexes and the KV-event wire formats."""

import msgpack
import pytest

from gateway.prefix_index import (
    AllBlocksCleared,
    ApproxPrefixIndex,
    BlockRemoved,
    BlockStored,
    KvEventDecodeError,
    PreciseIndex,
    TokenEstimator,
    decode_event_batch,
    request_text,
    request_token_ids,
    text_chunk_hashes,
    token_block_hashes,
)


def test_text_chunks_are_chained_and_full_only():
    a = text_chunk_hashes("x" * 100, 32)
    b = text_chunk_hashes("x" * 64 + "y" * 36, 32)
    assert len(a) == 3 and a[:2] == b[:2] and a[2] != b[2]
    # Same chunk content at a different position hashes differently (chained).
    assert len(set(text_chunk_hashes("x" * 96, 32))) == 3


def test_approx_index_matches_leading_chunks_and_expires():
    index = ApproxPrefixIndex(ttl_s=10)
    shared = text_chunk_hashes("s" * 64 + "a" * 64, 32)
    other = text_chunk_hashes("s" * 64 + "b" * 64, 32)
    index.record("m", shared, "w1", now=0)
    index.record("m", other, "w2", now=5)
    assert index.match("m", shared, now=1) == {"w1": 4, "w2": 2}
    assert index.match("m", other, now=6) == {"w1": 2, "w2": 4}
    assert index.match("other-model", shared, now=1) == {}
    assert index.match("m", other, now=12) == {"w2": 4}  # w1's entries expired at 10
    index.expire(now=100)
    assert len(index) == 0


def test_approx_index_is_bounded_and_forgets_workers():
    index = ApproxPrefixIndex(ttl_s=100, max_entries=5)
    index.record("m", text_chunk_hashes("z" * 320, 32), "w1", now=0)
    assert len(index) == 5
    hashes = text_chunk_hashes("q" * 64, 32)
    index.record("m", hashes, "w2", now=0)
    index.forget_worker("w2")
    assert index.match("m", hashes, now=1) == {}


def test_request_text_and_tokens():
    assert request_text({"prompt": "hi"}) == "hi"
    assert request_text({"prompt": ["a", "b"]}) == "a\nb"
    parts = [{"type": "text", "text": "U"}]
    chat = request_text({"messages": [{"role": "system", "content": "S"},
                                      {"role": "user", "content": parts}]})
    assert chat == "<system>S\n<user>U"
    assert request_token_ids({"prompt": [1, 2, 3]}) == [1, 2, 3]
    assert request_token_ids({"prompt": [[4, 5]]}) == [4, 5]
    assert request_token_ids({"prompt": "text"}) is None
    assert request_text({"prompt": [1, 2]}) == ""


def test_token_estimator_learns_ratio():
    est = TokenEstimator(initial=4.0, alpha=0.5)
    assert est.estimate(400) == 100
    for _ in range(20):
        est.observe(700, 100)
    assert est.chars_per_token == pytest.approx(7.0, rel=0.01)
    est.observe(0, 10)  # ignored
    assert est.estimate(0) == 0


# --- wire formats -----------------------------------------------------------------------

STORED_032 = {"type": "BlockStored", "block_hashes": [11, 12], "parent_block_hash": None,
              "token_ids": list(range(32)), "block_size": 16, "lora_id": None, "medium": "GPU",
              "lora_name": None, "extra_keys": None, "group_idx": 0, "future_field": 1}


def test_decode_vllm_032_batch():
    payload = msgpack.packb([1.5, [STORED_032, {"type": "BlockRemoved", "block_hashes": [12],
                                                "medium": "GPU"},
                                   {"type": "AllBlocksCleared"}], 0])
    ts, events = decode_event_batch(payload)
    assert ts == 1.5
    assert events == [BlockStored((11, 12), None, tuple(range(32)), 16), BlockRemoved((12,)),
                      AllBlocksCleared()]


def test_decode_older_array_events_and_map_batches():
    old = msgpack.packb([2.0, [["BlockStored", [1], None, list(range(16)), 16, None, "GPU"],
                               ["BlockRemoved", [1], "GPU"], ["AllBlocksCleared"]]])
    _, events = decode_event_batch(old)
    assert [type(e).__name__ for e in events] == ["BlockStored", "BlockRemoved",
                                                  "AllBlocksCleared"]
    as_map = msgpack.packb({"ts": 3.0, "events": [STORED_032], "data_parallel_rank": 0})
    ts, events = decode_event_batch(as_map)
    assert ts == 3.0 and len(events) == 1


def test_unknown_and_malformed_events_are_skipped_not_fatal():
    payload = msgpack.packb([1.0, [{"type": "Mystery"}, ["Nope"], 42,
                                   {"type": "BlockStored", "block_hashes": "bad",
                                    "token_ids": ["x"]}, STORED_032], 0])
    _, events = decode_event_batch(payload)
    assert len(events) == 1
    with pytest.raises(KvEventDecodeError):
        decode_event_batch(b"\xc1garbage")
    with pytest.raises(KvEventDecodeError):
        decode_event_batch(msgpack.packb("just a string"))


def test_bytes_hashes_are_supported():
    ev = dict(STORED_032, block_hashes=[b"\x01" * 32, b"\x02" * 32])
    _, events = decode_event_batch(msgpack.packb([0, [ev], 0], use_bin_type=True))
    assert events[0].block_hashes == (b"\x01" * 32, b"\x02" * 32)


# --- precise index --------------------------------------------------------------------


def stored(hashes, parent, tokens, bs=16):
    return BlockStored(tuple(hashes), parent, tuple(tokens), bs)


def test_precise_index_follows_store_remove_clear():
    index = PreciseIndex()
    tokens = list(range(48))
    index.apply("w1", [stored([101, 102], None, tokens[:32])])
    index.apply("w1", [stored([103], 102, tokens[32:48])])
    index.apply("w2", [stored([201], None, tokens[:16])])
    assert index.match(tokens) == {"w1": 48, "w2": 16}
    assert index.match(tokens[:20]) == {"w1": 16, "w2": 16}
    index.apply("w1", [BlockRemoved((102,))])
    # Block 2 gone: w1 now matches only the first block (a prefix must be contiguous).
    assert index.match(tokens) == {"w1": 16, "w2": 16}
    index.apply("w2", [AllBlocksCleared()])
    assert index.match(tokens) == {"w1": 16}


def test_precise_index_skips_blocks_with_unknown_parent():
    index = PreciseIndex()
    index.apply("w1", [stored([5], 999, list(range(16)))])
    assert index.match(list(range(16))) == {}
    assert index.unknown_parents == 1


def test_precise_hash_is_independent_of_engine_hashes():
    a, b = PreciseIndex(), PreciseIndex()
    tokens = list(range(32))
    a.apply("w", [stored([1, 2], None, tokens)])
    b.apply("w", [stored([77, 88], None, tokens)])
    assert a.match(tokens) == b.match(tokens) == {"w": 32}
    assert token_block_hashes(tokens, 16) == token_block_hashes([*tokens, 1, 2], 16)


def test_approx_index_forgets_least_recently_used_beyond_worker_capacity():
    index = ApproxPrefixIndex(ttl_s=100)
    index.set_capacity("w1", 4)
    old = text_chunk_hashes("o" * 96, 32)  # 3 chunks
    new = text_chunk_hashes("n" * 96, 32)
    index.record("m", old, "w1", now=0)
    index.record("m", new, "w1", now=1)  # 6 > 4: the two oldest chunks are forgotten
    assert index.match("m", new, now=2) == {"w1": 3}
    assert index.match("m", old, now=2) == {}  # its first chunk is gone: no prefix left
    index.record("m", old, "w2", now=2)  # other workers are unaffected
    assert index.match("m", old, now=3) == {"w2": 3}
    index.set_capacity("w1", None)
    index.record("m", old, "w1", now=3)
    assert index.match("m", old, now=4) == {"w1": 3, "w2": 3}


def test_inflow_counts_new_chunks_per_worker_and_decays():
    index = ApproxPrefixIndex(ttl_s=10)
    first = text_chunk_hashes("a" * 128, 32)
    index.record("m", first, "w1", now=0)
    assert index.inflow("w1", now=0) == 4 and index.inflow("w2", now=0) == 0
    # Chunks the worker already holds are not new KV; the fifth one is.
    index.record("m", text_chunk_hashes("a" * 160, 32), "w1", now=0)
    assert index.inflow("w1", now=0) == 5
    assert index.inflow("w1", now=10) == pytest.approx(2.5)  # one half-life (ttl_s) later
    index.forget_worker("w1")  # e.g. the engine cleared its cache
    assert index.inflow("w1", now=10) == 0


def test_precise_index_by_engine_hashes_follows_stores_and_removals():
    from gateway.prefix_index import PreciseIndex

    index = PreciseIndex()
    stored = {"type": "BlockStored", "block_hashes": [11, 12, 13], "parent_block_hash": None,
              "token_ids": [], "block_size": 16}
    index.apply_hashed("a", [stored])
    index.apply_hashed("b", [dict(stored, block_hashes=[11, 12])])
    assert index.match_hashes([11, 12, 13, 14]) == {"a": 48, "b": 32}
    index.apply_hashed("a", [{"type": "BlockRemoved", "block_hashes": [12]}])
    assert index.match_hashes([11, 12, 13]) == {"a": 16, "b": 32}
    index.apply_hashed("b", [{"type": "AllBlocksCleared"}])
    assert index.match_hashes([11, 12]) == {"a": 16}
