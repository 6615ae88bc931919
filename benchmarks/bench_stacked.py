"""One study step of K runs, the way the study runs them today (one run at a time through
transformers: HF ``generate``, the training forward and backward, AdamW) against the stacked engine
(``study/stacked.py``: the K runs' weights stacked, one batched generation with a static KV cache,
one batched forward and backward, one per-run AdamW). Same model shape, same batch per run; the
generated tokens per second of all K runs, and the ratio, measured in one run of this script.

The per-process engine on a GPU runs K processes at once; on a CPU they share the same cores, so
"one at a time with every core" is what K processes amount to here. On a GPU the stacked engine's
gain comes from fewer, larger kernels, which a CPU does not show: this is the CPU's number, with
the device and precision printed.

    python benchmarks/bench_stacked.py                                # tiny Qwen2, K = 1 and 8, CPU fp32
    python benchmarks/bench_stacked.py --shape smollm2 --k 1 8        # SmolLM2-135M's shape, random weights
    python benchmarks/bench_stacked.py --device cuda --dtype bf16 --shape smollm2 --k 1 12 24 --prompts 8 --group 8 --new 32
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from avspo_openrlhf.study import stacked

SHAPES = {
    "tiny": (
        "qwen2",
        dict(
            vocab_size=320,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            tie_word_embeddings=True,
        ),
    ),
    "smollm2": (
        "llama",
        dict(
            vocab_size=49152,
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            head_dim=64,
            tie_word_embeddings=True,
            rope_parameters={"rope_theta": 100000.0, "rope_type": "default"},
        ),
    ),
}


def build(shape: str, k: int, device: str):
    import transformers

    kind, kw = SHAPES[shape]
    cfg = (transformers.Qwen2Config if kind == "qwen2" else transformers.LlamaConfig)(max_position_embeddings=512, **kw)
    cls = transformers.Qwen2ForCausalLM if kind == "qwen2" else transformers.LlamaForCausalLM
    torch.manual_seed(0)
    models = [cls(cfg).to(device) for _ in range(k)]
    return cfg, models


def prompts(k: int, n: int, length: int, vocab: int, device: str):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (k, n, length), generator=g).to(device)
    return ids, torch.ones_like(ids)


def one_at_a_time(models, ids, attn, new: int, dtype) -> tuple[float, int]:
    """K runs in sequence, each: HF generate (sampling, no EOS: every sequence runs T tokens), the
    training forward and backward over prompt + completion, an AdamW step."""
    tokens = 0
    t0 = time.perf_counter()
    for k, m in enumerate(models):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-5, betas=(0.9, 0.95), weight_decay=0.0)
        with torch.autocast(ids.device.type, dtype=dtype, enabled=dtype != torch.float32):
            m.eval()
            with torch.no_grad():
                out = m.generate(
                    input_ids=ids[k],
                    attention_mask=attn[k],
                    do_sample=True,
                    temperature=0.7,
                    top_k=0,
                    top_p=1.0,
                    max_new_tokens=new,
                    min_new_tokens=new,
                    pad_token_id=0,
                )
            m.train()
            logits = m(input_ids=out, logits_to_keep=new + 1).logits[:, :-1].float()
            loss = -torch.log_softmax(logits / 0.7, -1).gather(-1, out[:, -new:, None]).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        tokens += out.shape[0] * new
    _sync(ids.device)
    return time.perf_counter() - t0, tokens


def together(params, scfg, opt, ids, attn, new: int, dtype) -> tuple[float, int]:
    """The K runs in one batched generation, one batched forward and backward, one per-run AdamW."""
    K, n, _ = ids.shape
    t0 = time.perf_counter()
    gens = [torch.Generator().manual_seed(7 + k) for k in range(K)]
    u = stacked.per_run_uniforms(gens, (n, new), ids.device)
    comp = stacked.generate(
        params,
        scfg,
        ids,
        attn,
        u,
        0.7,
        torch.tensor([-1], device=ids.device),
        0,
        autocast_dtype=None if dtype == torch.float32 else dtype,
    )
    seq = torch.cat([ids, comp], -1)
    a = torch.ones_like(seq)
    pos = (a.cumsum(-1) - 1).clamp_min(0)
    with torch.autocast(ids.device.type, dtype=dtype, enabled=dtype != torch.float32):
        logits = stacked.forward(params, scfg, seq, a, pos, keep=new + 1)[:, :, :-1]
        loss = -torch.log_softmax(logits / 0.7, -1).gather(-1, comp[..., None]).mean((1, 2, 3)).sum()
    loss.backward()
    opt.step(1.0)
    opt.zero_grad()
    _sync(ids.device)
    return time.perf_counter() - t0, K * n * comp.shape[-1]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=list(SHAPES), default="tiny")
    p.add_argument("--k", type=int, nargs="+", default=[1, 8], help="runs advanced together")
    p.add_argument("--prompts", type=int, default=2, help="prompts per run and step")
    p.add_argument("--group", type=int, default=4, help="completions per prompt (G)")
    p.add_argument("--prompt-len", type=int, default=24)
    p.add_argument("--new", type=int, default=16, help="new tokens per completion")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--json", help="write the numbers here")
    args = p.parse_args(argv)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    device = torch.device(args.device)
    rows = []
    for k in args.k:
        cfg, models = build(args.shape, k, args.device)
        scfg = stacked.StackedConfig.from_hf(cfg)
        params = stacked.stack([m.state_dict() for m in models], scfg, device)
        opt = stacked.StackedAdamW(params, torch.full((k,), 1e-5))
        ids, attn = prompts(k, args.prompts * args.group, args.prompt_len, cfg.vocab_size, args.device)
        old, new = [], []
        for _ in range(args.repeats):  # interleaved, the first of each a warm-up
            s, n_old = one_at_a_time(models, ids, attn, args.new, dtype)
            old.append(n_old / s)
            s, n_new = together(params, scfg, opt, ids, attn, args.new, dtype)
            new.append(n_new / s)
        row = {
            "k": k,
            "one_at_a_time_tok_s": statistics.median(old[1:] or old),
            "stacked_tok_s": statistics.median(new[1:] or new),
        }
        row["ratio"] = row["stacked_tok_s"] / row["one_at_a_time_tok_s"]
        rows.append(row)
        print(
            f"K={k}: one at a time {row['one_at_a_time_tok_s']:.0f} generated tokens/s, stacked "
            f"{row['stacked_tok_s']:.0f} ({row['ratio']:.2f}x)",
            flush=True,
        )
    if device.type == "cuda":
        where = torch.cuda.get_device_name(device)
    else:
        from avspo_openrlhf.cpu.dtype import cpu_kind

        where = cpu_kind()
    out = {
        "device": where,
        "precision": args.dtype,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "shape": args.shape,
        "per_run": {"sequences": args.prompts * args.group, "prompt_len": args.prompt_len, "new_tokens": args.new},
        "rows": rows,
    }
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
