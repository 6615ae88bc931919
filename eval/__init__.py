"""``python -m eval ...`` from the repository root runs ``avspo-eval`` (avspo_openrlhf.math_eval)."""
