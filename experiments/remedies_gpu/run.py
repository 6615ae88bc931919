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
from pathlib import Path

from avspo_openrlhf.study.remedies_gpu import GPURemediesStudy
from avspo_openrlhf.study.spec import Arm, StudySettings

# Every arm's mixed groups get GRPO's advantages with one convention (population std + 1e-6, the AVSPO
# paper's), so two arms differ only in what they do with collapsed groups (NGRPO, whose virtual
# maximum enters every group's statistics by design, excepted).
#
# The seeds (README.md, "How many seeds"): sized for a conservative sd of the per-seed paired difference,
# the larger of the pilot's 80 % upper confidence bound (5.9 points over 6 seeds x 1.46 = 8.6) and the CPU
# study's largest (9.0), so that the rule as coded (Holm over the 3 primary comparisons: one real effect is
# tested at 0.05 / 3) detects a true 5-point difference with 80 % power. tests/test_study_design.py checks
# PRIMARY_SEEDS = seeds_for_effect(PLANNING_SD, TARGET_EFFECT, family 3) (statsmodels is not imported here:
# a bare GPU machine runs this file without it).
PLANNING_SD = 0.09
TARGET_EFFECT = 0.05  # the smallest difference the verdict is powered for; also the "no difference" margin
PRIMARY_SEEDS = 37

STUDY = GPURemediesStudy(
    levels=("add1", "mul1", "add2", "multi"),  # the CPU study's task (README.md: the pilot's collapse at the start)
    train_prompts=64,  # 16 per level: revisited every 8 steps, so GRESO has a history to use
    heldout_per_level=300,  # distinct, none a training prompt: add1 and mul1 have fewer (all there are)
    validation_per_level=50,  # the learning-rate check's problems, disjoint from both
    settings=StudySettings(
        group_size=8,
        prompts_per_step=8,
        max_new_tokens=32,
        temperature=0.7,  # sampling and the training log-probs (logits / T): on-policy
        lr=1e-5,
        token_budget=64_000,  # 4x the CPU study's: 64-76 GRPO steps in the pilot (completions ~25 -> ~12 tokens)
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
        # exploratory, not primary: at equal tokens it takes ~3x fewer, larger steps than GRPO at GRPO's learning
        # rate, so its difference mixes the filtering with a learning-rate effect (the check below sizes it)
        "DAPO-DS": Arm("grpo", dynamic=True),
        "AVSPO-opposite": Arm(
            "avspo", {"strategy": "opposite"}
        ),  # AVSPO's `opposite` virtual values (docs/algorithm.md)
        "NGRPO": Arm("ngrpo"),
        # GRESO's pre-rollout skipping as this project implements it (algo.GRESOSelector, its defaults), then DS:
        # an adaptation at this scale, not the authors' verl recipe
        "GRESO": Arm("grpo", dynamic=True, greso={}),
        # controls
        "random-sign": Arm(
            "grpo", control="random_sign"
        ),  # a fair coin's +-1 on collapsed groups: a push, no information
        "format-reward": Arm("grpo", reward="format"),  # 1 for any extractable answer: the gain without correctness
        "coin-reward": Arm("grpo", reward="random"),  # a fair coin per completion: the noise floor
    },
    primary=("GRPO", "AVSPO", "sign", "RL-ZVP"),
    seeds={
        "GRPO": PRIMARY_SEEDS,
        "AVSPO": PRIMARY_SEEDS,
        "sign": PRIMARY_SEEDS,
        "RL-ZVP": PRIMARY_SEEDS,
        "DAPO-DS": 12,
        "random-sign": 8,
        "format-reward": 6,
        "coin-reward": 4,
        "AVSPO-opposite": 6,
        "NGRPO": 6,
        "GRESO": 6,
    },
    pilot={"GRPO": 6, "AVSPO": 6},
    # exploratory: GRPO and DAPO-DS at three learning rates on the validation problems, the same seeds at each
    # (paired); it changes no arm's rate and no verdict, it says whether DAPO-DS's difference is one of rate
    lr_check={"arms": ("GRPO", "DAPO-DS"), "lrs": (5e-6, 1e-5, 2e-5), "seeds": 4},
    # the clean contrast of the random-sign control: both push every collapsed group by +-1, sign by the rewards,
    # random-sign by a coin (AVSPO differs from random-sign in its gate too)
    contrasts=(("sign", "random-sign", "what the sign's information adds"),),
    margin=TARGET_EFFECT,
    frozen_file=str(Path(__file__).with_name("FROZEN")),  # the commit every run comes from (README.md)
    runs_per_slot=24,  # one stacked batch of 24 in a slot's 9-minute call (README.md: 24 to 48 a slot)
    planning_sd=PLANNING_SD,
    target=0.5,
)

if __name__ == "__main__":
    sys.exit(STUDY.main())
