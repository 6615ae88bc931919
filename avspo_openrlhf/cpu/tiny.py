"""A tiny random Qwen2 model (~0.1M parameters; the dominating embedding is tied) with a byte-level BPE tokenizer trained locally:
built offline in about a second, for tests and debugging the pipeline without any download."""

from __future__ import annotations

import os

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = [
    "Please reason step by step, and put your final answer within \\boxed{}.",
    "What is 3 + 4? The answer is \\boxed{7}.",
    "Compute 12 * 5 = 60, so the answer is \\boxed{60}.",
    "system user assistant question answer 0 1 2 3 4 5 6 7 8 9 + - * / = ( ) { } ^ \\frac \\sqrt",
]


def build_tiny_model(out_dir: str, seed: int = 0, hidden: int = 64, layers: int = 2, vocab_size: int = 320) -> str:
    """Write a random ``Qwen2ForCausalLM`` + tokenizer (with a chat template) to ``out_dir``.

    Heads are 32 wide: vLLM's CPU attention supports only some head sizes (16 fails)."""
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    os.makedirs(out_dir, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        _CORPUS * 4, vocab_size=vocab_size, min_frequency=1, special_tokens=SPECIAL, show_progress=False
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out_dir)

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 32),
        num_key_value_heads=1,
        max_position_embeddings=2048,  # the positions the README's GPU command asks for (--data.max_len 2048)
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out_dir)
    return out_dir


def tiny_assets(root: str, n_prompts: int = 32) -> dict[str, str]:
    """The tiny random model and ``n_prompts`` arithmetic prompts (add1, add2) under ``root``: what the
    CPU end-to-end tests and the reliability probe train on. Returns ``{"model", "data"}`` paths."""
    from avspo_openrlhf.data.io import write_jsonl
    from avspo_openrlhf.data.tasks import make_prompt, synthetic_arithmetic

    rows = synthetic_arithmetic(n_prompts, ["add1", "add2"], seed=0)
    for r in rows:
        r["prompt"] = make_prompt(r["problem"])
    write_jsonl(rows, os.path.join(root, "arith.jsonl"))
    return {"model": build_tiny_model(os.path.join(root, "tiny")), "data": os.path.join(root, "arith.jsonl")}
