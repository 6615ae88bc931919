"""AVSPO in one file: generate -> reward -> CollapseController.step -> policy loss -> optimizer.step().

Plain torch + transformers (no Ray, DeepSpeed or vLLM): the same algorithm objects `avspo-train`
runs inside OpenRLHF, on a loop you can read in one sitting. The math is in docs/algorithm.md.

    python examples/avspo_loop.py                              # tiny random model, 4 steps, seconds
    python examples/avspo_loop.py --model smollm2 --steps 20   # SmolLM2-135M-Instruct learns arithmetic
    python examples/avspo_loop.py --remedy ngrpo               # any registered estimator (grpo, sign, ...)
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from avspo_openrlhf.algo import ESTIMATORS, ACRConfig, CollapseController
from avspo_openrlhf.data.tasks import make_prompt, synthetic_arithmetic
from avspo_openrlhf.rewards.arith_reward import score_arith


def load(model: str):
    if model in ("tiny", "smollm2"):
        from avspo_openrlhf.cpu.models import prepare

        model = prepare(model, tempfile.mkdtemp() if model == "tiny" else None)
    tok = AutoTokenizer.from_pretrained(model, padding_side="left")
    tok.pad_token = tok.pad_token or tok.eos_token
    return AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.float32), tok


@torch.no_grad()
def generate(policy, tok, problems: list[str], G: int, max_new_tokens: int, temperature: float):
    """G sampled completions per problem: token ids [N*G, T], the prompt length, the texts."""
    chats = [tok.apply_chat_template(make_prompt(p, "user"), tokenize=False, add_generation_prompt=True)
             for p in problems]  # fmt: skip
    enc = tok(chats, return_tensors="pt", padding=True)
    out = policy.generate(**enc, do_sample=True, temperature=temperature, max_new_tokens=max_new_tokens,
                          num_return_sequences=G, pad_token_id=tok.pad_token_id)  # fmt: skip
    plen = enc["input_ids"].shape[1]
    return out, plen, tok.batch_decode(out[:, plen:], skip_special_tokens=True)


def token_logprobs(policy, ids: torch.Tensor, plen: int, pad_id: int) -> torch.Tensor:
    """log pi(token | prefix) of every completion token: [N*G, T - plen]."""
    mask = (ids != pad_id).long()
    logits = policy(input_ids=ids, attention_mask=mask).logits[:, plen - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, plen:, None]).squeeze(-1)


def completion_mask(ids: torch.Tensor, plen: int, eos_id: int) -> torch.Tensor:
    """1 for completion tokens up to and including the first EOS, 0 after it."""
    comp = ids[:, plen:]
    after_eos = (comp == eos_id).long().cumsum(-1) - (comp == eos_id).long()
    return (after_eos == 0).float()


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny", help="tiny | smollm2 | a local HF folder")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--prompts", type=int, default=4, help="problems per step (N)")
    p.add_argument("--G", type=int, default=8, help="completions per problem")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--eps-clip", type=float, default=0.2)
    p.add_argument(
        "--ppo-epochs", type=int, default=2, help="updates per batch (the ratio moves off 1 after the first)"
    )
    p.add_argument("--seed", type=int, default=0)
    group = sorted(n for n, e in ESTIMATORS.items() if e.token_fn is None)  # RL-ZVP needs token entropies
    p.add_argument("--remedy", default="avspo", choices=group, help="the advantage estimator (default: AVSPO)")
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)

    policy, tok = load(args.model)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.lr)
    # the paper's AVSPO defaults (AVSPOConfig()); tau_init 0.25 opens the gate on this small task
    # (docs/algorithm.md#gate), a 5-step window smooths ACR_gate
    controller = CollapseController(args.remedy, acr=ACRConfig(tau_init=0.25, window=5), seed=args.seed)
    data = synthetic_arithmetic(args.steps * args.prompts, ["add1", "mul1"], seed=args.seed)
    start = [w.detach().clone() for w in policy.parameters()]
    history = []
    for step in range(args.steps):
        batch = data[step * args.prompts : (step + 1) * args.prompts]
        # 1. generate: G completions per problem (row i*G + j is completion j of problem i)
        policy.eval()
        ids, plen, texts = generate(policy, tok, [r["problem"] for r in batch], args.G, args.max_new_tokens,
                                    args.temperature)  # fmt: skip
        # 2. reward: 1 for the right integer, else 0 (statuses: correct / wrong / no_answer / unparsable)
        golds = [str(r["answer"]) for r in batch for _ in range(args.G)]
        rewards = torch.tensor([float(score_arith(t, g) == "correct") for t, g in zip(texts, golds)])
        rewards = rewards.view(args.prompts, args.G)
        # 3. advantages: ACR, the gate, virtual samples in collapsed groups, the threshold update
        adv, metrics = controller.step(rewards)
        adv = adv.reshape(-1, 1)  # one advantage per completion, shared by its tokens
        # 4. policy loss: PPO-clip, token-level mean over completion tokens
        mask = completion_mask(ids, plen, tok.eos_token_id)
        policy.train()
        with torch.no_grad():
            old_lp = token_logprobs(policy, ids, plen, tok.pad_token_id)
        for _ in range(args.ppo_epochs):
            lp = token_logprobs(policy, ids, plen, tok.pad_token_id)
            ratio = torch.exp(lp - old_lp)
            surr = torch.minimum(ratio * adv, ratio.clamp(1 - args.eps_clip, 1 + args.eps_clip) * adv)
            loss = -(surr * mask).sum() / mask.sum().clamp(min=1)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite loss at step {step + 1}")
            # 5. the optimizer step
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
            optimizer.step()
        row = {"step": step + 1, "reward": float(rewards.mean()), "acr": metrics["acr"],
               "acr_effective": metrics["acr_effective"], "gate_open": metrics.get("gate_open", 0.0),
               "tau_adapt": metrics.get("tau_adapt", controller.threshold.tau), "loss": float(loss.detach())}  # fmt: skip
        history.append(row)
        print(" ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
    moved = sum(float((w.detach() - w0).abs().sum()) for w, w0 in zip(policy.parameters(), start))
    return {"history": history, "controller": controller.state_dict(), "weight_change": moved}


if __name__ == "__main__":
    main()
