"""The GPU suite (docs/gpu.md): every test here carries the ``gpu`` marker and skips, with its
reason, where CUDA (or a package a test needs) is missing, so ``pytest -m gpu -rs`` says what did
not run and why.

On a machine without Ray (a bare GPU machine that took only small wheels) an in-process ``ray``
stand-in (``ray_stand_in.py``) lets OpenRLHF import; actors are then built in this process, as
``tests/test_gpu_path.py`` does on CPU. DeepSpeed must use CUDA here: the CPU suite's conftest
defaults ``DS_ACCELERATOR`` to ``cpu``, so a GPU-only run switches it before DeepSpeed is imported."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import ray_stand_in
import torch

HERE = Path(__file__).resolve().parent
CUDA = torch.cuda.is_available()
RAY_STAND_IN = ray_stand_in.install()


def _gpu_only_run(config) -> bool:
    """This run selects the GPU tests alone (``-m gpu`` or paths under tests/gpu)."""
    if (config.option.markexpr or "").strip() == "gpu":
        return True
    args = [Path(a.split("::")[0]).resolve() for a in config.args]
    return bool(args) and all(a == HERE or HERE in a.parents for a in args)


def pytest_configure(config):
    if CUDA and "deepspeed" not in sys.modules and _gpu_only_run(config):
        os.environ["DS_ACCELERATOR"] = "cuda"
    # DeepSpeed's JIT build (FusedAdam) reads TORCH_CUDA_ARCH_LIST as numbers: Hopper images that set
    # '9.0a' make it fail with "invalid literal for int()"; the plain arch builds the same kernels here
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if CUDA and arch:
        os.environ["TORCH_CUDA_ARCH_LIST"] = re.sub(r"(\d)[af]\b", r"\1", arch)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE not in Path(str(item.path)).parents:
            continue
        item.add_marker(pytest.mark.gpu)
        if not CUDA:
            item.add_marker(pytest.mark.skip(reason="needs CUDA: torch.cuda.is_available() is False"))
