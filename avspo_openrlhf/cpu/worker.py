"""The Ray ``worker_process_setup_hook`` of the CPU backend (named by ``backend.py`` as a string,
which Ray imports in each worker: it lives in this layer so that string points down, never up)."""

from __future__ import annotations


def install_cpu_worker() -> None:
    """Stand-ins for the GPU-only modules (``compat.py``), then the CUDA-call replacements of
    ``cuda_shims.py`` for the rest of this worker process (a worker lives for one run: never
    restored). Imports nothing heavy at top, so the hook runs before OpenRLHF is imported."""
    from avspo_openrlhf.cpu.compat import install_gpu_module_stubs
    from avspo_openrlhf.cpu.cuda_shims import cpu_replacements
    from avspo_openrlhf.swap import Swap

    install_gpu_module_stubs()
    for obj, name, value in cpu_replacements():
        Swap(obj, name, value).start()
