"""The attributes of OpenRLHF and torch that avspo-train replaces around OpenRLHF's ``train(args)``
(and the CPU workers' CUDA calls), in one list. The other run-time replacements of the package (a
DeepSpeed op flag, Ray's cluster switch around ``ray.init``, the class of objects OpenRLHF built,
verl's estimator registry, ...) are each made where they act; docs/architecture.md lists them all.

Everything else extends OpenRLHF by subclassing and by passing our objects to its constructors;
parsing patches nothing (``cli/train.py: openrlhf_args``). Two kinds of replacement remain, both
listed in :func:`_replacements` and applied only by :func:`installed`:

- ``trainers``: OpenRLHF's ``train(args)`` imports its trainer class at call time
  (``openrlhf.trainer.ppo_trainer.PPOTrainer`` or ``ppo_trainer_async.PPOTrainerAsync``), builds
  its DeepSpeed strategy with ``train_ppo_ray.get_strategy`` and its policy actors from
  ``train_ppo_ray.PolicyModelActor``, so ``avspo-train --backend gpu`` puts ours there (the
  crash-safe checkpoints of ``trainer/checkpoint.py``, the policy actor's entropy-returning
  ``forward`` of ``trainer/actors.py``) for the duration of that call.
- ``cpu``: the CUDA-only calls on OpenRLHF's DeepSpeed actor path (the device mesh,
  ``torch.cuda.set_device``/``synchronize``/``current_device``, the replay buffer's ``cuda:N``
  device, the ``fp32`` dtype name); the replacements are in ``cpu/cuda_shims.py``. Applied in
  every Ray worker of ``--backend cpu`` for that process's life (``cpu/worker.py``) and
  by CPU tests in a ``with`` block. Never on a GPU machine.

Besides the list: one nested replacement (``cuda_shims.NESTED_REPLACEMENTS``: ``torch.cuda.current_device``
returns 0 while OpenRLHF's replay buffer builds its device name) and, on a machine without
``flash_attn``/``vllm``, the stand-in modules ``cpu/compat.py`` adds to ``sys.modules``
(:data:`STAND_IN_MODULES`; modules that do not exist, nothing replaced). Every replacement is a
:class:`~avspo_openrlhf.swap.Swap`.
``tests/test_openrlhf_surface.py`` checks that every replaced attribute still exists in OpenRLHF,
that leaving :func:`installed` restores it, and that no other module patches OpenRLHF's, Ray's,
argparse's or torch's module attributes.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager

from avspo_openrlhf.swap import Swap

STAND_IN_MODULES = (
    "flash_attn",
    "flash_attn.bert_padding",
    "flash_attn.utils",
    "flash_attn.utils.distributed",
    "vllm",
    "vllm.inputs",
    "vllm.utils",
)


def _strategy_factory(on_ray_started=None):
    """``train_ppo_ray.get_strategy`` for the duration of ``train(args)``: crash-safe checkpoints;
    ``train`` calls it right after its ``ray.init``, the moment to run ``on_ray_started`` (the
    driver takes its SIGTERM handler back from Ray there)."""
    from avspo_openrlhf.trainer.checkpoint import crash_safe_strategy

    def get_strategy(args):
        if on_ray_started is not None:
            on_ray_started()
        return crash_safe_strategy(args)

    return get_strategy


def _replacements(*, trainers: bool, cpu: bool, on_ray_started=None) -> list:
    out = []
    if trainers:
        from openrlhf.cli import train_ppo_ray
        from openrlhf.trainer import ppo_trainer, ppo_trainer_async

        from avspo_openrlhf.trainer.actors import RemedyPolicyModelActor
        from avspo_openrlhf.trainer.trainers import RemedyPPOTrainer, RemedyPPOTrainerAsync

        out += [
            # imported at the module's top, used in train(args): a policy actor whose log-prob
            # forward also returns RL-ZVP's token entropies
            Swap(train_ppo_ray, "PolicyModelActor", RemedyPolicyModelActor),
            Swap(ppo_trainer, "PPOTrainer", RemedyPPOTrainer),
            Swap(ppo_trainer_async, "PPOTrainerAsync", RemedyPPOTrainerAsync),
            # imported at the module's top, called in train(args): checkpoints that survive a kill
            Swap(train_ppo_ray, "get_strategy", _strategy_factory(on_ray_started)),
        ]
    if cpu:
        from avspo_openrlhf.cpu.cuda_shims import cpu_replacements

        out += [Swap(obj, name, value) for obj, name, value in cpu_replacements()]
    return out


@contextmanager
def installed(*, trainers: bool = False, cpu: bool = False, on_ray_started=None):
    """Our replacements in place inside the ``with`` block, OpenRLHF's own restored on exit."""
    with ExitStack() as stack:
        for p in _replacements(trainers=trainers, cpu=cpu, on_ray_started=on_ray_started):
            stack.enter_context(p)
        yield
