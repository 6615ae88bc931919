"""AVSPO (or any registered remedy) on a loop you can read in one sitting, without Ray, DeepSpeed or vLLM.

The loop is the remedies study's (avspo_openrlhf/study/loop.py; its engine study/hf_engine.py): generate G completions per
prompt -> reward -> CollapseController.step (ACR, the gate, the estimator's advantages) -> policy loss
-> optimizer step; the same algorithm objects `avspo-train` runs inside OpenRLHF. The math is in
docs/algorithm.md. This script builds a run of a few steps and prints each step.

    python examples/avspo_loop.py                              # tiny random model, 4 steps, seconds
    python examples/avspo_loop.py --model smollm2 --steps 20   # SmolLM2-135M-Instruct learns arithmetic
    python examples/avspo_loop.py --remedy ngrpo               # any registered estimator (grpo, sign, rl_zvp, ...)
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from avspo_openrlhf.algo import ESTIMATORS
from avspo_openrlhf.data.io import write_jsonl
from avspo_openrlhf.data.tasks import synthetic_arithmetic
from avspo_openrlhf.study.loop import Run
from avspo_openrlhf.study.spec import Arm, RunSpec, StudySettings


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny", help="tiny | smollm2 | a local HF folder")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--prompts", type=int, default=4, help="problems per step (N)")
    p.add_argument("--G", type=int, default=8, help="completions per problem")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--remedy", default="avspo", choices=sorted(ESTIMATORS), help="the advantage estimator")
    args = p.parse_args(argv)

    folder = Path(tempfile.mkdtemp(prefix="avspo_loop_"))
    model = args.model
    if model in ("tiny", "smollm2"):
        from avspo_openrlhf.cpu.models import prepare

        model = prepare(model, str(folder / "tiny") if model == "tiny" else None)
    write_jsonl(
        synthetic_arithmetic(args.steps * args.prompts, ["add1", "mul1"], seed=args.seed), str(folder / "train.jsonl")
    )
    write_jsonl(synthetic_arithmetic(4, ["add1", "mul1"], seed=1000), str(folder / "heldout.jsonl"))
    # the paper's AVSPO defaults (AVSPOConfig()); tau_init 0.25 opens the gate on this small task
    # (docs/algorithm.md#gate), a 5-step window smooths ACR_gate
    settings = StudySettings(
        group_size=args.G,
        prompts_per_step=args.prompts,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        lr=args.lr,
        token_budget=10**9,
        max_steps=args.steps,
        acr={"tau_init": 0.25, "window": 5},
        final_eval=False,
        ckpt_every=0,
    )
    run = Run(
        RunSpec(
            args.remedy,
            args.seed,
            Arm(args.remedy),
            settings,
            model,
            str(folder / "train.jsonl"),
            str(folder / "heldout.jsonl"),
        ),
        folder / "run",
    )
    start = [w.detach().clone() for w in run.policy.model.parameters()]
    history = []
    for _ in range(args.steps):
        row = run.step()  # generate, reward, advantages, loss, optimizer step
        history.append(row)
        keys = ("step", "tokens", "reward", "acr", "acr_effective", "gate_open", "loss")
        print(" ".join(f"{k} {row[k]:.3f}" if isinstance(row[k], float) else f"{k} {row[k]}" for k in keys), flush=True)
    moved = sum(float((w.detach() - w0).abs().sum()) for w, w0 in zip(run.policy.model.parameters(), start))
    return {"history": history, "controller": run.controller.state_dict(), "weight_change": moved}


if __name__ == "__main__":
    main()
