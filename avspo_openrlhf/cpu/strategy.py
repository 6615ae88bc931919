"""The CPU backend's DeepSpeed strategy: the crash-safe one, loading no compiled op.

DeepSpeed's CPU accelerator JIT-compiles two C++ ops for an ordinary run: ``fused_adam`` (the
optimizer OpenRLHF's ``"type": "AdamW"`` config selects) and ``deepspeed_shm_comm`` (shared-memory
collectives), 78 s and 49 s on the 2-core AMD EPYC, with a C++ compiler and ninja the machine must
have. The CPU backend needs neither: torch's fused ``AdamW`` computes the same update (DeepSpeed's
documented ``torch_adam`` optimizer parameter), and a world of one process has no collective to
share memory for (gloo does the rest). ``--ds.adam_offload`` keeps DeepSpeed's ``cpu_adam``
(cpu/ops.py builds it).
"""

from __future__ import annotations

import os

from avspo_openrlhf.trainer.checkpoint import CrashSafeStrategy, crash_safe_strategy

SHM_OP = "deepspeed_shm_comm"


class CPUStrategy(CrashSafeStrategy):
    def get_ds_train_config(self, optim_dict=None, *, max_norm=None):
        config = super().get_ds_train_config(optim_dict, max_norm=max_norm)
        optimizer = config.get("optimizer")
        if optimizer and optimizer.get("type") in ("Adam", "AdamW") and not self.adam_offload:
            # fused: torch's one-kernel CPU AdamW (0.07 s a step on 135M parameters, 2 cores, against
            # 0.45 s for its per-tensor loop); DeepSpeed hands the remaining params to the constructor
            params = {**optimizer["params"], "torch_adam": True, "fused": True}
            config["optimizer"] = {**optimizer, "params": params}
        return config

    def prepare(self, *args):
        """OpenRLHF's ``prepare``; then a training engine that is the whole data-parallel world at
        ZeRO-0 skips its gradient all-reduce. DeepSpeed still ran it there: every gradient flattened
        into buckets, all-reduced over gloo with itself and copied back, 0.23 s of a 6.6 s step of
        SmolLM2's 16 responses (fp32, 2-core Intel Xeon, AVX-512, native bf16). The engine skips it when
        ``enable_backward_allreduce`` is off, as it does without a data-parallel backend; the summed
        gradient of one process is the gradient, so the update is bit for bit the same
        (``tests/test_deepspeed_ppo.py`` guards both)."""
        from deepspeed import DeepSpeedEngine

        out = super().prepare(*args)
        for item in out if len(args) > 1 else [out]:  # one arg: its result alone
            model = item[0] if isinstance(item, tuple) else item  # (model, optimizer, scheduler) when trained
            engine = getattr(model, "model", model)  # an Actor holds its engine
            if (
                isinstance(engine, DeepSpeedEngine)
                and engine.zero_optimization_stage() == 0
                and engine.dp_world_size == 1
            ):
                engine.enable_backward_allreduce = False
        return out

    def setup_distributed(self, *args, **kwargs) -> None:
        if int(os.environ.get("WORLD_SIZE", "1")) == 1:
            # DeepSpeed's TorchBackend builds the shm op when it is marked compatible (comm/torch.py:
            # build_shm_op); the mark is read at that moment, in this process only
            from deepspeed.git_version_info import compatible_ops

            compatible_ops[SHM_OP] = False
        super().setup_distributed(*args, **kwargs)


def cpu_strategy(args) -> CPUStrategy:
    """``openrlhf.utils.get_strategy(args)`` as the CPU backend runs it (see the module's docstring)."""
    strategy = crash_safe_strategy(args)
    strategy.__class__ = CPUStrategy
    return strategy
