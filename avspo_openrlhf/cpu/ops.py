"""DeepSpeed's C++ ops for the CPU backend, built once per environment and never unannounced.

A default CPU run loads no compiled op (cpu/strategy.py: torch's AdamW instead of DeepSpeed's
``fused_adam``, gloo alone instead of its ``deepspeed_shm_comm`` collectives). ``--ds.adam_offload``
runs load ``cpu_adam``, which DeepSpeed compiles with torch's ``cpp_extension`` the first time a
process loads it: about a minute on 2 cores, printing nothing, with a C++ compiler and ninja.
Torch keeps ops in ``~/.cache/torch_extensions/py311_cpu/<op>``, a folder named by the op while
its build command holds the installed DeepSpeed's path, so two environments (a second checkout, a
CI clone) rebuild each other's ops at every switch. Here the folder belongs to the environment:
``TORCH_EXTENSIONS_DIR`` defaults to ``<venv>/torch_extensions`` (``ray_start.CPU_ENV`` hands it to the
Ray workers); a run builds what it needs there before its actors start, and says so.

    python -m avspo_openrlhf.cpu.ops   # build cpu_adam now, for --ds.adam_offload runs
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

EXT_ENV = "TORCH_EXTENSIONS_DIR"
BUILDERS = {"deepspeed_shm_comm": "ShareMemCommBuilder", "fused_adam": "FusedAdamBuilder", "cpu_adam": "CPUAdamBuilder"}


def extensions_dir() -> str | None:
    """``TORCH_EXTENSIONS_DIR`` when set, else ``<environment>/torch_extensions`` for a virtualenv or
    conda environment this user can write; None: torch's default (``~/.cache/torch_extensions``)."""
    if os.environ.get(EXT_ENV):
        return os.environ[EXT_ENV]
    is_env = sys.prefix != sys.base_prefix or os.path.isdir(os.path.join(sys.prefix, "conda-meta"))
    return os.path.join(sys.prefix, "torch_extensions") if is_env and os.access(sys.prefix, os.W_OK) else None


def default_build_root() -> str:
    """Where torch builds without ``TORCH_EXTENSIONS_DIR`` (its folder per Python and CPU build)."""
    from torch.utils.cpp_extension import get_default_build_root

    return os.path.join(get_default_build_root(), f"py{sys.version_info.major}{sys.version_info.minor}_cpu")


def ops_for(adam_offload: bool) -> list[str]:
    """The ops a CPU-backend run loads (cpu/strategy.py: none without ``--ds.adam_offload``)."""
    return ["cpu_adam"] if adam_offload else []


def is_built(name: str) -> bool:
    root = extensions_dir() or default_build_root()
    return os.path.exists(os.path.join(root, name, f"{name}.so"))


def build(names: list[str], say=print) -> dict[str, float]:
    """Load each op in this process, compiling it first if needed (announced with ``say``, and
    timed); returns the seconds each took. Run it before the DeepSpeed actors start: they then load
    the built op at once."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    bindir = os.path.dirname(sys.executable)  # the environment's ninja, when this Python runs unactivated
    if not shutil.which("ninja") and os.path.exists(os.path.join(bindir, "ninja")):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    if extensions_dir():
        os.environ.setdefault(EXT_ENV, extensions_dir())
    from deepspeed.ops.op_builder import cpu as builders

    where = extensions_dir() or default_build_root()
    took = {}
    for name in names:
        fresh = not is_built(name)
        if fresh:
            say(
                f"[avspo] compiling DeepSpeed op {name} once for this environment into {where} (about a minute on "
                "2 cores; python -m avspo_openrlhf.cpu.ops builds it ahead) ..."
            )
        t = time.time()
        getattr(builders, BUILDERS[name])().load(verbose=False)
        took[name] = time.time() - t
        if fresh:
            say(f"[avspo] compiled {name} in {took[name]:.0f} s")
        elif took[name] > 10:  # ninja found the sources or the flags changed (a DeepSpeed upgrade)
            say(f"[avspo] DeepSpeed op {name} was rebuilt ({took[name]:.0f} s): its sources or flags changed")
    return took


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m avspo_openrlhf.cpu.ops",
        description=__doc__.split("\n\n")[0],
        epilog="Builds cpu_adam, the op --ds.adam_offload runs load; a default run loads none.",
    )
    p.parse_args(argv)
    names = ops_for(True)
    took = build(names, say=lambda msg: print(msg, flush=True))
    print(
        "  " + ", ".join(f"{n} {s:.0f} s" for n, s in took.items()) + f"  ({extensions_dir() or default_build_root()})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
