"""Make OpenRLHF importable on a machine without GPU-only packages.

OpenRLHF 0.11.2 imports ``flash_attn`` (``openrlhf.models.ring_attn_utils``) and ``vllm``
(``openrlhf.trainer.ray.vllm_engine``, ``samples_generator``) at module top. On CPU we register
small stand-in modules for whichever of them is missing, the way OpenRLHF's own CPU tests do.
The padding helpers get pure-torch equivalents (they are used for packed samples); anything
GPU-only raises when called. Only the CPU backend and the tests call this; on a GPU machine the
real packages are importable and nothing is replaced.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch only when a stand-in is called: a Ray worker's setup hook installs these
    import torch


def _index_first_axis(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    return x[indices]


def _unpad_input(hidden_states: torch.Tensor, attention_mask: torch.Tensor, unused_mask=None):
    # Same contract as flash_attn.bert_padding.unpad_input (>= 2.7): (unpadded, indices, cu_seqlens,
    # max_seqlen, seqused)
    import torch

    seqlens = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(attention_mask.flatten(), as_tuple=False).flatten()
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return flat[indices], indices, cu_seqlens, int(seqlens.max()) if seqlens.numel() else 0, seqlens


def _pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    out = hidden_states.new_zeros(batch * seqlen, *hidden_states.shape[1:])
    out[indices] = hidden_states
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])


def _gpu_only(name: str):
    def fn(*args, **kwargs):
        raise RuntimeError(f"{name} needs the GPU build of its package; it is a CPU stand-in here")

    return fn


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)  # transformers calls find_spec on it
    mod.__dict__.update(attrs)
    mod.__avspo_cpu_stub__ = True
    return mod


def _flash_attn_modules() -> dict[str, types.ModuleType]:
    from einops import rearrange

    return {
        "flash_attn": _module("flash_attn", __version__="0.0.0", flash_attn_func=_gpu_only("flash_attn_func")),
        "flash_attn.bert_padding": _module(
            "flash_attn.bert_padding",
            index_first_axis=_index_first_axis,
            pad_input=_pad_input,
            unpad_input=_unpad_input,
            rearrange=rearrange,
        ),
        "flash_attn.utils": _module("flash_attn.utils"),
        "flash_attn.utils.distributed": _module("flash_attn.utils.distributed", all_gather=_gpu_only("all_gather")),
    }


def _vllm_modules() -> dict[str, types.ModuleType]:
    class SamplingParams:  # keeps attributes, like vllm's
        def __init__(self, **kwargs):
            self.__dict__.update(kwargs)

    return {
        "vllm": _module("vllm", SamplingParams=SamplingParams, LLM=_gpu_only("vllm.LLM"), __version__="0.0.0"),
        "vllm.inputs": _module("vllm.inputs", TokensPrompt=dict),
        "vllm.utils": _module("vllm.utils", random_uuid=lambda: __import__("uuid").uuid4().hex),
    }


def install_gpu_module_stubs() -> list[str]:
    """Register stand-ins for ``flash_attn`` / ``vllm`` when they are not installed.

    Returns the names of the stubbed top-level packages (empty on a GPU machine).
    """
    stubbed = []
    for top, build in (("flash_attn", _flash_attn_modules), ("vllm", _vllm_modules)):
        if top in sys.modules or importlib.util.find_spec(top) is not None:
            continue
        sys.modules.update(build())
        stubbed.append(top)
    return stubbed
