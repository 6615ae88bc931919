"""Time one RL-ZVP step with its token entropies from the log-prob forward against the separate
entropy pass it used to make, and against GRPO (docs/algorithm.md#rl-zvp).

A step here is what one policy process computes for a batch, in OpenRLHF's own code (its ``Actor``,
its chunked log-prob kernel), without Ray or DeepSpeed:

- experience: the no-grad forward for the old-policy log-probs (``make_experience``);
  ``before`` adds a second no-grad forward over the zero-variance rows (``return_entropy``, what
  the policy actor's ``token_entropy`` ran); ``after`` gets those rows' entropies from the first
  forward (``trainer/token_level.py: log_probs_and_entropy``, what the policy actor runs now);
- train: one forward + backward over the batch (PPO's clipped ratio loss) and an AdamW step.

With ``--old-pass skipped`` (the CPU backend's quickstart: one optimizer step per rollout batch, no
KL, ``trainer/old_log_probs.py``) there is no experience forward: GRPO trains alone, ``before`` still
makes the separate entropy pass, ``after`` keeps the rows' entropies from the training forward
(``ResponseLogitsActor.entropy_rows``); every variant then uses the response-only forward.

Variants are interleaved, each repeat times all three; prints medians and the ratios, all from this
one run, and the largest gap between the two ways' entropies.

    python benchmarks/bench_rl_zvp_step.py                        # tiny model, CPU, fp32
    python benchmarks/bench_rl_zvp_step.py --old-pass skipped     # as the CPU quickstart runs
    python benchmarks/bench_rl_zvp_step.py --model qwen2-0.5b --device cuda --dtype bf16 \\
        --batch 8 --prompt-len 256 --response-len 768             # a random Qwen2-0.5B-shaped model
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch

QWEN2_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    tie_word_embeddings=True,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
)
"""Qwen/Qwen2-0.5B's config.json shapes (built here with random weights: no download)."""


def build_model(name: str, out_dir: str, dtype: torch.dtype) -> str:
    if name == "tiny":
        from avspo_openrlhf.cpu.tiny import build_tiny_model

        return build_tiny_model(out_dir)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(**QWEN2_05B)).to(dtype).save_pretrained(out_dir)
    return out_dir


def make_batch(vocab: int, batch: int, prompt_len: int, response_len: int, zero_variance: float, device):
    gen = torch.Generator(device="cpu").manual_seed(0)
    total = prompt_len + response_len
    seq = torch.randint(5, vocab - 1, (batch, total), generator=gen, device="cpu")
    lengths = torch.randint(response_len // 2, response_len + 1, (batch,), generator=gen, device="cpu")
    action_mask = torch.arange(response_len, device="cpu")[None] < lengths[:, None]  # right-padded responses
    attention_mask = torch.cat(
        [torch.ones(batch, prompt_len, dtype=torch.long, device="cpu"), action_mask.long()], dim=1
    )
    rows = torch.zeros(batch, dtype=torch.bool, device="cpu")
    rows[: round(batch * zero_variance)] = True
    advantages = torch.randn(batch, generator=gen, device="cpu")[:, None] * action_mask
    return [t.to(device) for t in (seq, action_mask, attention_mask, rows, advantages)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["tiny", "qwen2-0.5b"], default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="weights (logits are fp32, as OpenRLHF)")
    ap.add_argument("--attn", default="sdpa", help="attention implementation")
    ap.add_argument("--batch", type=int, default=16, help="responses per step (one micro-batch)")
    ap.add_argument("--prompt-len", type=int, default=24)
    ap.add_argument("--response-len", type=int, default=40)
    ap.add_argument(
        "--zero-variance",
        type=float,
        default=0.5,
        help="fraction of the batch in zero-variance groups (ACR): the rows that need entropies",
    )
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--old-pass", choices=["runs", "skipped"], default="runs",
                    help="runs: make_experience's no-grad log-prob forward (GPU runs, and CPU runs that need it); "
                    "skipped: none, as the CPU backend where the old log-probs are the training forward's")  # fmt: skip
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--out", help="also write the result (JSON) to this file")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]

    from avspo_openrlhf.cpu.compat import install_gpu_module_stubs
    from avspo_openrlhf.cpu.dtype import cpu_kind

    install_gpu_module_stubs()  # OpenRLHF imports flash_attn at module top
    from openrlhf.models import Actor

    from avspo_openrlhf.trainer.token_level import log_probs_and_entropy

    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(args.model, tmp, dtype)
        # OpenRLHF loads bf16 (fp32 is the CPU backend's addition); the weights then take --dtype
        actor = Actor(path, attn_implementation=args.attn, param_dtype="bf16").to(device=device, dtype=dtype)
    skipped = args.old_pass == "skipped"
    if skipped:
        from avspo_openrlhf.trainer.response_logits import use_response_logits

        assert use_response_logits(actor), "the response-only forward does not apply to this model"
    vocab = actor.model.config.vocab_size
    seq, amask, attn, rows, adv = make_batch(
        vocab, args.batch, args.prompt_len, args.response_len, args.zero_variance, device
    )
    optim = torch.optim.AdamW(actor.parameters(), lr=1e-6)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def experience(variant: str):
        actor.eval()
        with torch.no_grad():
            if skipped:
                old, h = None, None
                if variant == "before":
                    _, out = actor(seq[rows], amask[rows], attn[rows], return_output=True, return_entropy=True)
                    h = out.entropy[:, -amask.shape[1] :].float() * amask[rows]
            elif variant == "after":
                old, h = log_probs_and_entropy(actor, seq, amask, attn, rows)
            else:
                old, h = actor(seq, amask, attn), None
                if variant == "before":  # the separate pass token_entropy made over the rows
                    _, out = actor(seq[rows], amask[rows], attn[rows], return_output=True, return_entropy=True)
                    h = out.entropy[:, -amask.shape[1] :].float() * amask[rows]
        actor.train()
        return old, h

    def train(old, variant):
        if skipped and variant == "after":
            actor.entropy_rows = rows
        logp = actor(seq, amask, attn)
        actor.entropy_rows = None
        if old is None:  # the skipped pass: the training forward's own, detached (ratio 1)
            old = logp.detach()
        ratio = (logp - old).exp()
        loss = -(torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv) * amask).sum() / amask.sum()
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)

    variants = ("grpo", "before", "after")
    times = {v: {"experience": [], "train": []} for v in variants}
    entropies = {}
    for i in range(args.warmup + args.repeats):
        for v in variants:  # interleaved: drift hits all three alike
            sync()
            t0 = time.perf_counter()
            old, h = experience(v)
            sync()
            t1 = time.perf_counter()
            train(old, v)
            sync()
            t2 = time.perf_counter()
            if skipped and v == "after":
                h = actor.kept_entropy * amask[rows]
            entropies[v] = h
            if i >= args.warmup:
                times[v]["experience"].append(t1 - t0)
                times[v]["train"].append(t2 - t1)

    med = {v: {k: statistics.median(x) for k, x in t.items()} for v, t in times.items()}
    for v in variants:
        med[v]["step"] = med[v]["experience"] + med[v]["train"]
    gap = float((entropies["after"] - entropies["before"]).abs().max()) if rows.any() else 0.0
    result = {
        "model": args.model,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_kind(),
        "dtype": args.dtype,
        "attn": args.attn,
        "old_pass": args.old_pass,
        "batch": args.batch,
        "prompt_len": args.prompt_len,
        "response_len": args.response_len,
        "zero_variance_rows": int(rows.sum()),
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "median_ms": {v: {k: round(1000 * x, 3) for k, x in m.items()} for v, m in med.items()},
        "step_ratio": {
            "before/grpo": med["before"]["step"] / med["grpo"]["step"],
            "after/grpo": med["after"]["step"] / med["grpo"]["step"],
            "after/before": med["after"]["step"] / med["before"]["step"],
        },
        "max_entropy_gap_nats": gap,
    }
    if device.type == "cuda":
        result["peak_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
