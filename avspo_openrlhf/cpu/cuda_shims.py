"""CPU stand-ins for the few CUDA-only calls OpenRLHF's DeepSpeed actor path makes.

OpenRLHF 0.11.2 assumes a GPU in four places on the training path: the device mesh
(``init_device_mesh("cuda", ...)`` in ``DeepspeedStrategy.setup_distributed``),
``torch.cuda.set_device``/``synchronize`` (barriers and ``fit``), ``torch.cuda.current_device()``
(moving experiences and all-reduce buffers) and ``NaiveReplayBuffer``'s ``cuda:N`` target device.
:func:`cpu_cuda_shims` patches exactly those for the duration of a ``with`` block (or for a CPU
worker process with :func:`install`), and lets ``convert_to_torch_dtype`` accept ``fp32``
(``--cpu.dtype``: CPUs without native bf16). Nothing here runs on a GPU machine.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from unittest import mock


def _patches():
    import torch
    from openrlhf.trainer.ppo_utils import replay_buffer
    from openrlhf.utils import utils as orl_utils
    from openrlhf.utils.deepspeed import deepspeed as ds_mod

    mesh = ds_mod.init_device_mesh
    to_dtype = orl_utils.convert_to_torch_dtype
    buffer_init = replay_buffer.NaiveReplayBuffer.__init__

    def init_device_mesh(device_type, *args, **kwargs):
        return mesh("cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    def buffer_init_cpu(self, *args, **kwargs):
        with mock.patch.object(torch.cuda, "current_device", lambda: 0):
            buffer_init(self, *args, **kwargs)
        self.target_device = torch.device("cpu")

    def convert_to_torch_dtype(param_dtype):  # OpenRLHF imports it at call time: the patch reaches every use
        return torch.float32 if param_dtype == "fp32" else to_dtype(param_dtype)

    return [
        mock.patch.object(orl_utils, "convert_to_torch_dtype", convert_to_torch_dtype),
        mock.patch.object(ds_mod, "init_device_mesh", init_device_mesh),
        mock.patch.object(torch.cuda, "set_device", lambda *a, **k: None),
        mock.patch.object(torch.cuda, "synchronize", lambda *a, **k: None),
        mock.patch.object(torch.cuda, "current_device", lambda: "cpu"),
        mock.patch.object(replay_buffer.NaiveReplayBuffer, "__init__", buffer_init_cpu),
    ]


@contextmanager
def cpu_cuda_shims():
    """Patch OpenRLHF's CUDA-only calls so its DeepSpeed actor path runs on CPU."""
    with ExitStack() as stack:
        for p in _patches():
            stack.enter_context(p)
        yield


def install() -> None:
    """Apply the patches for the rest of the process (CPU Ray workers)."""
    for p in _patches():
        p.start()


def setup_cpu_worker() -> None:
    """Ray ``worker_process_setup_hook`` of the CPU backend (this module imports nothing heavy at
    top, so the hook runs before OpenRLHF is imported): stand-ins for GPU-only modules, then the
    CUDA-call shims."""
    from avspo_openrlhf.cpu.compat import install_gpu_module_stubs

    install_gpu_module_stubs()
    install()
