"""Collapse study: GRPO vs AVSPO vs DAPO dynamic sampling on SmolLM2-135M arithmetic (CPU), at
equal steps: this study's configuration, run by ``avspo_openrlhf.study.collapse`` (``--help``).

    python experiments/collapse_study/run.py --seeds 0 1 2 --steps 10 --out runs/collapse_study \
        --publish experiments/collapse_study/results
    python experiments/collapse_study/run.py --out runs/collapse_study --report-only --publish experiments/collapse_study/results
"""

from __future__ import annotations

import sys

from avspo_openrlhf.study.collapse import CollapseStudy

STUDY = CollapseStudy(
    # the settings the study was measured with (the quickstart's defaults when it ran; pinned here so a
    # retuned quickstart does not silently change the study)
    settings=["--prompts-per-step", "4", "--lr", "3e-6", "--eval-n", "4"],
    methods={
        "GRPO": ["--grpo"],
        "AVSPO": [],
        "DAPO-DS": ["--grpo", "--", "--dynamic.std_filter"],  # dynamic sampling on the correctness std
    },
    heldout=60,
    pool_factor=3,  # a 3x pool so dynamic sampling can refill dropped groups
)

if __name__ == "__main__":
    sys.exit(STUDY.main())
