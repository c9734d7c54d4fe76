"""Build a tiny Llama model and tokenizer locally, for the real vLLM engine tier.

Runs inside the vLLM venv (it needs torch, transformers and tokenizers, which the project's
venv does not carry):  ``<vllm-venv>/bin/python tests/realvllm/tiny_model.py OUT_DIR``.

Nothing is downloaded: the byte-level BPE is trained on text generated here and the weights
are random with a fixed seed, so the same directory comes out on every machine. The model
talks nonsense, which is fine: the tier checks plumbing (metrics, KV events, KV transfer,
greedy equality), never quality. About 3 MB; cached by the test fixtures, never committed.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

SEED = 1234
VOCAB_SIZE = 512  # a multiple of 64; the trainer may stop short, the config pads up
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
# Bump when anything below changes, so a cached build is not reused by mistake.
BUILD_VERSION = "1"

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

WORD_LIST = (
    "the prefill decode cache block token engine gateway router worker node gpu link "
    "transfer request stream latency budget queue model layer head prompt reply fleet "
    "plane control agent event metric sample batch memory page hash prefix tree "
    "alpha beta gamma delta one two three four five six seven eight nine ten"
)
WORDS = WORD_LIST.split()


def corpus(lines: int = 4000) -> list[str]:
    rng = random.Random(SEED)
    out = []
    for _ in range(lines):
        n = rng.randint(4, 24)
        out.append(" ".join(rng.choice(WORDS) for _ in range(n)) + ".")
    return out


def build(out_dir: Path) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out_dir.mkdir(parents=True, exist_ok=True)

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus(), trainer=trainer)

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.model_max_length = 2048
    tokenizer.save_pretrained(out_dir)

    vocab = ((len(tokenizer) + 63) // 64) * 64
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out_dir, safe_serialization=True)
    (out_dir / "pdplane-tiny.json").write_text(json.dumps({"build": BUILD_VERSION, "vocab": vocab}))
    return out_dir


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tiny_model.py OUT_DIR")
    print(build(Path(sys.argv[1])))
