"""The async trainer's two small actors, in a module that imports nothing of the training stack: a Ray
actor's process imports the module that defines its class, and for these that was the whole stack
(torch, transformers, vLLM, DeepSpeed, OpenRLHF: ~14 s of CPU each, beside the actors that need it,
on a 2-core AMD EPYC without native bf16). Here each process imports asyncio and Ray.

- :class:`VLLMLock`: OpenRLHF 0.11's ``ppo_trainer_async.VLLMLock`` (its two methods, the same
  semantics; ``tests/test_openrlhf_surface.py`` fails when OpenRLHF's methods change);
- :class:`AsyncCoordinator`: what our generator and training actors share besides OpenRLHF's queue
  and lock."""

from __future__ import annotations

import asyncio


class VLLMLock:
    """Cross-actor mutex around the engines: generation and the weight broadcast never overlap, so every
    sample of a batch is generated with one policy's weights (OpenRLHF's ``VLLMLock``)."""

    def __init__(self):
        self.mutex = asyncio.Lock()

    async def acquire(self) -> None:
        await self.mutex.acquire()

    async def release(self) -> None:
        self.mutex.release()


class AsyncCoordinator:
    """What the async generator and trainer share besides OpenRLHF's queue and lock: the policy
    version the engines hold (published by the trainer while it holds the vLLM lock, read by the
    generator while it holds it), prompts sent back for re-generation (staleness bound), and the
    stop flag (alarms, ``--run.max_steps``, Ctrl-C). A Ray actor of its own, named
    ``avspo-coordinator-<id>``."""

    def __init__(self):
        self.version = 0
        self.requeued: list = []
        self.stop = False

    async def set_version(self, version: int) -> None:
        self.version = int(version)

    async def get_version(self) -> int:
        return self.version

    async def requeue(self, batches: list) -> None:
        self.requeued.extend(batches)

    async def take_requeued(self) -> list:
        out, self.requeued = self.requeued, []
        return out

    async def request_stop(self) -> None:
        self.stop = True

    async def should_stop(self) -> bool:
        return self.stop
