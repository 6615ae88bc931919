"""The studies: experiments run through the quickstart's public train and evaluate functions, their
paired comparisons between methods and their tables. One module per study (``remedies``,
``collapse``, ``throughput``, ``quickstart_default``), each driven by its
``experiments/<study>/run.py``, which holds the study's configuration, and one per benchmark that
is a study (``vs_trl``, driven by ``benchmarks/bench_vs_trl.py``); ``cells`` runs one (method,
seed) cell, ``compare`` pairs methods over runs, ``tables`` formats with one ± convention, ``acr``
relates early collapse to final accuracy. The statistics themselves are ``avspo_openrlhf.stats``,
the same ones the quickstart reports with."""
