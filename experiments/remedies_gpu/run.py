"""Which remedy? The GPU study's configuration, fixed before its runs (README.md beside this file
says why each choice), run by ``avspo_openrlhf.study.remedies_gpu`` (``--help``).

    python experiments/remedies_gpu/run.py --pilot --k 12 --publish experiments/remedies_gpu/results   # the pilot
    python experiments/remedies_gpu/run.py --k 12 --publish experiments/remedies_gpu/results           # the waves
    python experiments/remedies_gpu/run.py --throughput 1,4,8,12,16 --publish experiments/remedies_gpu/results
    python experiments/remedies_gpu/run.py --report-only --publish experiments/remedies_gpu/results
"""

from __future__ import annotations

import sys

from avspo_openrlhf.study.loop import Arm, Settings
from avspo_openrlhf.study.remedies_gpu import GPURemediesStudy

# Every arm's mixed groups get GRPO's advantages with one convention (population std + 1e-6, the AVSPO
# paper's), so two arms differ only in what they do with collapsed groups (NGRPO, whose virtual
# maximum enters every group's statistics by design, excepted).
STUDY = GPURemediesStudy(
    levels=("add1", "mul1", "add2", "multi"),  # the CPU study's task: ~58 % of the start's groups collapse
    train_prompts=64,  # 16 per level: revisited every 8 steps, so GRESO has a history to use
    heldout=1200,  # the CPU study's 1,200 held-out problems (same seeded stream)
    settings=Settings(
        group_size=8,
        prompts_per_step=8,
        max_new_tokens=32,
        temperature=0.7,
        lr=1e-5,
        token_budget=64_000,  # 4x the CPU study's: ~40 GRPO steps at the start's ~25 tokens per completion
        acr={"tau_init": 0.5, "window": 5},  # the CPU study's gate
        eval_n=4,
        eval_temperature=0.7,
        mid_eval_every=5,  # tokens-to-target and the accuracy curve
        mid_eval_problems=200,
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
        "random-reward": Arm("grpo", reward="random"),  # a coin for a reward: the gain that needs no correctness
        "AVSPO-random": Arm("avspo", {"strategy": "random_uniform"}),  # a random-sign push on collapsed groups
    },
    primary=("GRPO", "AVSPO", "sign", "RL-ZVP", "DAPO-DS"),
    seeds={
        "GRPO": 16,
        "AVSPO": 16,
        "sign": 16,
        "RL-ZVP": 16,
        "DAPO-DS": 16,
        "AVSPO-opposite": 8,
        "NGRPO": 8,
        "GRESO": 8,
        "random-reward": 8,
        "AVSPO-random": 8,
    },  # fmt: skip
    pilot={"GRPO": 6, "AVSPO": 6},
    target=0.5,
)

if __name__ == "__main__":
    sys.exit(STUDY.main())
