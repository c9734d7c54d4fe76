"""What the gateway believes about prompts and prefixes: how many tokens a prompt is, which
workers hold how much of it (the approximate index of routed prefixes, and the precise one
fed by the engines' KV events), and what it learns back from the answers (the model's
characters per token, which sizes the approximate index, and the answers' lengths, which
weigh the load a request books: :class:`gateway.answer_lengths.AnswerLengths`).

A mixin of :class:`gateway.app.Gateway`.
"""

from __future__ import annotations

import re
import time
from typing import Any

import aiohttp
import orjson

from .prefix_index import (
    CHARS_PER_TOKEN,
    AllBlocksCleared,
    PreciseIndex,
    TokenEstimator,
    request_text,
    request_token_ids,
    text_chunk_hashes,
    token_block_hashes,
)
from .table import ModelRoute

_PROMPT_TOKENS_KEY = b'"prompt_tokens"'
_COMPLETION_TOKENS_KEY = b'"completion_tokens"'
# At most 12 digits: a longer run is no count (the lookahead refuses it in the scan).
_USAGE_VALUE = re.compile(rb"[ \t\r\n]*:[ \t\r\n]*([0-9]{1,12})(?![0-9])")


def _usage_count(payload: bytes, key: bytes = _PROMPT_TOKENS_KEY) -> int | None:
    """A count of an answer's ``usage`` (``usage.prompt_tokens`` by default) without
    decoding all of it (an answer can be long; only this one number is wanted): the last
    ``"<key>": <int>`` in it (at most 12 digits, within 32 bytes of the key). The key cannot
    occur unescaped inside generated text (its quotes would be escaped)."""
    at = payload.rfind(key)
    if at < 0:
        return None
    at += len(key)
    found = _USAGE_VALUE.match(payload, at, at + 32)
    return None if found is None else int(found[1])


class PrefixKnowledge:
    """Needs: config, metrics, session, approx, precise, estimators, _sized_at,
    answer_lengths, subscriber, peers (set by Gateway)."""

    def _size_prefix_index(self, model: ModelRoute) -> None:
        """Bound each worker's approximate entries by its KV capacity, in chunks.

        Twice the nominal capacity: an engine's freed prefix blocks stay reusable until they
        are overwritten, and the chunk ↔ token conversion is an estimate; on the Mooncake
        benchmark a bound of 1× forgot prefixes the engines still held."""
        estimator = self.estimators.setdefault(model.name, TokenEstimator())
        chunk_chars = model.block_size * CHARS_PER_TOKEN
        for worker in model.workers:
            chunks = int(2 * worker.kv_tokens * estimator.chars_per_token / chunk_chars)
            self.approx.set_capacity(worker.id, chunks)
        self._sized_at[model.name] = estimator.chars_per_token

    def _on_kv_events(self, model: str, worker_id: str, events) -> None:
        index = self.precise.setdefault(model, PreciseIndex())
        index.apply(worker_id, events)
        if any(isinstance(e, AllBlocksCleared) for e in events):
            self.approx.forget_worker(worker_id)

    def _on_kv_reset(self, model: str, worker_id: str) -> None:
        """The worker's engine restarted (its stream started over): its cache is empty, so
        forget what both indexes believed it held; the new stream refills them."""
        index = self.precise.get(model)
        if index is not None:
            index.forget_worker(worker_id)
        self.approx.forget_worker(worker_id)

    async def _prompt_view(self, model: ModelRoute, body: dict, chat: bool) -> dict[str, Any]:
        """Prompt length and who is believed to hold its prefix (tokenised by a worker
        first with ``tokenize_via_engine``)."""
        token_ids = request_token_ids(body)
        if token_ids is None and self.config.tokenize_via_engine and model.name in self.precise:
            token_ids = await self._tokenize(model, body, chat)
        return self._prompt_of(model, body, token_ids, time.monotonic())

    def _prompt_of(self, model: ModelRoute, body: dict, token_ids: list[int] | None,
                   now: float) -> dict[str, Any]:
        """:meth:`_prompt_view` once the token ids (if any) are known: ``tokens`` (the
        prompt's length), ``cached`` (worker → tokens of it believed held, at most
        ``tokens``), ``hashes`` (its chunk hashes, computed once: matched here, recorded at
        dispatch), ``chars``, ``sent`` (``now``)."""
        estimator = self.estimators.get(model.name)
        if estimator is None:
            estimator = self.estimators[model.name] = TokenEstimator()
        text = request_text(body)
        if text:
            chunk_chars = int(model.block_size * CHARS_PER_TOKEN)
            hashes = text_chunk_hashes(text, chunk_chars)
            unit = chunk_chars / estimator.chars_per_token
            tokens = len(token_ids) if token_ids else estimator.estimate(len(text))
        else:
            hashes = token_block_hashes(token_ids or [], model.block_size)
            unit = model.block_size
            tokens = len(token_ids or [])
        cached = {}
        if hashes:
            for w, n in self.approx.match(model.name, hashes, now).items():
                held = int(n * unit)
                cached[w] = held if held < tokens else tokens
        precise = self.precise.get(model.name) if token_ids else None
        if precise is not None:
            subscriber = self.subscriber
            for w, held in precise.match(token_ids).items():
                if subscriber is not None and subscriber.stalled(w):
                    continue  # stalled stream: its precise entries may be stale
                held = held if held < tokens else tokens
                if held > cached.get(w, 0):
                    cached[w] = held
        # "sent": when the request came in (monotonic), so that its answer's duration can
        # teach AnswerLengths which answers stay in flight (gateway/answer_lengths.py).
        return {"tokens": tokens, "cached": cached, "hashes": hashes, "chars": len(text),
                "sent": now}

    async def _tokenize(self, model: ModelRoute, body: dict, chat: bool) -> list[int] | None:
        worker = next((w for w in model.workers if w.active), None)
        if worker is None:
            return None
        payload = {"model": model.name}
        if chat:
            payload["messages"] = body.get("messages")
        else:
            payload["prompt"] = body.get("prompt")
        try:
            async with self.session.post(
                worker.url + "/tokenize", json=payload, timeout=aiohttp.ClientTimeout(total=2)
            ) as response:
                if response.status != 200:
                    return None
                answer = await response.json(loads=orjson.loads)
                tokens = answer.get("tokens")
                return tokens if isinstance(tokens, list) else None
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
            return None

    def _remember_prefix(self, model: ModelRoute, plan, prompt, counted=None) -> None:
        """At dispatch: the workers the plan sends the prompt to are believed to hold it.
        ``counted``: the model's metrics (:meth:`GatewayMetrics.model`)."""
        hashes = prompt["hashes"]
        if hashes:
            now = time.monotonic()
            self.approx.record(model.name, hashes, plan.decode, now)
            if plan.prefill:
                self.approx.record(model.name, hashes, plan.prefill, now)
            if self.peers is not None:
                self.peers.route(model.name, plan.decode, hashes)
                if plan.prefill:
                    self.peers.route(model.name, plan.prefill, hashes)
        if self.subscriber is not None and prompt["tokens"] - plan.cached_tokens >= \
                model.block_size:
            # At least one uncached block: the engine will store it and publish an event.
            self.subscriber.expect_events(plan.prefill or plan.decode)
        if counted is None:
            counted = self.metrics.model(model.name)
        counted.prefix_hit_tokens.inc(plan.cached_tokens)
        counted.prompt_tokens.inc(prompt["tokens"])

    def _learn_from_stream_tail(self, model, prompt, tail: bytes) -> None:
        for line in reversed(tail.split(b"\n")):
            if line.startswith(b"data:") and b'"prompt_tokens"' in line:
                self._learn_from_answer(model, prompt, line[5:].strip())
                return

    def _learn_from_answer(self, model, prompt, payload: bytes) -> None:
        """A finished answer (a non-streaming body, or a stream's usage chunk): the length
        of the answer (``usage.completion_tokens``: what the next requests' reservations
        weigh, :class:`gateway.answer_lengths.AnswerLengths`) and the prompt's tokens."""
        completion = _usage_count(payload, _COMPLETION_TOKENS_KEY)
        if completion is not None:
            sent = prompt.get("sent")
            if sent is None:
                self.answer_lengths.observe(model.name, prompt["tokens"], completion)
            else:
                now = time.monotonic()
                self.answer_lengths.observe(model.name, prompt["tokens"], completion,
                                            now - sent, now)
        self._learn_tokens(model, prompt, payload)

    def _learn_tokens(self, model, prompt, payload: bytes, answer=None) -> None:
        if not prompt["chars"]:
            return
        if answer is not None:
            try:
                tokens = answer["usage"]["prompt_tokens"]
            except (KeyError, TypeError):
                return
        else:
            tokens = _usage_count(payload)
        if isinstance(tokens, int) and not isinstance(tokens, bool):
            estimator = self.estimators[model.name]
            estimator.observe(prompt["chars"], tokens)
            sized = self._sized_at.get(model.name, 0.0)
            if abs(estimator.chars_per_token - sized) > 0.05 * max(sized, 1.0):
                self._size_prefix_index(model)
