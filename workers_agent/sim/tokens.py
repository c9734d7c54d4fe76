"""Deterministic, local tokenisation for the simulator (no tokenizer download).

Text is split on whitespace; each word is one token. The vocabulary is a fixed list of
``VOCAB_SIZE`` distinct words: a few chat-template specials, common English words, then
pronounceable pseudo-words built from syllables. A word in the vocabulary maps to its index;
any other word maps to a stable hash of it (blake2b, never Python's salted ``hash()``), so the
same text gives the same ids in every process. ``decode`` maps ids back to vocabulary words,
hence ``encode(decode(ids)) == ids`` for every id in range — the workload player relies on it
to send text prompts that the simulated engine re-tokenises to exactly the trace's ids.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

VOCAB_SIZE = 32_000

SPECIAL_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
)
BOS_ID = 0
EOS_ID = 1

_COMMON_TEXT = """
the of and to in is that it was for on are as with his they at be this from have or by one
had not but what all were when we there can an your which their said if do will each about
how up out them then she many some so these would other into has more her two like him see
time could no make than first been its who now people my made over did down only way find use
may water long little very after words called just where most know get through back much go
good new write our me man too any day same right look think also around another came come
work three word must because does part even place well such here take why things help put
years different away again off went old number great tell men say small every found still
between name should home big give air line set own under read last never us left end along
while might next sound below saw something thought both few those always looks show large
often together asked house world going want school important until form food keep children
feet land side without boy once animals life enough took sometimes four head above kind began
almost live page got earth need far hand high year mother light parts country father let night
following picture being study second eyes soon times story boys since white days ever paper
hard near sentence better best across during today others however sure means knew try told
young miles sun ways thing whole hear example heard several change answer room sea against top
turned learn point city play toward five using himself usually model cache token prefill decode
"""
_COMMON_WORDS = _COMMON_TEXT.split()

_ONSET_TEXT = "b c d f g h j k l m n p r s t v w z br cr dr fr gr pr tr st sk sl sm sn sp ch sh th"
_VOWEL_TEXT = "a e i o u ai ea io ou"
_ONSETS = _ONSET_TEXT.split()
_VOWELS = _VOWEL_TEXT.split()


def _build_vocabulary() -> list[str]:
    words: list[str] = []
    seen: set[str] = set()

    def add(word: str) -> None:
        if word not in seen:
            seen.add(word)
            words.append(word)

    for word in SPECIAL_TOKENS:
        add(word)
    for word in _COMMON_WORDS:
        add(word)
    syllables = [onset + vowel for onset in _ONSETS for vowel in _VOWELS]
    codas = ["", "n", "r", "s", "l", "m", "t", "x"]
    # Two- and three-syllable pseudo-words with an optional coda: far more than we need.
    for coda in codas:
        for first in syllables:
            for second in syllables:
                add(first + second + coda)
                if len(words) >= VOCAB_SIZE:
                    return words
    for first in syllables:  # pragma: no cover - reached only if the lists above shrink
        for second in syllables:
            for third in syllables:
                add(first + second + third)
                if len(words) >= VOCAB_SIZE:
                    return words
    raise AssertionError("vocabulary generator ran out of words")


VOCABULARY: tuple[str, ...] = tuple(_build_vocabulary())
_WORD_TO_ID: dict[str, int] = {word: index for index, word in enumerate(VOCABULARY)}
# Ids that decode to ordinary words (not chat-template specials): used for synthetic prompts
# and generated text.
FIRST_WORD_ID = len(SPECIAL_TOKENS)
NUM_WORD_IDS = VOCAB_SIZE - FIRST_WORD_ID


def _hash_word(word: str) -> int:
    digest = hashlib.blake2b(word.encode("utf-8"), digest_size=8, person=b"pdplane-tok").digest()
    return FIRST_WORD_ID + int.from_bytes(digest, "little") % NUM_WORD_IDS


def encode(text: str) -> list[int]:
    """Token ids of ``text``: one per whitespace-separated word."""
    lookup = _WORD_TO_ID.get
    out = []
    for word in text.split():
        token = lookup(word)
        out.append(_hash_word(word) if token is None else token)
    return out


def decode(token_ids: Iterable[int]) -> str:
    """Words for ``token_ids`` joined by single spaces; out-of-range ids wrap."""
    vocab = VOCABULARY
    return " ".join(vocab[token % VOCAB_SIZE] for token in token_ids)


def decode_token(token_id: int) -> str:
    return VOCABULARY[token_id % VOCAB_SIZE]


def apply_chat_template(
    messages: Sequence[Mapping[str, object]], add_generation_prompt: bool = True
) -> str:
    """Llama-3-like chat template rendered as words, so it tokenises like any other text.

    Message ``content`` may be a string or a list of OpenAI content parts (text parts are
    joined; other part types are ignored).
    """
    parts = ["<|begin_of_text|>"]
    for message in messages:
        role = str(message.get("role", "user"))
        content = message.get("content", "")
        if isinstance(content, list):
            content = " ".join(
                str(part.get("text", ""))
                for part in content
                if isinstance(part, Mapping) and part.get("type", "text") == "text"
            )
        parts.append(f"<|start_header_id|> {role} <|end_header_id|> {content} <|eot_id|>")
    if add_generation_prompt:
        parts.append("<|start_header_id|> assistant <|end_header_id|>")
    return " ".join(parts)
