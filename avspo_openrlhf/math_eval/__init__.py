"""Math benchmark evaluation (``avspo-eval``): generators, metrics, the resumable runner."""
