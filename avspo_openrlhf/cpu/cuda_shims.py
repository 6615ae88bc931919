"""CPU stand-ins for the few CUDA-only calls OpenRLHF's DeepSpeed actor path makes.

OpenRLHF 0.11.2 assumes a GPU in four places on the training path: the device mesh
(``init_device_mesh("cuda", ...)`` in ``DeepspeedStrategy.setup_distributed``),
``torch.cuda.set_device``/``synchronize`` (barriers and ``fit``), ``torch.cuda.current_device()``
(moving experiences and all-reduce buffers) and ``NaiveReplayBuffer``'s ``cuda:N`` target device;
and ``convert_to_torch_dtype`` must accept ``fp32`` (``--cpu.dtype``: CPUs without native bf16).
:func:`cpu_replacements` lists exactly those (:func:`replacements_by_module`, by the module that holds
each); ``worker.py`` applies each set in a CPU Ray worker when that module is imported,
:func:`in_place` in the CPU driver while it runs OpenRLHF's trainer, ``avspo_openrlhf/install.py`` in
CPU tests. Nothing here runs on a GPU machine.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from types import ModuleType

from avspo_openrlhf.swap import Swap

# a replacement made only while a replaced function runs
NESTED_REPLACEMENTS = [
    ("torch.cuda.current_device", "-> 0 while NaiveReplayBuffer.__init__ (itself replaced) builds its device name"),
]


def replacements_by_module() -> dict[str, Callable[[ModuleType], list[tuple[object, str, object]]]]:
    """For each module that holds a CUDA-only call: ``module -> [(object, attribute, replacement)]``.
    Keyed by module so that a worker applies each set right after that module is first imported
    (``worker.py``): a process that never imports it (a queue or lock actor) never pays for it."""
    return {
        "torch": _torch_calls,
        "openrlhf.utils.utils": _torch_dtype,
        "openrlhf.utils.deepspeed.deepspeed": _device_mesh,
        "openrlhf.trainer.ppo_utils.replay_buffer": _replay_buffer_device,
    }


def cpu_replacements() -> list[tuple[object, str, object]]:
    """``(object, attribute, replacement)`` for each CUDA-only call (imports every module that holds one)."""
    return [r for name, build in replacements_by_module().items() for r in build(importlib.import_module(name))]


@contextmanager
def in_place() -> Iterator[None]:
    """Every replacement applied for a ``with`` block and restored after it: the CPU driver, which
    builds and runs OpenRLHF's trainer in its own process (``backend.py: train_cpu``)."""
    with ExitStack() as stack:
        for obj, name, value in cpu_replacements():
            stack.enter_context(Swap(obj, name, value))
        yield


def _torch_calls(torch) -> list[tuple[object, str, object]]:
    return [
        (torch.cuda, "set_device", lambda *a, **k: None),
        (torch.cuda, "synchronize", lambda *a, **k: None),
        (torch.cuda, "current_device", lambda: "cpu"),
    ]


def _torch_dtype(orl_utils) -> list[tuple[object, str, object]]:
    import torch

    to_dtype = orl_utils.convert_to_torch_dtype

    def convert_to_torch_dtype(param_dtype):  # OpenRLHF imports it at call time: the patch reaches every use
        return torch.float32 if param_dtype == "fp32" else to_dtype(param_dtype)

    return [(orl_utils, "convert_to_torch_dtype", convert_to_torch_dtype)]


def _device_mesh(ds_mod) -> list[tuple[object, str, object]]:
    mesh = ds_mod.init_device_mesh

    def init_device_mesh(device_type, *args, **kwargs):
        return mesh("cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    return [(ds_mod, "init_device_mesh", init_device_mesh)]


def _replay_buffer_device(replay_buffer) -> list[tuple[object, str, object]]:
    import torch

    buffer_init = replay_buffer.NaiveReplayBuffer.__init__

    def buffer_init_cpu(self, *args, **kwargs):
        # nested (NESTED_REPLACEMENTS): its "cuda:{current_device()}" must see an index while it runs
        with Swap(torch.cuda, "current_device", lambda: 0):
            buffer_init(self, *args, **kwargs)
        self.target_device = torch.device("cpu")

    return [(replay_buffer.NaiveReplayBuffer, "__init__", buffer_init_cpu)]
