"""Which remedy? The GPU study's configuration, fixed before its runs (README.md beside this file
says why each choice), run by ``avspo_openrlhf.study.remedies_gpu`` (``--help``).

    python experiments/remedies_gpu/run.py --pilot --k 12 --publish experiments/remedies_gpu/results   # the pilot
    python experiments/remedies_gpu/run.py --k 12 --publish experiments/remedies_gpu/results           # the waves
    python experiments/remedies_gpu/run.py --lr-check --k 12 --publish experiments/remedies_gpu/results  # lr check
    python experiments/remedies_gpu/run.py --throughput 1,4,8,12,16 --publish experiments/remedies_gpu/results
    python experiments/remedies_gpu/run.py --report-only --publish experiments/remedies_gpu/results
"""

from __future__ import annotations

import sys

from avspo_openrlhf.study.loop import Arm, StudySettings
from avspo_openrlhf.study.remedies_gpu import GPURemediesStudy

# Every arm's mixed groups get GRPO's advantages with one convention (population std + 1e-6, the AVSPO
# paper's), so two arms differ only in what they do with collapsed groups (NGRPO, whose virtual
# maximum enters every group's statistics by design, excepted).
PLANNING_SD = 0.07  # the per-seed paired sd the seeds are sized for: README.md, "How many seeds"
PRIMARY_SEEDS = 24  # seeds_for_halfwidth(PLANNING_SD, 0.03): a 95 % half-width of 2.96 points at sd 7

STUDY = GPURemediesStudy(
    levels=("add1", "mul1", "add2", "multi"),  # the CPU study's task: ~58 % of the start's groups collapse
    train_prompts=64,  # 16 per level: revisited every 8 steps, so GRESO has a history to use
    heldout_per_level=300,  # distinct, none a training prompt: add1 and mul1 have fewer (all there are)
    validation_per_level=50,  # the learning-rate check's problems, disjoint from both
    settings=StudySettings(
        group_size=8,
        prompts_per_step=8,
        max_new_tokens=32,
        temperature=0.7,  # sampling and the training log-probs (logits / T): on-policy
        lr=1e-5,
        token_budget=64_000,  # 4x the CPU study's: ~40 GRPO steps at the start's ~25 tokens per completion
        acr={"tau_init": 0.5, "window": 5},  # the CPU study's gate
        eval_n=4,
        eval_temperature=0.7,
        mid_eval_tokens=8_000,  # the accuracy curve and tokens to target: the same milestones in every arm
        mid_eval_problems=200,  # 50 per level (the held-out set is interleaved by level)
        ckpt_every=10,
    ),
    arms={
        "GRPO": Arm("grpo"),
        "AVSPO": Arm("avspo", {"strategy": "stratified"}),
        "sign": Arm("sign"),
        "RL-ZVP": Arm("rl_zvp", {"std_convention": "population", "eps": 1e-6}),
        "DAPO-DS": Arm("grpo", dynamic=True),
        "AVSPO-opposite": Arm("avspo", {"strategy": "opposite"}),  # the authors' released code
        "NGRPO": Arm("ngrpo"),
        "GRESO": Arm("grpo", dynamic=True, greso={}),  # GRESO as published: skip before rollout, then DS
        # controls
        "random-sign": Arm(
            "grpo", control="random_sign"
        ),  # a fair coin's +-1 on collapsed groups: a push, no information
        "format-reward": Arm("grpo", reward="format"),  # 1 for any extractable answer: the gain without correctness
        "coin-reward": Arm("grpo", reward="random"),  # a fair coin per completion: the noise floor
    },
    primary=("GRPO", "AVSPO", "sign", "RL-ZVP", "DAPO-DS"),
    seeds={
        "GRPO": PRIMARY_SEEDS,
        "AVSPO": PRIMARY_SEEDS,
        "sign": PRIMARY_SEEDS,
        "RL-ZVP": PRIMARY_SEEDS,
        "DAPO-DS": PRIMARY_SEEDS,
        "random-sign": 8,
        "format-reward": 6,
        "coin-reward": 4,
        "AVSPO-opposite": 6,
        "NGRPO": 6,
        "GRESO": 6,
    },
    pilot={"GRPO": 6, "AVSPO": 6},
    lr_check={"arms": ("GRPO", "DAPO-DS"), "lrs": (5e-6, 1e-5, 2e-5), "seeds": 3},
    target=0.5,
)

if __name__ == "__main__":
    sys.exit(STUDY.main())
