"""Our CPU pipeline against TRL's ``GRPOTrainer`` on the quickstart's work, side by side in one run:
start-up, first step, steady step and training stage of each, and the held-out gain of each with
the paired difference of the two trained models. Run by ``avspo_openrlhf.study.vs_trl`` (its
docstring and ``--help`` say what each side runs and how it is timed); ``bench_vs_trl.md`` /
``.json`` go to ``results/`` here (docs/cpu.md includes the markdown), the logs and models under
``--out``.

    python benchmarks/bench_vs_trl.py [--modes sync,async] [--seed 0] [--skip-eval] [--only ours|trl] [-- flags]
"""

from __future__ import annotations

import sys
from pathlib import Path

from avspo_openrlhf.study import vs_trl

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    sys.exit(vs_trl.main(results=HERE / "results", repo=HERE.parent))
