"""CPU stand-ins for the few CUDA-only calls OpenRLHF's DeepSpeed actor path makes.

OpenRLHF 0.11.2 assumes a GPU in four places on the training path: the device mesh
(``init_device_mesh("cuda", ...)`` in ``DeepspeedStrategy.setup_distributed``),
``torch.cuda.set_device``/``synchronize`` (barriers and ``fit``), ``torch.cuda.current_device()``
(moving experiences and all-reduce buffers) and ``NaiveReplayBuffer``'s ``cuda:N`` target device;
and ``convert_to_torch_dtype`` must accept ``fp32`` (``--cpu.dtype``: CPUs without native bf16).
:func:`cpu_replacements` lists exactly those; ``worker.py`` applies them in every CPU Ray worker,
``avspo_openrlhf/install.py`` in CPU tests. Nothing here runs on a GPU machine.
"""

from __future__ import annotations

from avspo_openrlhf.swap import Swap

# a replacement made only while a replaced function runs
NESTED_REPLACEMENTS = [
    ("torch.cuda.current_device", "-> 0 while NaiveReplayBuffer.__init__ (itself replaced) builds its device name"),
]


def cpu_replacements() -> list[tuple[object, str, object]]:
    """``(object, attribute, replacement)`` for each CUDA-only call."""
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
        # nested (NESTED_REPLACEMENTS): its "cuda:{current_device()}" must see an index while it runs
        with Swap(torch.cuda, "current_device", lambda: 0):
            buffer_init(self, *args, **kwargs)
        self.target_device = torch.device("cpu")

    def convert_to_torch_dtype(param_dtype):  # OpenRLHF imports it at call time: the patch reaches every use
        return torch.float32 if param_dtype == "fp32" else to_dtype(param_dtype)

    return [
        (orl_utils, "convert_to_torch_dtype", convert_to_torch_dtype),
        (ds_mod, "init_device_mesh", init_device_mesh),
        (torch.cuda, "set_device", lambda *a, **k: None),
        (torch.cuda, "synchronize", lambda *a, **k: None),
        (torch.cuda, "current_device", lambda: "cpu"),
        (replay_buffer.NaiveReplayBuffer, "__init__", buffer_init_cpu),
    ]
