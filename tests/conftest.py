"""Test-wide setup: OpenRLHF imports flash_attn/vllm at module top; on CPU the missing ones are
replaced by stand-ins (the single place this happens for tests)."""

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("WANDB_MODE", "offline")

from avspo_openrlhf.cpu.compat import install_gpu_module_stubs  # noqa: E402

install_gpu_module_stubs()
