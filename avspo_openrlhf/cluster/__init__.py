"""Helpers for the cluster launch scripts in ``launch_scripts/`` (no OpenRLHF import)."""
