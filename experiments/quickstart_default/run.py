"""The quickstart's default over several seeds: wall time and held-out gain with its 95 % bootstrap
interval per seed and level, run by ``avspo_openrlhf.study.quickstart_default`` (its docstring and
``--help`` say how), with this folder for its results (docs/quickstart.md and this folder's README.md
include its results.md).

    python experiments/quickstart_default/run.py --seeds 0 1 2 --out runs/quickstart_seeds
    python experiments/quickstart_default/run.py --report-only   # rebuild results.md from results.json here

Each seed is ``python -m avspo_openrlhf.cli.quickstart --seed S`` in its own folder (the seed also
draws the training and held-out problems); a finished seed is not rerun. Writes ``results.md``,
``results.json`` and ``heldout_accuracy_seed<S>.png`` next to this file.
"""

from __future__ import annotations

import sys
from pathlib import Path

from avspo_openrlhf.study import quickstart_default

if __name__ == "__main__":
    sys.exit(quickstart_default.main(Path(__file__).resolve().parent))
