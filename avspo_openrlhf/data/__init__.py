"""Datasets: sources, loading with row-level errors, templates, synthetic arithmetic, Level3-500."""
