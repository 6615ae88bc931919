"""Async throughput: what asynchronous rollout buys on this machine, what staleness costs, and how
well the pipeline simulator predicts it; run by ``avspo_openrlhf.study.throughput`` (its docstring
and ``--help`` say how), with this folder for its results.

    python experiments/async_throughput/run.py --workload documented --dtype bf16   # CPU, ~17 min on 2 cores
    python experiments/async_throughput/run.py --summary-only   # rebuild results.md from the folders here
"""

from __future__ import annotations

import sys
from pathlib import Path

from avspo_openrlhf.study import throughput

if __name__ == "__main__":
    sys.exit(throughput.main(Path(__file__).resolve().parent))
