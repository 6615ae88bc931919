"""The CPU backend's imports, begun in a thread while the driver checks the user's input.

``avspo-train --backend cpu`` parses its flags without importing OpenRLHF's trainers or Ray
(``cli/train.py: openrlhf_args``), so that preflight, then Ray's start, come seconds sooner. What the
backend imports (Ray, vLLM, OpenRLHF's trainers, DeepSpeed: 5-6 s on a 2-core Intel Xeon with native
bf16, fp32) loads in :func:`preload_backend`'s thread beside preflight, which spends about 2 s waiting
on its reward-file probe, a child process. Standard library only: importing this module imports
nothing else.
"""

from __future__ import annotations

import importlib
import threading

# what the CPU driver imports before the actors start: the vLLM engine's module (Ray, vLLM), the backend
# and OpenRLHF's trainers (and through them DeepSpeed)
BACKEND_MODULES = (
    "avspo_openrlhf.cpu.engine",  # first: Ray's starter thread launches the engines from it (cli/train.py)
    "avspo_openrlhf.cpu.backend",
    "openrlhf.trainer.ray.launcher",
    "avspo_openrlhf.cpu.strategy",
    "avspo_openrlhf.trainer.trainers",
)


def preload_backend() -> threading.Thread:
    """:data:`BACKEND_MODULES` imported in a daemon thread, started now. The driver imports them as
    before where it needs them: at once, or waiting for this thread's import of the same module
    (Python's per-module import lock). An import that fails here is left to fail there, with its
    traceback."""

    def load() -> None:
        for name in BACKEND_MODULES:
            try:
                importlib.import_module(name)
            except BaseException:
                return

    thread = threading.Thread(target=load, name="avspo-backend-imports", daemon=True)
    thread.start()
    return thread
