"""The studies, each driven by its ``experiments/<study>/run.py`` (which holds its configuration).

Two ways a run trains. The CPU studies (``remedies``, ``collapse``, ``throughput``,
and ``quickstart_default``; the benchmark against TRL, ``benchmarks/bench_vs_trl.py``, runs the same way)
run ``avspo-train --backend cpu`` through the quickstart's public train and evaluate functions:
``cells`` runs one (method, seed) cell, ``compare`` pairs methods over runs, ``tables`` formats with
one ± convention, ``acr`` relates early collapse to final accuracy. The GPU remedies study
(``remedies_gpu``) runs the study loop instead: ``loop`` is one (arm, seed) run in plain torch
(``controls``: its random-sign control, format reward and common random numbers), ``scheduler`` runs
K of them at once, as K processes or as stacked batches of K in one process (``engine`` over
``stacked``). The statistics themselves are ``avspo_openrlhf.stats``. docs/architecture.md draws how
they fit together."""
