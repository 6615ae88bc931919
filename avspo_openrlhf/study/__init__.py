"""The studies: experiments run through the quickstart's public train and evaluate functions, their
paired comparisons between methods and their tables. One module per study (``remedies``,
``collapse``, ``throughput``), each driven by its ``experiments/<study>/run.py``, which holds the
study's configuration; ``cells`` runs one (method, seed) cell, ``compare`` pairs methods over runs,
``tables`` formats with one ± convention, ``acr`` relates early collapse to final accuracy. The
statistics themselves are ``avspo_openrlhf.stats``, the same ones the quickstart reports with."""
